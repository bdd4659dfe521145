"""On-chip allocations: shared tiles, fragments, per-thread locals and variables.

Each takes TileLang's ``scope=`` string; one that names another kind of allocation is an
error (``docs/tilelang-hints.md``)."""
from __future__ import annotations

from kernforge import dtypes
from kernforge.codegen import ir
from kernforge.dsl import builder as B
from kernforge.dsl import hints
from kernforge.dsl.handles import TensorHandle, VarHandle


def _alloc(shape, dtype, scope: ir.Scope, base: str, cls=TensorHandle):
    loc = B.user_loc(3)
    shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    for s in shape:
        if isinstance(s, bool) or not isinstance(s, int) or s <= 0:
            raise B.error(f"{scope.value} allocation needs positive compile-time dimensions, "
                          f"got {shape}", loc)
    b = B.current()
    buf = ir.Buffer(b.unique(base), tuple(ir.const(s) for s in shape), dtypes.dtype(dtype), scope)
    b.declare(buf, loc)
    return cls(buf, auto_named=True)


def alloc_shared(shape, dtype, scope: str = "shared.dyn") -> TensorHandle:
    """A tile in on-chip memory visible to the whole block.  ``scope`` "shared" and
    "shared.dyn" are the same here: backends place every shared tile themselves (CUDA: one
    dynamic shared-memory arena)."""
    hints.check_scope(scope, ("shared.dyn", "shared"), "alloc_shared", B.user_loc(2))
    return _alloc(shape, dtype, ir.Scope.SHARED, "shared")


def alloc_fragment(shape, dtype, scope: str = "local.fragment") -> TensorHandle:
    """A tile private to the block, spread over its threads (registers on CUDA)."""
    hints.check_scope(scope, ("local.fragment",), "alloc_fragment", B.user_loc(2))
    return _alloc(shape, dtype, ir.Scope.FRAGMENT, "frag")


def alloc_local(shape, dtype, scope: str = "local") -> TensorHandle:
    """Small per-thread storage holding block-uniform values."""
    hints.check_scope(scope, ("local",), "alloc_local", B.user_loc(2))
    return _alloc(shape, dtype, ir.Scope.LOCAL, "local")


def alloc_var(dtype, init=None, scope: str = "local.var") -> VarHandle:
    """A scalar variable; ``init`` stores an initial value."""
    hints.check_scope(scope, ("local.var", "local"), "alloc_var", B.user_loc(2))
    v = _alloc((1,), dtype, ir.Scope.LOCAL, "var", VarHandle)
    if init is not None:
        v.assign(init)
    return v
