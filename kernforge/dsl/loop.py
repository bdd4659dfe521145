"""Loops that stay in the IR: ``T.Parallel``, ``T.serial``, ``T.Pipelined``, ``T.unroll``.

Each is iterated by a Python ``for`` exactly once at trace time: the loop object
yields its IR variables, the body records into a new frame, and when Python asks
for the next item the frame closes into a ``For``/``Parallel`` node.  (A plain
``range`` loop unrolls at trace time instead.)  The tracer passes the author's
loop-variable names so that the IR and generated code read like the source.
"""
from __future__ import annotations

from kernforge import dtypes
from kernforge.codegen import arith, ir
from kernforge.dsl import builder as B
from kernforge.dsl import hints


class _Loop:
    names: tuple = ()

    def named(self, names):
        self.names = tuple(names)
        return self


class Parallel(_Loop):
    """``for i, j in T.Parallel(M, N)``: an element-wise map over an M x N tile.

    The extents are positive compile-time ints (tile shapes).  Iterations are independent
    and may run in any order or at once (CUDA spreads them over the block's threads, the
    CPU vectorises them): two iterations must not store to the same element, which the
    interpreter reports as a race.  A runtime ``if`` inside masks lanes (the ragged edge
    of a tile).  One ``T.Parallel`` takes several extents; nesting them is an error."""

    def __init__(self, *extents):
        self.loc = B.user_loc(2)
        exts = []
        for e in extents:
            c = arith.const_int(ir.as_expr(e)) if not isinstance(e, int) else e
            if c is None or c <= 0:
                raise B.error(f"T.Parallel extents must be positive compile-time ints (tile "
                              f"shapes), got {e}", self.loc)
            exts.append(c)
        self.extents = tuple(exts)

    def __iter__(self):
        b = B.current()
        b.tile_code()
        if b.inside("parallel"):
            raise B.error("nested T.Parallel: write one T.Parallel with several extents", self.loc)
        names = self.names or tuple(f"i{k}" for k in range(len(self.extents)))
        vars_ = tuple(b.new_var(n) for n in names)
        with b.frame("parallel") as f:
            f.parallel = (vars_, self.extents)
            yield vars_[0] if len(vars_) == 1 else vars_
        b.emit(ir.Parallel(vars_, self.extents, ir.seq(f.stmts, self.loc), self.loc))


class _Sequential(_Loop):
    kind = ir.LoopKind.SERIAL

    def __init__(self, start, stop=None, num_stages: int = 0):
        self.loc = B.user_loc(3)
        if stop is None:
            start, stop = 0, start
        self.start = ir.as_expr(start)
        self.stop = ir.as_expr(stop, self.start.dtype)
        for e in (self.start, self.stop):
            if not e.dtype.is_int:
                raise B.error(f"loop bound {e} is not an integer", self.loc)
        self.num_stages = num_stages

    def __iter__(self):
        b = B.current()
        dt = dtypes.promote(self.start.dtype, self.stop.dtype)
        var = b.new_var(self.names[0] if self.names else "k", dt)
        extent = ir.fold(ir.binary(ir.Op.SUB, self.stop, self.start))
        with b.frame("loop") as f:
            f.loop = (self.start, self.stop)
            f.loop_id = getattr(self, "loop_id", None)
            f.var = var
            yield var
            if f.hoisted:  # thread-level code split inside this loop (kernforge.dsl.compat)
                from kernforge.dsl import compat
                compat.leave_hoisted_loop(b)
        if f.breaks is not None or f.bounds is not None:  # threads that stop early (thread_breaks)
            from kernforge.dsl import thread_breaks
            f.stmts[:] = thread_breaks.guard_body(f, self.loc)
            extent = f.bounds["extent"] if f.bounds is not None else extent
        b.emit(ir.For(var, extent, ir.seq(f.stmts, self.loc), self.kind, self.num_stages,
                      self.start, self.loc))
        if f.hoisted:
            compat.reopen_region(b)


class serial(_Sequential):  # noqa: N801 - TileLang spelling
    """``for k in T.serial(n)`` / ``T.serial(start, stop)``: a sequential loop kept in the IR.

    Bounds may be runtime values (symbolic sizes, scalar parameters, loaded values).  A
    plain Python ``range`` loop unrolls while tracing instead, so use ``range`` only for
    short compile-time trip counts."""

    def __init__(self, start, stop=None):
        super().__init__(start, stop)


class Pipelined(_Sequential):
    """``for k in T.Pipelined(n, num_stages=3)``: a sequential loop whose global->shared
    copies a backend may overlap with compute over ``num_stages`` buffers.

    The results are those of ``T.serial``: on CUDA the copies at the top of the body
    become a ring of ``num_stages`` shared-memory buffers filled ahead of use (``cp.async``
    or TMA with mbarriers on sm_90a); the CPU and the interpreter run it as a plain loop.
    ``kernforge.backends.get("cuda").render(f.ir, dump=sys.stdout)`` shows the plan
    (the ``pipelines`` analysis).  TileLang's ``order=``/``stage=`` schedule hints are
    rejected: the backend plans the schedule."""

    kind = ir.LoopKind.PIPELINED

    def __init__(self, start, stop=None, num_stages: int = 2, order=None, stage=None):
        if not isinstance(num_stages, int) or num_stages < 1:
            raise B.error(f"T.Pipelined num_stages must be a positive int, got {num_stages!r}")
        hints.check_pipeline_schedule(order, stage, B.user_loc(2))
        super().__init__(start, stop, num_stages)


class unroll(_Sequential):  # noqa: N801
    """``for k in T.unroll(n)``: a sequential loop kept in the IR that the backend asks its
    compiler to unroll (``#pragma unroll``); the semantics are those of ``T.serial``."""

    kind = ir.LoopKind.UNROLLED

    def __init__(self, start, stop=None):
        super().__init__(start, stop)


def name_loop(obj, names):
    """Called by the tracer's source rewrite on ``for <names> in obj``."""
    return obj.named(names) if isinstance(obj, _Loop) else obj


def loop_id(obj, key: int):
    """Called by the tracer's source rewrite on a loop whose body has a ``break``: the loop object
    learns which of the author's loops it is, so that a runtime ``break`` finds its frame."""
    if isinstance(obj, _Sequential):
        obj.loop_id = key
    return obj
