"""Warp shuffles (``ir.Shuffle``) for backends whose threads do not run in lockstep.

A thread region is a ``Parallel`` over the block's threads (``kernforge.dsl.compat``).  A
shuffle reads a value *another* iteration of that map produced, so a backend that runs the
map as a loop (the CPU) cannot evaluate it in place: when thread 0 runs, thread 1 has not
computed its value yet.  :func:`split_shuffles` therefore treats a shuffle like a barrier.
It splits the map there, every thread stages its value in a buffer with one slot per
thread, and the next map reads the source thread's slot.  CUDA keeps the shuffle
(``__shfl_*_sync``); the interpreter evaluates it directly, because it runs a map one
statement at a time over all iterations.

:func:`shuffle_source` is the source thread of a shuffle as an IR expression: PTX
``shfl.sync``'s lane rule with the segment mask CUDA derives from ``width``.
"""
from __future__ import annotations

from kernforge.codegen import ir

WARP = 32


def shuffle_source(sh: ir.Shuffle) -> ir.Expr:
    """The thread whose value ``sh`` reads: lane ``j`` of the caller's warp when PTX's rule
    accepts ``j``, else the caller itself.  With ``lane = thread % 32``, ``b = arg & 31`` and
    ``base`` the first lane of the caller's ``width``-lane segment: ``xor`` reads ``lane ^ b``,
    ``down`` ``lane + b`` and ``up`` ``lane - b``, each only within ``base .. base + width - 1``
    (``xor`` may also reach an earlier segment, as in PTX).  ``idx`` reads lane
    ``base + b % width``."""
    t = sh.thread
    lane = ir.binary(ir.Op.AND, t, WARP - 1)
    b = ir.binary(ir.Op.AND, ir.cast(sh.arg, t.dtype), WARP - 1)
    base = ir.binary(ir.Op.AND, lane, (WARP - sh.width) & (WARP - 1))
    end = ir.binary(ir.Op.ADD, base, sh.width)
    if sh.kind == "idx":
        j, ok = ir.binary(ir.Op.OR, base, ir.binary(ir.Op.AND, b, sh.width - 1)), None
    elif sh.kind == "xor":
        j = ir.binary(ir.Op.XOR, lane, b)
        ok = ir.binary(ir.Op.LT, j, end)
    elif sh.kind == "down":
        j = ir.binary(ir.Op.ADD, lane, b)
        ok = ir.binary(ir.Op.LT, j, end)
    else:
        j = ir.binary(ir.Op.SUB, lane, b)
        ok = ir.binary(ir.Op.GE, j, base)
    src = j if ok is None else ir.select(ok, j, lane)
    return ir.binary(ir.Op.ADD, ir.binary(ir.Op.SUB, t, lane), src)


def has_shuffle(node) -> bool:
    return any(isinstance(n, ir.Shuffle) for n in ir.nodes(node))


class _Split(ir.Mutator):
    def visit_Parallel(self, p: ir.Parallel):
        if not has_shuffle(p.body):
            return p
        stmts = list(p.body.body) if isinstance(p.body, ir.Seq) else [p.body]
        allocs, maps, cur = [], [], []
        for s in stmts:
            sh = s.value if isinstance(s, ir.Store) and isinstance(s.value, ir.Shuffle) else None
            if sh is None or sh.thread not in p.vars or has_shuffle(sh.value) or has_shuffle(sh.arg):
                if has_shuffle(s):
                    raise ir.KernelError("a warp shuffle must be the value of a store at the top level of "
                                         "its thread region (every thread reaches it)", s.loc)
                cur.append(s)
                continue
            # the stage buffer spans the map's whole iteration space, indexed like the map
            stage = ir.Buffer("shfl_stage", tuple(ir.const(e) for e in p.extents), sh.dtype, ir.Scope.FRAGMENT)
            allocs.append(ir.Allocate(stage, s.loc))
            cur.append(ir.Store(stage, p.vars, sh.value, s.loc))
            maps.append(cur)
            src = tuple(shuffle_source(sh) if v is sh.thread else v for v in p.vars)
            cur = [ir.Store(s.buffer, s.indices, ir.Load(stage, src), s.loc)]
        maps.append(cur)
        return ir.Seq(tuple(allocs) + tuple(ir.Parallel(p.vars, p.extents, ir.seq(m, p.loc), p.loc) for m in maps),
                      p.loc)


def split_shuffles(kernel: ir.Kernel) -> ir.Kernel:
    """``kernel`` with every thread map that holds shuffles split at them (see the module
    docstring); a kernel without shuffles is returned as is."""
    if not has_shuffle(kernel.body):
        return kernel
    return kernel.with_body(_Split().visit(kernel.body))
