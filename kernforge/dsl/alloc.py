"""On-chip allocations: shared tiles, fragments, per-thread locals and variables.

Each takes TileLang's ``scope=`` string; one that names another kind of allocation is an
error (``docs/tilelang-hints.md``)."""
from __future__ import annotations

from kernforge.codegen import ir
from kernforge.dsl import builder as B
from kernforge.dsl import hints
from kernforge.dsl.handles import TensorHandle, VarHandle
from kernforge.dsl.types import dtype_arg

_WHAT = {ir.Scope.SHARED: "T.alloc_shared", ir.Scope.FRAGMENT: "T.alloc_fragment"}


def _alloc(shape, dtype, scope: ir.Scope, base: str, cls=TensorHandle):
    loc = B.user_loc(3)
    shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    # a folded integer expression (TileLang's T.ceildiv of two ints) is a compile-time size
    shape = tuple(int(s.value) if isinstance(s, ir.Const) and s.dtype.is_int else s for s in shape)
    for s in shape:
        if isinstance(s, bool) or not isinstance(s, int) or s <= 0:
            raise B.error(f"{scope.value} allocation needs positive compile-time dimensions, "
                          f"got {shape}", loc)
    what = _WHAT.get(scope) or ("T.alloc_var" if cls is VarHandle else "T.alloc_local")
    dt = dtype_arg(dtype, what, loc)
    b = B.current()
    buf = ir.Buffer(b.unique(base), tuple(ir.const(s) for s in shape), dt, scope)
    b.declare(buf, loc)
    return cls(buf, auto_named=True)


def alloc_shared(shape, dtype, scope: str = "shared.dyn") -> TensorHandle:
    """``A_s = T.alloc_shared((BM, BK), dtype)``: a tile in on-chip memory visible to the
    whole block, the staging buffer of ``T.copy`` from global memory and an operand of
    ``T.gemm``.  ``shape`` holds positive compile-time ints.  The tile's contents start
    undefined (the interpreter fills new float tiles with NaN and integer tiles with a
    sentinel, so a read before a write shows).  ``scope`` "shared" and "shared.dyn" are the same here: backends place every
    shared tile themselves (CUDA: one dynamic shared-memory arena); other scope strings
    are errors.  Allocate before any ``T.Parallel``, not inside it."""
    hints.check_scope(scope, ("shared.dyn", "shared"), "alloc_shared", B.user_loc(2))
    return _alloc(shape, dtype, ir.Scope.SHARED, "shared")


def alloc_fragment(shape, dtype, scope: str = "local.fragment") -> TensorHandle:
    """``C_f = T.alloc_fragment((BM, BN), "float32")``: a tile private to the block, spread
    over its threads (registers on CUDA, ordinary memory on the CPU).  Accumulators of
    ``T.gemm``, the operands and results of ``T.reduce_*`` and element-wise ``T.Parallel``
    work live here.  Shapes, initial contents and placement rules as for
    :func:`alloc_shared`."""
    hints.check_scope(scope, ("local.fragment",), "alloc_fragment", B.user_loc(2))
    return _alloc(shape, dtype, ir.Scope.FRAGMENT, "frag")


def alloc_local(shape, dtype, scope: str = "local") -> TensorHandle:
    """A small array holding block-uniform values (every thread of the block sees the same
    contents), for per-block counters or a handful of scalars indexed by compile-time
    constants.  Storing to it inside ``T.Parallel`` is an error (every iteration would
    write the same element); use a fragment indexed by the loop variables instead."""
    hints.check_scope(scope, ("local",), "alloc_local", B.user_loc(2))
    return _alloc(shape, dtype, ir.Scope.LOCAL, "local")


def alloc_var(dtype, init=None, scope: str = "local.var") -> VarHandle:
    """``acc = T.alloc_var("int32", init=0)``: a block-uniform scalar variable.

    It reads as a value in expressions; ``acc = v`` inside the kernel is rewritten into a
    store (as in TileLang), and so are ``acc += v`` and ``acc[0] = v``.  ``init`` stores an
    initial value.  Loop-carried scalars (a running count, a bucket found by a search)
    are written this way."""
    hints.check_scope(scope, ("local.var", "local"), "alloc_var", B.user_loc(2))
    v = _alloc((1,), dtype, ir.Scope.LOCAL, "var", VarHandle)
    if init is not None:
        v.assign(init)
    return v
