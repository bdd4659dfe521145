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
