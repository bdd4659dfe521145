"""Trace state: the statement lists being built and the buffers in scope.

A DSL call never produces text or looks at a target; it appends one IR node to
the innermost open frame.  Frames open for the kernel body, loops and branches;
a buffer allocated in a frame is live until that frame closes, so a use after
that is reported at the author's line.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Optional

from kernforge.codegen import ir

def user_loc(depth: int = 1) -> Optional[ir.SourceLoc]:
    """The kernel author's file and line (see :func:`ir.caller_loc`)."""
    return ir.caller_loc()


def error(message: str, loc: Optional[ir.SourceLoc] = None) -> ir.KernelError:
    return ir.KernelError(message, loc or user_loc(2))


@dataclass
class Frame:
    kind: str
    stmts: list = field(default_factory=list)
    buffers: set = field(default_factory=set)
    loop: tuple = ()  # (start, stop) of a T.serial/T.Pipelined/T.unroll frame
    parallel: tuple = ()  # (vars, extents) of a T.Parallel frame (kernforge.dsl.reducer)
    cond: object = None  # a runtime branch's condition (kernforge.dsl.compat.subset_tile_code)
    hoisted: bool = False  # a uniform loop lifted out of its thread region (kernforge.dsl.compat)
    loop_id: object = None  # the author's loop, for a runtime break in it (kernforge.dsl.thread_breaks)
    breaks: Optional[dict] = None  # that break's flag and sites (kernforge.dsl.thread_breaks)
    var: object = None  # a T.serial/T.Pipelined/T.unroll frame's loop variable
    bounds: Optional[dict] = None  # per-thread trip counts lifted to the block's (thread_breaks)


class Builder:
    """One kernel's trace in progress."""

    def __init__(self, name: str, params: tuple):
        self.name = name
        self.params = params
        self.frames: list[Frame] = [Frame("prim_func")]
        self.kernel: Optional[dict] = None
        self.blocks: list[dict] = []  # every closed `with T.Kernel` block, in order (one launch each)
        self.hints: list[tuple] = []  # TileLang performance hints recorded (kernforge.dsl.compat)
        self.thread_region: Optional[dict] = None  # open thread-level region (kernforge.dsl.compat)
        self.last_region: Optional[dict] = None  # the region a lifted loop interrupted
        self.thread_vars: list[str] = []  # thread-region variables: their maps are thread maps (interp)
        self.early_locals: list = []  # T.alloc_local before the thread region (kernforge.dsl.compat)
        self.subset: Optional[dict] = None  # a thread-subset branch of tile code (kernforge.dsl.compat)
        self.names: set[str] = {p.name for p in params}
        self.var_count = 0
        self.global_buffers = {p for p in params if isinstance(p, ir.Buffer)}
        self.scratch: list[ir.Buffer] = []  # a prim_func's T.alloc_global buffers (trailing parameters)

    def add_global(self, buffer: ir.Buffer) -> None:
        """A global tensor that becomes a parameter during the trace (``@T.jit``'s in-body
        annotations and ``T.empty`` outputs): usable from every kernel block."""
        self.names.add(buffer.name)
        self.global_buffers.add(buffer)

    # names ------------------------------------------------------------------
    def unique(self, base: str) -> str:
        name, n = base, 1
        while name in self.names:
            name, n = f"{base}_{n}", n + 1
        self.names.add(name)
        return name

    def new_var(self, base: str, dtype=None) -> ir.Var:
        from kernforge import dtypes

        return ir.Var(self.unique(base), dtype or dtypes.int32)

    # frames -----------------------------------------------------------------
    @property
    def top(self) -> Frame:
        return self.frames[-1]

    def emit(self, stmt: ir.Stmt) -> ir.Stmt:
        if self.kernel is None or self.top.kind == "prim_func":
            raise error(f"{type(stmt).__name__.lower()} outside `with T.Kernel(...)`", stmt.loc)
        if isinstance(stmt, _TILE_STMTS):
            self.tile_code()
        self.top.stmts.append(stmt)
        return stmt

    @contextmanager
    def frame(self, kind: str):
        f = Frame(kind)
        self.frames.append(f)
        yield f
        if self.frames[-1] is not f:
            raise error("unbalanced DSL scopes: `break`, `return` or an exception inside a "
                        "T.serial/T.Parallel/T.Pipelined loop or runtime `if` is not supported")
        self.frames.pop()

    def inside(self, kind: str) -> bool:
        return any(f.kind == kind for f in self.frames)

    # buffers ----------------------------------------------------------------
    def tile_code(self) -> None:
        """Tile-level code starts: inside a branch of thread-level code on the thread index
        alone, that branch becomes tile code run by a subset of the threads
        (:func:`kernforge.dsl.compat.subset_tile_code`)."""
        if self.thread_region is not None and self.top.kind == "branch":
            from kernforge.dsl.compat import subset_tile_code

            subset_tile_code(self)

    def declare(self, buffer: ir.Buffer, loc) -> None:
        self.tile_code()
        region = self.thread_region
        if region is not None and self.top is region["frame"]:
            # thread-level code (kernforge.dsl.compat): the region is a T.Parallel over the
            # block's threads, so its allocations go just before it, into the kernel body
            below = self.frames[self.frames.index(region["frame"]) - 1]
            below.buffers.add(buffer)
            below.stmts.append(ir.Allocate(buffer, loc))
            return
        if self.inside("parallel"):
            raise error("allocation inside T.Parallel: allocate tiles before the parallel loop", loc)
        self.top.buffers.add(buffer)
        self.emit(ir.Allocate(buffer, loc))

    def check_live(self, buffer: ir.Buffer, loc=None) -> None:
        if buffer in self.global_buffers or any(buffer in f.buffers for f in self.frames):
            return
        raise error(f"buffer {buffer.name!r} used out of scope: it was allocated in a loop, "
                    "branch or kernel that has already closed", loc)


_TILE_STMTS = (ir.Copy, ir.Fill, ir.Reduce, ir.Gemm, ir.Parallel)

_stack: list[Builder] = []


def current() -> Builder:
    if not _stack:
        raise error("kernforge DSL call outside a @T.prim_func being traced")
    return _stack[-1]


@contextmanager
def tracing(builder: Builder):
    _stack.append(builder)
    try:
        yield builder
    finally:
        _stack.pop()
