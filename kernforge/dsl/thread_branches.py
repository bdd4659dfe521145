"""Named partial barriers under thread-index branches, as DeepSeek V3.2's top-k selector writes
its cumsum: ``if tx < RADIX: for i in T.serial(8): T.sync_threads(3, RADIX); ...``.

On a GPU, ``T.sync_threads(barrier_id, arrive_count)`` (PTX ``bar.sync id, count``) waits for
``arrive_count`` threads only: those that took the branch.  kernforge lowers thread-level code
as maps over the block's threads split at barriers (:mod:`kernforge.dsl.compat`), so a barrier
under a branch is made legal by *distributing* the branch over the split:
``if c: A; sync; B`` becomes ``(for tx: if c: A)`` then ``(for tx: if c: B)``.  That is exact
when ``c`` reads nothing but the thread index and constants, since it then has the same value in
every part; every thread reaches every split, so CUDA's full barrier between the maps is a
correct (stronger) stand-in for the named one.  ``arrive_count`` is checked at trace time
against the number of threads that take the enclosing branches (a mismatch hangs a GPU).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from kernforge.codegen import ir


def thread_only(cond, tvar) -> bool:
    """``cond`` reads nothing but the thread index and constants (no memory, no other variable)."""
    return all(n is tvar for n in ir.nodes(cond) if isinstance(n, (ir.Var, ir.Load)))


def taken(cond, tvar, extent: int) -> np.ndarray:
    """Which of the block's ``extent`` threads satisfy ``cond`` (a function of the thread index
    alone), by the interpreter's own arithmetic."""
    from kernforge.interp.values import Evaluator

    class _Threads:
        env = {tvar: np.arange(extent, dtype=np.int32)}

    return np.broadcast_to(np.asarray(Evaluator(_Threads())(cond)).astype(bool), (extent,))


def distributable(frame, tvar) -> bool:
    """``frame`` is a runtime branch on the thread index alone (see the module docstring)."""
    return frame.kind == "branch" and frame.cond is not None and thread_only(frame.cond, tvar)


def check_count(name: str, arrive_count: int, branches: list, tvar, extent: int, loc, error) -> None:
    """``arrive_count`` must be the number of threads that take every branch in ``branches``."""
    mask = np.ones(extent, dtype=bool)
    for f in branches:
        mask &= taken(f.cond, tvar, extent)
    n = int(mask.sum())
    if n != arrive_count:
        raise error(f"{name}: {n} of the block's {extent} threads reach this barrier, but it waits "
                    f"for arrive_count={arrive_count} (on a GPU the block would hang)", loc)


def guard_maps(stmts: list, cond, tvar) -> list:
    """``stmts`` (thread maps, and uniform loops of them) with every thread map's body run only
    where ``cond`` holds: the branch distributed over the maps."""
    out = []
    for s in stmts:
        if isinstance(s, ir.Parallel) and s.vars == (tvar,):
            s = replace(s, body=ir.If(cond, s.body, None, s.loc))
        elif isinstance(s, ir.For):
            inner = list(s.body.body) if isinstance(s.body, ir.Seq) else [s.body]
            s = replace(s, body=ir.seq(guard_maps(inner, cond, tvar), s.loc))
        out.append(s)
    return out
