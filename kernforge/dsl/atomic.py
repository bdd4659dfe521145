"""``T.atomic_add`` / ``T.atomic_max`` on one element or, element-wise, on a tile."""
from __future__ import annotations

from kernforge import dtypes
from kernforge.codegen import ir
from kernforge.dsl import builder as B
from kernforge.dsl.handles import TensorHandle, to_region, unwrap_expr

_ATOMIC_TYPES = (dtypes.float32, dtypes.float64, dtypes.int32, dtypes.int64, dtypes.uint32)


def _atomic(op: ir.Op, dst, value, return_prev: bool = False):
    loc = B.user_loc(3)
    b = B.current()
    if isinstance(value, TensorHandle) and not hasattr(value, "__kf_expr__"):
        if return_prev:
            raise B.error(f"T.{op.value}(return_prev=True) of a tile: a fetch returns one element's "
                          "previous value; update one element", loc)
        _atomic_tile(op, dst, value, loc)
        return None
    if not isinstance(dst, ir.Load):
        raise B.error(f"T.{op.value} destination must be an element like C[i, j] (or a tile start "
                      "with a tile value)", loc)
    buf = dst.buffer
    if buf.scope not in (ir.Scope.GLOBAL, ir.Scope.SHARED):
        raise B.error(f"T.{op.value} on {buf.scope.value} buffer {buf.name}: atomics act on "
                      "global or shared memory", loc)
    if buf.dtype not in _ATOMIC_TYPES:
        raise B.error(f"T.{op.value} on {buf.dtype} is not supported; use one of "
                      f"{', '.join(map(str, _ATOMIC_TYPES))}", loc)
    v = ir.cast(unwrap_expr(value, buf.dtype), buf.dtype)
    if not return_prev:
        b.emit(ir.Atomic(op, buf, dst.indices, v, loc))
        return None
    return _fetch(b, op, buf, dst.indices, v, loc)


def _fetch(b, op: ir.Op, buf, indices, v, loc) -> ir.Expr:
    """A fetch-and-op in thread-level code: the previous value lands in a fresh variable of the
    calling thread's own (a per-thread element, as a shuffle's result), which is returned.  In
    tile code there is no thread to hand one previous value to, so it is refused there."""
    from kernforge.dsl import compat

    region = b.thread_region
    if region is None:
        raise compat.UnsupportedError(f"T.{op.value}(return_prev=True) outside thread-level code: the "
                                      "previous value belongs to one thread; call tx = "
                                      "T.get_thread_binding() first", loc)
    res = compat.per_thread_var(buf.dtype, "prev")
    idx = (region["var"], ir.const(0))
    b.emit(ir.Atomic(op, buf, indices, v, loc, result=res, result_indices=idx))
    return ir.Load(res, idx)


def _atomic_tile(op: ir.Op, dst, value: TensorHandle, loc) -> None:
    b = B.current()
    src = to_region(value, None, "atomic value")
    d = to_region(dst, src.extents, "atomic destination")
    if d.squeezed() != src.squeezed():
        raise B.error(f"T.{op.value} shape mismatch: {d!r} vs tile {src.extents}", loc)
    ext = src.extents
    vars_ = tuple(b.new_var(f"a{k}") for k in range(len(ext)))
    # map the value tile's indices onto the destination's non-unit dims
    dvals = iter(v for v, e in zip(vars_, ext) if e != 1)
    didx, conds = [], []
    for start, e, dim in zip(d.starts, d.extents, d.buffer.shape):
        idx = ir.fold(start + next(dvals)) if e != 1 else start
        didx.append(idx)
        conds.append(idx < dim)
    cond = conds[0]
    for c in conds[1:]:
        cond = cond & c
    load = ir.Load(src.buffer, tuple(s + v for s, v in zip(src.starts, vars_)))
    with b.frame("parallel") as f:
        _atomic(op, ir.Load(d.buffer, tuple(didx)), load)
    body = ir.If(cond, ir.seq(f.stmts, loc), None, loc)
    b.emit(ir.Parallel(vars_, ext, body, loc))


def _memory_order(name: str, memory_order) -> None:
    """TileLang's ``memory_order=``: kernforge's atomics are relaxed (they order nothing
    else), so "relaxed" (or none) is what runs; a stronger order is refused, not weakened."""
    if memory_order not in (None, "relaxed"):
        raise B.error(f"T.{name}(memory_order={memory_order!r}): kernforge's atomics are relaxed; "
                      "order other memory with a barrier (T.sync_threads) or a separate kernel block")


def atomic_add(dst, value, return_prev: bool = False, memory_order=None):
    """``dst += value`` atomically, for blocks (or threads) that update one location.

    ``dst`` is an element of a global or shared buffer (``C[i, j]``) and ``value`` a scalar;
    or ``dst`` is a tile start and ``value`` a tile, added element-wise (elements outside
    ``dst``'s buffer are skipped, as ``T.copy`` does).  The dtype must be float32, float64,
    int32, int64 or uint32.  Float sums depend on the arrival order, so results agree to
    rounding only.  ``return_prev=True`` (TileLang's fetch-and-add, thread-level code only)
    returns the element's value just before this thread's update: threads adding 1 to one
    counter get distinct slots.  ``memory_order`` may be "relaxed" (what kernforge's atomics are)."""
    _memory_order("atomic_add", memory_order)
    return _atomic(ir.Op.ATOMIC_ADD, dst, value, return_prev)


def atomic_max(dst, value, return_prev: bool = False, memory_order=None):
    """``dst = max(dst, value)`` atomically; operands and dtypes as in :func:`atomic_add`.
    Being a max, the final value does not depend on the arrival order (the previous values
    ``return_prev=True`` returns do)."""
    _memory_order("atomic_max", memory_order)
    return _atomic(ir.Op.ATOMIC_MAX, dst, value, return_prev)
