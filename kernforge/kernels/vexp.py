"""``exp(x)`` for float32 tile expressions, built on ``T.exp2`` so that CPU loops vectorise.

Why: ``T.exp`` of a float32 renders to the C library's ``expf`` (and a float64 one to
``exp``), a call that keeps the whole loop around it scalar: at a tiny() prefill of
8 x 1024 tokens the SwiGLU, the compressor's softmax and the hyper-connections spent most
of their time there.  ``T.exp2`` of a float32 renders to ``kf_exp2f`` (``kf/vmath.h``),
branch-free arithmetic that g++ vectorises.  ``exp2(x * log2(e))`` alone is not accurate
enough: the product's rounding is ``|x| 2^-24`` in the exponent, ~15 ulps of the result at
``|x| = 30``.  So the product is split exactly (``x = xh + xl`` with ``xh`` keeping 12
significant bits, ``log2(e) = L1 + L2`` with ``L1`` of 12 bits: ``xh L1`` is exact),
summed once to ``s`` with its rounding error ``err`` kept (Fast2Sum), and
``exp(x) = exp2(s) * (1 + err ln 2)`` (``|err ln 2| < 2^-16``: the dropped second-order term
is below 2^-33).  The result is within about 2 ulps of ``exp(x)`` (``kf_exp2f`` is within
one ulp of ``2^s``; two more roundings); ``-inf`` gives 0, ``+inf`` gives ``+inf`` and a NaN
stays NaN.  Inputs with ``|x| >= 128`` (and the non-finite ones) skip the split, integer
tests only, so the loop stays branch-free: ``exp`` is 0 or ``inf`` there already, and the
split's ``xh * L1`` would overflow past ``|x| ~ 2.3e38``, turning ``s - hi`` into ``inf - inf``.  On CUDA ``T.exp2`` is ``exp2f``, on the interpreter numpy's: the same
formula, as accurate.
"""
from __future__ import annotations

import kernforge.dsl as T

_L1 = 1.4423828125  # log2(e) truncated to 12 significant bits: xh * _L1 is exact in float32
_L2 = 0.00031222839606925845  # float32(log2(e) - _L1); the rest (7e-12) is below 2^-36 of log2(e)
_LN2 = 0.6931471805599453
_HIGH_BITS = -4096  # 0xFFFFF000: the sign, exponent and 11 leading mantissa bits of a float32
_ABS_BITS = 0x7FFFFFFF
_SPLIT_LIMIT_BITS = 0x43000000  # 128.0f: past it float32 exp is 0 or inf, no split needed


def exp_finite(x):
    """:func:`exp` of a float32 expression the caller keeps finite (e.g. clamped to
    ``[-200, 200]``, where float32 ``exp`` is 0 or ``inf`` already, which also keeps
    ``x * log2(e)`` from overflowing): the same split without the non-finite selects, whose
    masks cost a host loop about a fifth of its time (the routing gate's)."""
    xh = T.reinterpret("float32", T.reinterpret("int32", x) & _HIGH_BITS)
    xl = x - xh  # exact
    hi = xh * _L1  # exact
    lo = (xl * _L1 + xh * _L2) + xl * _L2
    s = hi + lo
    return T.exp2(s) * (1.0 + (lo - (s - hi)) * _LN2)


def exp(x):
    """``exp(x)`` of a float32 expression, within ~2 ulps, vectorisable on the CPU."""
    bits = T.reinterpret("int32", x)
    split = (bits & _ABS_BITS) < _SPLIT_LIMIT_BITS  # |x| < 128: false for inf and NaN too
    xh = T.where(split, T.reinterpret("float32", bits & _HIGH_BITS), x)
    xl = T.where(split, x - xh, 0.0)  # exact
    hi = xh * _L1  # exact where split
    lo = (xl * _L1 + xh * _L2) + xl * _L2
    s = hi + lo  # where not split: +-inf, NaN, or |s| > 184, so exp2(s) is inf or 0
    err = T.where(split, lo - (s - hi), 0.0)  # Fast2Sum: |hi| >= |lo|, so s + err == hi + lo
    return T.exp2(s) * (1.0 + err * _LN2)
