"""Scalar math: ``T.max``, ``T.exp``, ``T.where``, ``T.cast``, ... (all build IR expressions)."""
from __future__ import annotations

import math as _pymath

from kernforge import dtypes
from kernforge.codegen import ir
from kernforge.dsl.handles import unwrap_expr


def _e(x, like=None) -> ir.Expr:
    return unwrap_expr(x, like)


def max(a, b):  # noqa: A001 - TileLang spelling
    return ir.binary(ir.Op.MAX, _e(a) if not isinstance(a, (int, float)) else a,
                     _e(b) if not isinstance(b, (int, float)) else b)


def min(a, b):  # noqa: A001
    return ir.binary(ir.Op.MIN, _e(a) if not isinstance(a, (int, float)) else a,
                     _e(b) if not isinstance(b, (int, float)) else b)


def _unary(op):
    def f(x):
        return ir.unary(op, _e(x))
    f.__name__ = op.value
    f.__doc__ = f"Element {op.value} (computed in float32 for low-precision inputs)."
    return f


exp = _unary(ir.Op.EXP)
exp2 = _unary(ir.Op.EXP2)
log = _unary(ir.Op.LOG)
log2 = _unary(ir.Op.LOG2)
sqrt = _unary(ir.Op.SQRT)
rsqrt = _unary(ir.Op.RSQRT)
abs = _unary(ir.Op.ABS)  # noqa: A001
floor = _unary(ir.Op.FLOOR)
ceil = _unary(ir.Op.CEIL)
tanh = _unary(ir.Op.TANH)
isnan = _unary(ir.Op.ISNAN)


def pow(a, b):  # noqa: A001
    return ir.binary(ir.Op.POW, _e(a), b)


def where(cond, a, b):
    """``a`` where ``cond`` holds, else ``b`` (both evaluated)."""
    return ir.select(_e(cond), a if isinstance(a, (int, float)) else _e(a),
                     b if isinstance(b, (int, float)) else _e(b))


if_then_else = where


def cast(x, dtype):
    """Convert ``x`` to ``dtype`` (round to nearest even for narrower floats)."""
    return ir.cast(x if isinstance(x, (int, float, bool)) else _e(x), dtypes.dtype(dtype))


def reinterpret(dtype, x):
    """The bits of ``x`` read as ``dtype`` (same width), as TileLang's T.reinterpret."""
    dt = dtypes.dtype(dtype)
    e = _e(x)
    if dt.itemsize != e.dtype.itemsize:
        raise ir.KernelError(f"T.reinterpret: {e.dtype} and {dt} differ in width")
    return ir.Bitcast(e, dt)


def ceildiv(a, b):
    return ir.ceildiv(a if isinstance(a, int) else _e(a), b if isinstance(b, int) else _e(b))


def infinity(dtype):
    return ir.const(_pymath.inf, dtypes.dtype(dtype))


def max_value(dtype):
    dt = dtypes.dtype(dtype)
    import numpy as np
    info = np.finfo(dt.np_dtype) if dt.is_float else np.iinfo(dt.np_dtype)
    return ir.const(info.max.item() if hasattr(info.max, "item") else info.max, dt)


def min_value(dtype):
    dt = dtypes.dtype(dtype)
    import numpy as np
    info = np.finfo(dt.np_dtype) if dt.is_float else np.iinfo(dt.np_dtype)
    return ir.const(info.min.item() if hasattr(info.min, "item") else info.min, dt)
