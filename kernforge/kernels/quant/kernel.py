"""MoE activation / weight quantisation (DeepGEMM's casting recipes), written once in the DSL.

Three kernels, one block per scale block:

* :func:`per_token_cast` (FP8, 1x128): a block loads 128 elements of a row, takes their
  absolute maximum, and writes ``x / scale`` as e4m3 plus one float32 scale
  ``max(amax, 1e-4) / 448`` (rounded up to a power of two with ``use_ue8m0``);
* :func:`per_block_cast` (FP8, 128x128): the same over a 128x128 tile of ``[G, N, K]``;
* :func:`per_token_cast_fp4` (e2m1, 1x32): V4's FP4 format (``kernforge/model/quant.py``):
  a power-of-two scale ``2^ceil(log2(max(amax, 6 * 2^-126) / 6))`` per 32 values, values
  rounded to the e2m1 grid with ties to the even code, the sign taken from the sign bit
  (so ``-0.0`` and negatives that round to zero are code 8), two codes per byte, element
  ``2i`` in the low nibble.

Why the scale is rounded with integer operations instead of ``exp2(ceil(log2(s)))``: a
``log2`` of a float that is a few ulps above a power of two can round to the integer on
one backend and not on another (numpy, libm and CUDA differ in the last ulp), which would
change a scale by a factor of two.  Clearing the mantissa and stepping the exponent is
exact everywhere; NaN and infinity pass through unchanged, as they do in torch.

Edge blocks: ``T.copy`` reads 0 beyond ``K`` (or ``N``), which never raises an absolute
maximum, and skips the stores beyond, so ragged sizes need no extra code.  The torch
references pad with zeros the same way.
"""
from __future__ import annotations

import kernforge.dsl as T

FP8_BLOCK = 128
FP8_MAX = 448.0
FP8_AMAX_FLOOR = 1e-4
FP4_BLOCK = 32
FP4_MAX = 6.0
#: V4's FP4 amax floor (``kernforge.model.quant.fake_quant_fp4``): the smallest normal times 6,
#: so every scale is a normal power of two
FP4_AMAX_FLOOR = 6.0 * 2.0 ** -126
#: e2m1 rounding boundaries as (boundary, ties_round_up): a magnitude above the boundary (or
#: equal, when the tie goes to the upper, even code) steps one code up
E2M1_BOUNDARIES = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True),
                   (5.0, False))

_INPUT_DTYPES = ("float32", "bfloat16")


def _check_dtype(name: str, dtype: str) -> None:
    if dtype not in _INPUT_DTYPES:
        raise ValueError(f"{name}: dtype must be one of {_INPUT_DTYPES}, got {dtype!r}")


def ceil_pow2(s):
    """The smallest power of two ``>= s`` for a positive normal float32 ``s``, exactly (NaN and
    infinity unchanged): the exponent steps up when any mantissa bit is set."""
    bits = T.reinterpret("uint32", s)
    up = (bits & T.cast(0x7F800000, "uint32")) + T.cast(0x00800000, "uint32")
    rounded = T.where((bits & T.cast(0x007FFFFF, "uint32")) != T.cast(0, "uint32"), up, bits)
    return T.where(T.isnan(s) | (s == T.infinity("float32")), s, T.reinterpret("float32", rounded))


def _fp8_scale(amax, use_ue8m0: bool):
    sf = T.max(amax, T.float32(FP8_AMAX_FLOOR)) / T.float32(FP8_MAX)
    return ceil_pow2(sf) if use_ue8m0 else sf


@T.tunable(threads=[128, 256])
def per_token_cast(dtype: str = "bfloat16", use_ue8m0: bool = False, threads: int = 128):
    """``x [M, K]`` -> ``(data e4m3 [M, K], scales float32 [M, ceil(K / 128)])``."""
    _check_dtype("per_token_cast", dtype)
    M = T.symbolic("M")
    K = T.symbolic("K")
    KB = T.symbolic("KB")

    @T.prim_func
    def per_token_cast_kernel(x: T.Tensor((M, K), dtype), data: T.Tensor((M, K), "float8_e4m3"),
                              scales: T.Tensor((M, KB), "float32")):
        with T.Kernel(M, KB, threads=threads) as (row, kb):  # rows on x: no 65535 limit
            xt = T.alloc_fragment((1, FP8_BLOCK), "float32")
            mag = T.alloc_fragment((1, FP8_BLOCK), "float32")
            amax = T.alloc_fragment((1,), "float32")
            q = T.alloc_fragment((1, FP8_BLOCK), "float8_e4m3")
            T.copy(x[row, kb * FP8_BLOCK], xt)
            for i, j in T.Parallel(1, FP8_BLOCK):
                mag[i, j] = T.abs(xt[i, j])
            T.reduce_max(mag, amax, dim=1)
            sf = T.alloc_var("float32", _fp8_scale(amax[0], use_ue8m0))
            for i, j in T.Parallel(1, FP8_BLOCK):
                q[i, j] = xt[i, j] / sf
            T.copy(q, data[row, kb * FP8_BLOCK])
            scales[row, kb] = sf

    return per_token_cast_kernel


@T.tunable(threads=[128, 256])
def per_block_cast(dtype: str = "bfloat16", use_ue8m0: bool = False, threads: int = 256):
    """``x [G, N, K]`` -> ``(data e4m3 [G, N, K], scales float32 [G, ceil(N / 128), ceil(K / 128)])``."""
    _check_dtype("per_block_cast", dtype)
    G = T.symbolic("G")
    N = T.symbolic("N")
    K = T.symbolic("K")
    NB = T.symbolic("NB")
    KB = T.symbolic("KB")
    B = FP8_BLOCK

    @T.prim_func
    def per_block_cast_kernel(x: T.Tensor((G, N, K), dtype), data: T.Tensor((G, N, K), "float8_e4m3"),
                              scales: T.Tensor((G, NB, KB), "float32")):
        with T.Kernel(KB, NB, G, threads=threads) as (kb, nb, g):
            xt = T.alloc_fragment((B, B), dtype)  # the input's dtype: half the staging for bf16
            mag = T.alloc_fragment((B, B), "float32")
            rmax = T.alloc_fragment((B,), "float32")
            amax = T.alloc_fragment((1,), "float32")
            q = T.alloc_fragment((B, B), "float8_e4m3")
            T.copy(x[g, nb * B, kb * B], xt)
            for i, j in T.Parallel(B, B):
                mag[i, j] = T.abs(xt[i, j])
            T.reduce_max(mag, rmax, dim=1)
            T.reduce_max(rmax, amax, dim=0)
            sf = T.alloc_var("float32", _fp8_scale(amax[0], use_ue8m0))
            for i, j in T.Parallel(B, B):
                q[i, j] = xt[i, j] / sf
            T.copy(q, data[g, nb * B, kb * B])
            scales[g, nb, kb] = sf

    return per_block_cast_kernel


def e2m1_code(a):
    """The e2m1 magnitude code (0..7) of ``a >= 0`` (at most 6), rounded to nearest with ties
    to the even code: the number of boundaries ``a`` passes."""
    code = T.cast(a > T.float32(E2M1_BOUNDARIES[0][0]), "uint32")
    for boundary, tie_up in E2M1_BOUNDARIES[1:]:
        code = code + T.cast((a >= T.float32(boundary)) if tie_up else (a > T.float32(boundary)), "uint32")
    return code


@T.tunable(threads=[32, 64])
def per_token_cast_fp4(dtype: str = "bfloat16", threads: int = 32):
    """``x [M, K]`` (K even) -> ``(codes uint8 [M, K / 2], scales float32 [M, ceil(K / 32)])``.

    The codes buffer is the bytes of the op's int8 result (a uint8 view, so packing two
    nibbles never needs a narrowing conversion)."""
    _check_dtype("per_token_cast_fp4", dtype)
    M = T.symbolic("M")
    K = T.symbolic("K")
    KH = T.symbolic("KH")
    KB = T.symbolic("KB")
    H = FP4_BLOCK // 2

    @T.prim_func
    def per_token_cast_fp4_kernel(x: T.Tensor((M, K), dtype), codes: T.Tensor((M, KH), "uint8"),
                                  scales: T.Tensor((M, KB), "float32")):
        with T.Kernel(M, KB, threads=threads) as (row, kb):  # rows on x: no 65535 limit
            xt = T.alloc_fragment((1, FP4_BLOCK), "float32")
            mag = T.alloc_fragment((1, FP4_BLOCK), "float32")
            amax = T.alloc_fragment((1,), "float32")
            nib = T.alloc_fragment((1, FP4_BLOCK), "uint32")
            packed = T.alloc_fragment((1, H), "uint8")
            T.copy(x[row, kb * FP4_BLOCK], xt)
            for i, j in T.Parallel(1, FP4_BLOCK):
                mag[i, j] = T.abs(xt[i, j])
            T.reduce_max(mag, amax, dim=1)
            sf = T.alloc_var("float32", ceil_pow2(T.max(amax[0], T.float32(FP4_AMAX_FLOOR)) / T.float32(FP4_MAX)))
            for i, j in T.Parallel(1, FP4_BLOCK):
                # dividing by a power of two is exact, so the code depends on x alone
                nib[i, j] = e2m1_code(mag[i, j] / sf) | (
                    (T.reinterpret("uint32", xt[i, j]) >> 31) << T.cast(3, "uint32"))
            for i, j in T.Parallel(1, H):
                packed[i, j] = T.cast(nib[i, 2 * j] | (nib[i, 2 * j + 1] << T.cast(4, "uint32")), "uint8")
            T.copy(packed, codes[row, kb * H])
            scales[row, kb] = sf

    return per_token_cast_fp4_kernel


#: ``fake_quant_fp8``'s scale block: the model's KV rounding (``kernforge.model.quant``)
FAKE_FP8_BLOCK = 64
_ROUND_MAGIC = 2.0 ** 23  # float32 values at or above it are integers; adding it rounds half to even


def _frexp_ceil_pow2(amax, floor: float, qmax: float):
    """The model's block scale ``_pow2_ceil_scale(amax, qmax, floor)`` (``amax`` from
    :func:`_amax_nan_as_inf`): ``2^ceil(log2(max(amax, floor) / qmax))``, and 1 where the block
    holds NaN or infinity (``torch.frexp`` gives exponent 0 for them, so the model's scale is
    ``2^0``; NaN is read as infinity by the amax, so one comparison covers both)."""
    v = T.max(amax, T.float32(floor)) / T.float32(qmax)
    return T.where(amax == T.infinity("float32"), T.float32(1.0), ceil_pow2(v))


def _amax_nan_as_inf(xt, mag, amax, block: int, rows: int = 1):
    """``amax[i] = max |x|`` over row i's block with NaN counted as infinity (a reduction's NaN
    handling need not be the model's, and the scale rule treats both alike)."""
    for i, j in T.Parallel(rows, block):
        mag[i, j] = T.where(T.isnan(xt[i, j]), T.infinity("float32"), T.abs(xt[i, j]))
    T.reduce_max(mag, amax, dim=1)


def _check_rows(name: str, block_rows: int) -> None:
    """Why several rows a program: on the host backends a program runs as one loop iteration
    with its own bounds checks, amax reduction and scale, which at one 32- or 64-value block
    cost as much as the rounding itself; the rows of a program share them and vectorise
    together (the rows past the end read zeros and are not stored)."""
    if isinstance(block_rows, bool) or not isinstance(block_rows, int) or block_rows < 1:
        raise ValueError(f"{name}: block_rows must be a positive int, got {block_rows!r}")


def _round_e4m3(y):
    """``float32(e4m3(y))`` with torch's saturation (beyond +-448 gives +-448, NaN stays NaN),
    in float32 arithmetic: ``|y|`` clamped, then rounded on its e4m3 grid ``step =
    max(2^floor(log2 |y|), 2^-6) / 8`` (three mantissa bits; the subnormals' step below 2^-6)
    with ties to even (``(a + 2^23) - 2^23`` on ``a / step <= 16``: exact division by a power of
    two, one IEEE rounding), with y's sign bit.  Why not ``T.cast(y, "float8_e4m3")``: on the CPU
    that conversion is a branchy scalar function that keeps the loop from vectorising (5 ns a
    value at tiny's KV rows); this is a handful of vector instructions and the same bits."""
    u32 = "uint32"
    a = T.min(T.abs(y), T.float32(FP8_MAX))  # NaN stays NaN
    floor2 = T.reinterpret("float32", T.reinterpret(u32, a) & T.cast(0x7F800000, u32))
    step = T.max(floor2, T.float32(2.0 ** -6)) * T.float32(0.125)
    v = ((a / step + T.float32(_ROUND_MAGIC)) - T.float32(_ROUND_MAGIC)) * step
    return T.reinterpret("float32", (T.reinterpret(u32, v) & T.cast(0x7FFFFFFF, u32))
                         | (T.reinterpret(u32, y) & T.cast(0x80000000, u32)))


@T.tunable(block_rows=[1, 4, 16, 64], threads=[32, 64, 128])
def fake_quant_e4m3(dtype: str = "float32", block: int = FAKE_FP8_BLOCK, block_rows: int = 1, threads: int = 64):
    """``x [M, K]`` (``K % block == 0``) -> ``out [M, K]`` in x's dtype: the model's
    ``fake_quant_fp8`` (QAT rounding to e4m3 and back), bit for bit.

    Per block of ``block`` values: ``scale = 2^ceil(log2(max(amax, 1e-4) / 448))`` (1 for a
    block with NaN or infinity), ``out = e4m3(x / scale) * scale``.  e4m3 saturates as torch's
    conversion does (beyond +-448, infinity included, gives +-448; NaN stays NaN), which only
    the scale-1 blocks reach.  At bf16 the model rounds its floor, ``amax / 448`` and
    ``x / scale`` to bf16, which never changes a result, so the float32 steps here are its
    bits too: ``amax / 448`` (8 significant bits over 7 * 2^6) lies above a power of two by
    more than half a bf16 ulp or not at all (every finite bf16 amax is tested), the
    floor's scale is 2^-22 either way, and ``x / scale`` is exact down to the subnormals,
    which are e4m3 zeros.  The product ``e4m3 * scale`` is exact in both dtypes.

    A program takes ``block_rows`` rows' blocks (:func:`_check_rows`)."""
    _check_dtype("fake_quant_e4m3", dtype)
    if block < 1:
        raise ValueError(f"fake_quant_e4m3: block must be positive, got {block}")
    _check_rows("fake_quant_e4m3", block_rows)
    M = T.symbolic("M")
    K = T.symbolic("K")
    BR = block_rows

    @T.prim_func
    def fake_quant_e4m3_kernel(x: T.Tensor((M, K), dtype), out: T.Tensor((M, K), dtype)):
        with T.Kernel(T.ceildiv(M, BR), T.ceildiv(K, block), threads=threads) as (rb, kb):
            xt = T.alloc_fragment((BR, block), "float32")
            mag = T.alloc_fragment((BR, block), "float32")
            amax = T.alloc_fragment((BR,), "float32")
            sf = T.alloc_fragment((BR,), "float32")
            res = T.alloc_fragment((BR, block), dtype)
            T.copy(x[rb * BR, kb * block], xt)
            _amax_nan_as_inf(xt, mag, amax, block, BR)
            for i in T.Parallel(BR):
                sf[i] = _frexp_ceil_pow2(amax[i], FP8_AMAX_FLOOR, FP8_MAX)
            for i, j in T.Parallel(BR, block):
                res[i, j] = _round_e4m3(xt[i, j] / sf[i]) * sf[i]
            T.copy(res, out[rb * BR, kb * block])

    return fake_quant_e4m3_kernel


@T.tunable(block_rows=[1, 4, 16, 64], threads=[32, 64])
def fake_quant_e2m1(block: int = FP4_BLOCK, block_rows: int = 1, threads: int = 32):
    """``x [M, K]`` float32 (``K % block == 0``) -> ``out [M, K]``: the model's
    ``fake_quant_fp4`` (QAT rounding to e2m1 and back), bit for bit.

    Per block: ``scale = 2^ceil(log2(max(amax, 6 * 2^-126) / 6))`` (1 for a block with NaN
    or infinity); each magnitude ``a = |x| / scale`` is rounded as the model's
    ``_round_e2m1_magnitude`` writes it, on a grid of ``step = clamp(2^floor(log2 a) / 2,
    0.5, 2)`` with ties to even (``(y + 2^23) - 2^23``: one IEEE rounding, exact below
    ``2^23``, where every larger float is an integer already), then times ``scale`` with
    x's sign bit.  The formula is the model's, not a table of the eight codes, so the
    scale-1 blocks (magnitudes beyond 6, infinity) round as there.  float32 only: the
    model's rounding refuses other dtypes.  A program takes ``block_rows`` rows' blocks
    (:func:`_check_rows`)."""
    if block < 1:
        raise ValueError(f"fake_quant_e2m1: block must be positive, got {block}")
    _check_rows("fake_quant_e2m1", block_rows)
    M = T.symbolic("M")
    K = T.symbolic("K")
    u32 = "uint32"
    BR = block_rows

    @T.prim_func
    def fake_quant_e2m1_kernel(x: T.Tensor((M, K), "float32"), out: T.Tensor((M, K), "float32")):
        with T.Kernel(T.ceildiv(M, BR), T.ceildiv(K, block), threads=threads) as (rb, kb):
            xt = T.alloc_fragment((BR, block), "float32")
            mag = T.alloc_fragment((BR, block), "float32")
            amax = T.alloc_fragment((BR,), "float32")
            sf = T.alloc_fragment((BR,), "float32")
            T.copy(x[rb * BR, kb * block], xt)
            _amax_nan_as_inf(xt, mag, amax, block, BR)
            for i in T.Parallel(BR):
                sf[i] = _frexp_ceil_pow2(amax[i], FP4_AMAX_FLOOR, FP4_MAX)
            for i, j in T.Parallel(BR, block):
                a = T.abs(xt[i, j]) / sf[i]
                # the largest power of two <= a (0 below the normals; infinity for NaN/inf,
                # which the clamp turns into step 2 as the model's does)
                floor2 = T.reinterpret("float32", T.reinterpret(u32, a) & T.cast(0x7F800000, u32))
                step = T.min(T.max(floor2 * T.float32(0.5), T.float32(0.5)), T.float32(2.0))
                y = a / step
                r = T.where(y < T.float32(_ROUND_MAGIC), (y + T.float32(_ROUND_MAGIC)) - T.float32(_ROUND_MAGIC), y)
                v = r * step * sf[i]
                mag[i, j] = T.reinterpret("float32", (T.reinterpret(u32, v) & T.cast(0x7FFFFFFF, u32))
                                          | (T.reinterpret(u32, xt[i, j]) & T.cast(0x80000000, u32)))
            T.copy(mag, out[rb * BR, kb * block])

    return fake_quant_e2m1_kernel
