"""TileLang's automatic barriers in thread-level code (its shared-memory ``ThreadSync`` pass).

TileLang programs write shared memory from some threads and read it from others with no
``T.sync_threads()`` between: TileLang's compiler inserts the barrier (the Hadamard example's
exchange between warps, GEMV's ``if tk == 0: C_shared[tn] = 0`` before the atomic adds).  A
thread region (:mod:`kernforge.dsl.compat`) is one ``T.Parallel`` over the block's threads, whose
iterations must not depend on each other, so here the region's statements are split into
consecutive thread maps wherever a statement touches a shared buffer that an earlier statement
of the same map wrote: every thread's writes are then done before any thread reads.  A
``T.serial``/``T.Pipelined`` loop with such a dependence inside, and bounds every thread shares,
is lifted out of the map (``for k: (for tx: a; for tx: b)``), which also orders one iteration's
reads before the next iteration's writes.  Splitting is conservative: a map that only re-reads
its own thread's elements is split too, which changes no result.  Conflicts inside one
statement, a branch or a thread-dependent loop are left as written.
"""
from __future__ import annotations

from kernforge.codegen import ir


def _shared(stmt) -> tuple[set, set]:
    """(shared buffers ``stmt`` reads, shared buffers it writes or updates)."""
    reads, writes = set(), set()
    for n in ir.nodes(stmt):
        buf = getattr(n, "buffer", None)
        if isinstance(n, ir.Allocate) or not isinstance(buf, ir.Buffer) or buf.scope != ir.Scope.SHARED:
            continue
        (reads if isinstance(n, ir.Load) else writes).add(buf)
    return reads, writes


def _uniform(loop: ir.For, var: ir.Var) -> bool:
    return not any(n is var or isinstance(n, ir.Load)
                   for e in (loop.start, loop.extent) for n in ir.nodes(e))


def _body(stmt) -> list:
    return list(stmt.body) if isinstance(stmt, ir.Seq) else [stmt]


def _needs_split(stmts: list) -> bool:
    written = set()
    for s in stmts:
        r, w = _shared(s)
        if (r | w) & written:
            return True
        written |= w
    return False


def thread_maps(stmts: list, var: ir.Var, extent: int, loc) -> list:
    """``for var in T.Parallel(extent): stmts`` as a list of statements (thread maps and lifted
    loops) with the barriers TileLang would insert (module docstring)."""
    out, cur, written = [], [], set()

    def flush():
        if cur:
            out.append(ir.Parallel((var,), (extent,), ir.seq(list(cur), loc), loc))
            cur.clear()

    for s in stmts:
        r, w = _shared(s)
        if (r | w) & written:
            flush()
            written = set()
        body = _body(s.body) if isinstance(s, ir.For) else None
        if body is not None and _uniform(s, var) and (_needs_split(body) or (r & w)):
            flush()
            written = set()
            inner = thread_maps(body, var, extent, loc)
            out.append(ir.For(s.var, s.extent, ir.seq(inner, s.loc), s.kind, s.num_stages, s.start, s.loc))
            continue
        cur.append(s)
        written |= w
    flush()
    return out
