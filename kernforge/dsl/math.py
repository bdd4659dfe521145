"""Scalar math: ``T.max``, ``T.exp``, ``T.where``, ``T.cast``, ... (all build IR expressions)."""
from __future__ import annotations

import math as _pymath

from kernforge.codegen import ir
from kernforge.dsl.handles import unwrap_expr
from kernforge.dsl.types import dtype_arg


def _e(x, like=None) -> ir.Expr:
    return unwrap_expr(x, like)


def max(a, b):  # noqa: A001 - TileLang spelling
    """The larger of two scalars (element expressions, variables or Python numbers), in their
    promoted dtype.  NaN propagates: ``T.max(nan, x)`` is NaN on every backend, as
    ``torch.maximum`` is (C's ``fmaxf`` would drop it).  Use it inside ``T.Parallel`` or on
    variables; ``T.reduce_max`` reduces a whole tile."""
    return ir.binary(ir.Op.MAX, _e(a) if not isinstance(a, (int, float)) else a,
                     _e(b) if not isinstance(b, (int, float)) else b)


def min(a, b):  # noqa: A001
    """The smaller of two scalars, in their promoted dtype; NaN propagates, as in
    :func:`max`.  ``T.reduce_min`` reduces a whole tile."""
    return ir.binary(ir.Op.MIN, _e(a) if not isinstance(a, (int, float)) else a,
                     _e(b) if not isinstance(b, (int, float)) else b)


_LOW = (" The result is float64 for a float64 input and float32 otherwise: low-precision and "
        "integer inputs compute in float32.")


def _unary(op, doc: str):
    def f(x):
        return ir.unary(op, _e(x))
    f.__name__ = f.__qualname__ = op.value
    f.__doc__ = doc
    return f


exp = _unary(ir.Op.EXP, "``e ** x`` of a scalar expression." + _LOW)
exp2 = _unary(ir.Op.EXP2, "``2 ** x``: the cheaper exponential on GPUs (softmax kernels fold "
              "``log2(e)`` into their scale and call this)." + _LOW)
log = _unary(ir.Op.LOG, "Natural logarithm (``log(0) = -inf``, NaN below 0)." + _LOW)
log2 = _unary(ir.Op.LOG2, "Base-2 logarithm." + _LOW)
sqrt = _unary(ir.Op.SQRT, "Square root (NaN below 0)." + _LOW)
rsqrt = _unary(ir.Op.RSQRT, "``1 / sqrt(x)``, as RMSNorm uses it." + _LOW)
rcp = _unary(ir.Op.RCP, "``1 / x`` where speed matters more than the last bit (a softmax's final "
             "``1 / sum``): exact on the interpreter and host backends; on CUDA one "
             "``rcp.approx.ftz.f32`` (at most 1 ulp from ``1 / x``, subnormal inputs and results "
             "flushed to zero) instead of IEEE division's multi-instruction sequence and slow-path call; "
             "float64 stays exact everywhere." + _LOW)
abs = _unary(ir.Op.ABS, "Absolute value, in the input's dtype (ints stay ints; low-precision floats give float32).")  # noqa: A001
floor = _unary(ir.Op.FLOOR, "Round toward minus infinity (the result stays a float; ``T.cast`` it for an index)." + _LOW)
ceil = _unary(ir.Op.CEIL, "Round toward plus infinity (the result stays a float)." + _LOW)
tanh = _unary(ir.Op.TANH, "Hyperbolic tangent (GELU's tanh form)." + _LOW)
isnan = _unary(ir.Op.ISNAN, "A bool: whether ``x`` is NaN (use it to reject or mask NaN inputs "
               "explicitly; comparisons with NaN are false).")


def pow(a, b):  # noqa: A001
    """``a ** b`` for a float ``a`` (``b`` a scalar expression or Python number), computed in
    float32 for low-precision inputs.  Prefer ``T.exp2`` / ``T.rsqrt`` where they apply:
    they are cheaper on every backend."""
    return ir.binary(ir.Op.POW, _e(a), b)


def where(cond, a, b):
    """``a`` where the bool ``cond`` holds, else ``b``: a select, not a branch, so both sides
    are evaluated (an out-of-bounds read on the side not taken is still a read; guard
    indices with a runtime ``if`` instead).  ``T.if_then_else`` is the same function."""
    return ir.select(_e(cond), a if isinstance(a, (int, float)) else _e(a),
                     b if isinstance(b, (int, float)) else _e(b))


if_then_else = where


def cast(x, dtype):
    """Convert ``x`` to ``dtype``: floats round to nearest even when narrowing (float32 ->
    bfloat16 as torch does), float -> int truncates toward zero.  Storing into a buffer of
    another dtype casts implicitly; ``T.cast`` makes the conversion happen earlier, for
    example to do integer arithmetic on a float index.  ``T.float32(x)`` is the same."""
    return ir.cast(x if isinstance(x, (int, float, bool)) else _e(x), dtype_arg(dtype, "T.cast"))


def _astype(self, dtype):
    """``x.astype(dtype)``: :func:`cast` spelled as a method, as TileLang allows."""
    return cast(self, dtype)


ir.Expr.astype = _astype  # the IR's expressions take TileLang's method spelling too


def reinterpret(dtype, x):
    """The bits of ``x`` read as ``dtype`` of the same width, as TileLang's
    ``T.reinterpret``: ``T.reinterpret("uint32", f)`` is the float's bit pattern (radix
    selects order float keys by it).  Note the argument order: dtype first."""
    dt = dtype_arg(dtype, "T.reinterpret")
    e = _e(x)
    if dt.itemsize != e.dtype.itemsize:
        raise ir.KernelError(f"T.reinterpret: {e.dtype} and {dt} differ in width")
    return ir.Bitcast(e, dt)


def ceildiv(a, b):
    """``ceil(a / b)`` for non-negative integers, ``(a + b - 1) // b``: the number of tiles
    of size ``b`` that cover ``a`` (grid sizes, ``T.Pipelined`` trip counts).  Works on Python
    ints (at trace time) and on symbolic sizes alike."""
    return ir.ceildiv(a if isinstance(a, int) else _e(a), b if isinstance(b, int) else _e(b))


def infinity(dtype):
    """Positive infinity as a constant of the float ``dtype``; ``-T.infinity(dtype)`` is the
    identity of a running max (what ``T.fill(m, -T.infinity("float32"))`` starts a
    softmax row max with, and what a masked attention score is set to)."""
    return ir.const(_pymath.inf, dtype_arg(dtype, "T.infinity"))


def max_value(dtype):
    """The largest finite value of ``dtype`` as a constant (``int32``: 2147483647; ``float16``:
    65504): the start of a running min where infinity is not representable or wanted."""
    dt = dtype_arg(dtype, "T.max_value")
    import numpy as np
    info = np.finfo(dt.np_dtype) if dt.is_float else np.iinfo(dt.np_dtype)
    return ir.const(info.max.item() if hasattr(info.max, "item") else info.max, dt)


def min_value(dtype):
    """The most negative finite value of ``dtype`` as a constant (``int32``: -2147483648;
    floats: ``-max_value``, not the smallest positive number): the start of a running max
    over integers."""
    dt = dtype_arg(dtype, "T.min_value")
    import numpy as np
    info = np.finfo(dt.np_dtype) if dt.is_float else np.iinfo(dt.np_dtype)
    return ir.const(info.min.item() if hasattr(info.min, "item") else info.min, dt)
