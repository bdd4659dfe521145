"""Loops of thread-level code whose threads may stop early, as DeepSeek V3.2's top-k selector
writes them: a runtime ``break`` (``for round in T.serial(4): if l_new_topk <= 0: break; ...``)
and a barrier in a loop whose trip count each thread reads from memory
(``for s in T.serial(T.ceildiv(l_num_input, BLOCK_SIZE)): T.sync_threads(); ...``,
:func:`lift_bounds`).  Both become guards on the loop body's statements.

A traced loop cannot end early, so the break becomes a flag of each thread's own ("broke"),
cleared before the loop and set where the ``break`` stands; every statement of the loop body
runs only while the thread's flag is clear.  Each statement is guarded on its own, which is
what the flag means: it changes only at a break, so a statement after the break in the same
iteration, and every statement of later iterations, is skipped by a thread that broke.
Guarding statement by statement also keeps the body splittable at barriers
(:mod:`kernforge.dsl.thread_sync`, :mod:`kernforge.dsl.compat`): when the loop holds barriers it
is lifted out of the thread region, runs all its iterations for every thread (so every
thread reaches every barrier), and each thread map in it is guarded.

On a GPU a thread that breaks leaves the loop, and the barriers in it then wait for threads
that never come: such a loop is only correct there when every thread of the block breaks in
the same iteration (the selector's condition reads shared values every thread sees alike).
That is also when kernforge's lowering and the GPU agree.  Block-level tile operations in the
guarded body (``T.fill`` of a shared tile in a thread map) run while any thread (interp) or
each thread (cpu) has not broken: the same result when the threads break together.
"""
from __future__ import annotations

from dataclasses import replace

from kernforge import dtypes
from kernforge.codegen import ir


def lower_break(b, loop_key, loc) -> bool:
    """Lower ``break`` of the author's loop ``loop_key`` where it stands (under a runtime
    ``if`` of thread-level code); ``False`` when this is not such a break (the caller raises)."""
    region = b.thread_region
    if region is None or b.subset is not None:
        return False
    at = len(b.frames) - 1
    while at >= 0:
        f = b.frames[at]
        if f is region["frame"] or (f.kind == "branch" and not f.hoisted):
            at -= 1
            continue
        break
    loop = b.frames[at] if at >= 0 else None
    if loop is None or loop.kind != "loop" or loop.loop_id != loop_key:
        return False
    tvar = region["var"]
    if loop.breaks is None:
        loop.breaks = {"flag": _flag(b, at, region, loc), "sites": set(), "tvar": tvar}
    site = ir.Store(loop.breaks["flag"], (tvar, ir.const(0)), ir.const(1, dtypes.int32), loc)
    loop.breaks["sites"].add(id(site))
    b.emit(site)
    return True


def _flag(b, at: int, region, loc) -> ir.Buffer:
    """The loop's per-thread flag, allocated and cleared just before the loop: in thread-level
    code when the loop stands in the thread region, else (a loop already lifted out of it) in
    a thread map of its own."""
    tvar, extent = region["var"], region["extent"]
    buf = ir.Buffer(b.unique("broke"), (ir.const(extent), ir.const(1)), dtypes.int32, ir.Scope.FRAGMENT)
    inside = b.frames.index(region["frame"]) < at
    host = b.frames[b.frames.index(region["frame"]) - 1] if inside else b.frames[at - 1]
    host.buffers.add(buf)
    host.stmts.append(ir.Allocate(buf, loc))
    clear = ir.Store(buf, (tvar, ir.const(0)), ir.const(0, dtypes.int32), loc)
    b.frames[at - 1].stmts.append(clear if inside else ir.Parallel((tvar,), (extent,), clear, loc))
    return buf


def liftable(frame, tvar) -> bool:
    """A ``T.serial`` loop whose end reads memory (a ``T.alloc_var``, a load: values that are
    often the same in every thread, as the selector's counts are) and whose start does not:
    :func:`lift_bounds` can run it over the block's largest trip count.  An end that names the
    thread index differs between threads for certain (a GPU would hang at the barrier), so it
    stays a :class:`kernforge.dsl.compat.DivergentBarrierError`."""
    if frame.kind != "loop" or not frame.loop or frame.var is None:
        return False
    start, stop = frame.loop
    if any(n is tvar or isinstance(n, ir.Load) for n in ir.nodes(start)) or _names(stop, tvar):
        return False
    return stop.dtype in (dtypes.int32, dtypes.int64)


def _names(e, tvar) -> bool:
    """``e`` uses the thread index other than to pick a thread's own element of memory."""
    if e is tvar:
        return True
    if isinstance(e, ir.Load):
        return False
    return any(_names(c, tvar) for c in ir.children(e) if isinstance(c, ir.Expr))


def lift_bounds(b, frame, region, loc) -> None:
    """A barrier inside a loop whose trip count is each thread's own (the selector's
    ``for s in T.serial(T.ceildiv(l_num_input, BLOCK_SIZE))``): every thread must reach the
    barrier, so the lifted loop runs to the block's largest end, and each thread's statements
    run only in its own iterations.  Each thread's end is evaluated where the loop starts (into
    a per-thread variable), their maximum gathered with a shared atomic max.  On a GPU such a
    loop is only correct when every thread's trip count is the same; then this is the same loop."""
    tvar, extent = region["var"], region["extent"]
    start, stop = frame.loop
    dt = stop.dtype
    own = ir.Buffer(b.unique("trip_end"), (ir.const(extent), ir.const(1)), dt, ir.Scope.FRAGMENT)
    top = ir.Buffer(b.unique("trips_end"), (ir.const(1),), dt, ir.Scope.SHARED)
    host = b.frames[b.frames.index(region["frame"]) - 1]
    for buf in (own, top):
        host.buffers.add(buf)
        host.stmts.append(ir.Allocate(buf, loc))
    mine = ir.Load(own, (tvar, ir.const(0)))
    at = b.frames.index(frame)
    b.frames[at - 1].stmts.extend([  # thread-level code just before the loop (it is in the region)
        ir.Store(own, (tvar, ir.const(0)), ir.cast(stop, dt), loc),
        ir.Store(top, (ir.const(0),), ir.cast(start, dt), loc),  # every thread stores the same value
        ir.Atomic(ir.Op.ATOMIC_MAX, top, (ir.const(0),), mine, loc),  # a barrier before it (thread_sync)
    ])
    frame.bounds = {"extent": ir.binary(ir.Op.SUB, ir.Load(top, (ir.const(0),)), ir.cast(start, dt)),
                    "running": ir.binary(ir.Op.LT, ir.cast(frame.var, dt), mine), "tvar": tvar}


def guard_body(frame, loc) -> list:
    """The closed loop body ``frame.stmts`` with every statement guarded by its thread's break
    flag and its own trip count (module docstring, :func:`lift_bounds`): thread-level statements
    directly, a lifted body's thread maps inside."""
    stmts = list(frame.stmts)
    for info in (frame.breaks, frame.bounds):
        if info is None:
            continue
        if "flag" in info:
            running = ir.binary(ir.Op.EQ, ir.Load(info["flag"], (info["tvar"], ir.const(0))),
                                ir.const(0, dtypes.int32))
        else:
            running = info["running"]
        g = _Guard(running, info["tvar"], info.get("sites", set()), loc)
        stmts = g.block(stmts) if frame.hoisted else g.thread(stmts)
    return stmts


class _Guard:
    def __init__(self, running, tvar, sites, loc):
        self.running, self.tvar, self.sites, self.loc = running, tvar, sites, loc

    def thread(self, stmts) -> list:
        """Thread-level statements: each one under ``if running``, descending into the one that
        holds a break (statements after the break inside it are guarded again)."""
        return [s if isinstance(s, ir.Allocate) or id(s) in self.sites
                else ir.If(self.running, self.descend(s), None, self.loc) for s in stmts]

    def descend(self, s):
        if id(s) in self.sites or not any(id(n) in self.sites for n in ir.nodes(s)):
            return s
        if isinstance(s, ir.Seq):
            return ir.seq(self.thread(list(s.body)), self.loc)
        if isinstance(s, ir.If):
            orelse = None if s.orelse is None else ir.seq(self.thread(_stmts(s.orelse)), self.loc)
            return replace(s, then=ir.seq(self.thread(_stmts(s.then)), self.loc), orelse=orelse)
        return s

    def block(self, stmts) -> list:
        """A lifted loop body: thread maps (guarded inside), lifted inner loops (recursively)."""
        from kernforge.dsl.compat import UnsupportedError

        out = []
        for s in stmts:
            if isinstance(s, ir.Parallel) and s.vars == (self.tvar,):
                s = replace(s, body=ir.seq(self.thread(_stmts(s.body)), s.loc))
            elif isinstance(s, ir.For):
                s = replace(s, body=ir.seq(self.block(_stmts(s.body)), s.loc))
            elif not isinstance(s, ir.Allocate):
                raise UnsupportedError("block-level tile code in a loop of thread-level code whose threads may "
                                       "stop early (a runtime `break`, or a trip count read per thread): no "
                                       "thread's own condition can guard it", getattr(s, "loc", None) or self.loc)
            out.append(s)
        return out


def _stmts(s) -> list:
    return list(s.body) if isinstance(s, ir.Seq) else [s]
