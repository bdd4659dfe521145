"""FP8 KV pages (FlashMLA's V4 "MODEL1" layout, `kernforge.engine.cache.Fp8KVLayout`), written
once in the tile DSL: :func:`fp8_kv_quantize` packs KV rows, :func:`fp8_kv_dequantize` unpacks
whole pages into the bf16 pages the attention kernel reads.

A row of ``nope + rope`` values becomes ``nope`` e4m3 bytes, ``rope`` bf16 values as
little-endian byte pairs, and ``scale_bytes`` E8M0 bytes (one per 64 nope values, then
zeros up to a multiple of 8).  A 64-block's scale is the model's QAT rule
``2^ceil(log2(max(amax, 1e-4) / 448))``, its byte the exponent + 127.

Why integer operations for the scale and the bytes: the power-of-two ceiling clears the
mantissa and steps the exponent (`kernforge.kernels.quant.kernel.ceil_pow2`, exact on every
backend, where ``exp2(ceil(log2))`` can be an ulp off), the E8M0 byte is the float's
exponent field, and decoding builds ``2^(e - 127)`` from bits (``e = 0`` is the subnormal
``2^-127``, ``e = 255`` infinity, as ``torch.ldexp`` gives).  A non-finite block maximum
(NaN or infinity in the block) gets exponent 0 (scale 1, byte 127): what the torch
functions' ``frexp`` returns for it on the CPU, so even such rows agree byte for byte.
"""
from __future__ import annotations

import kernforge.dsl as T
from kernforge.kernels.quant.kernel import FP8_AMAX_FLOOR, FP8_MAX, ceil_pow2

BLOCK = 64  # nope values per E8M0 scale
DTYPES = ("float32", "bfloat16")


def scale_bytes(nope: int) -> int:
    """E8M0 bytes per token: one per 64 nope values, zero-padded to a multiple of 8."""
    return -(-(nope // BLOCK) // 8) * 8


def _check(name: str, nope: int, rope: int) -> None:
    for arg, v in (("nope", nope), ("rope", rope)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{name}: {arg} must be a non-negative int, got {v!r}")
    if nope <= 0 or nope % BLOCK:
        raise ValueError(f"{name}: nope must be a positive multiple of {BLOCK}, got {nope}")


def _u32(v: int):
    return T.cast(v, "uint32")


def to_e4m3_byte(v):
    """The e4m3 byte of float32 ``v`` as torch's ``.to(torch.float8_e4m3fn)`` writes it:
    round to nearest even, infinities saturate to +-448 (bytes 0x7E / 0xFE), NaN stays NaN
    (`T.max`/`T.min` propagate it)."""
    clamped = T.min(T.max(v, T.float32(-FP8_MAX)), T.float32(FP8_MAX))
    return T.reinterpret("uint8", T.cast(clamped, "float8_e4m3"))


def to_bf16_bits(v):
    """The bf16 bits (uint32) of float32 ``v`` as torch's CPU ``.to(torch.bfloat16)`` writes
    them: round to nearest even, every NaN 0xFFFF.  Spelled out so the NaN bytes are the
    same on every backend (a backend's own conversion may give the quiet NaN 0x7FC0)."""
    bits = T.cast(T.reinterpret("uint16", T.cast(v, "bfloat16")), "uint32")
    return T.where(T.isnan(v), _u32(0xFFFF), bits)


@T.tunable(threads=[64, 128, 256])
def fp8_kv_quantize(nope: int, rope: int, dtype: str = "float32", threads: int = 128):
    """``values [N, nope + rope]`` -> ``data uint8 [N, nope + 2 rope]``, ``scales uint8 [N,
    scale_bytes(nope)]``; one block per row, ``N`` symbolic."""
    _check("fp8_kv_quantize", nope, rope)
    if dtype not in DTYPES:
        raise ValueError(f"fp8_kv_quantize: dtype must be one of {DTYPES}, got {dtype!r}")
    N = T.symbolic("N")
    NB, SB, TB = nope // BLOCK, scale_bytes(nope), nope + 2 * rope

    @T.prim_func
    def fp8_kv_quantize_kernel(values: T.Tensor((N, nope + rope), dtype), data: T.Tensor((N, TB), "uint8"),
                               scales: T.Tensor((N, SB), "uint8")):
        with T.Kernel(N, threads=threads) as row:
            x = T.alloc_fragment((NB, BLOCK), "float32")
            mag = T.alloc_fragment((NB, BLOCK), "float32")
            amax = T.alloc_fragment((NB,), "float32")
            sf = T.alloc_fragment((NB,), "float32")
            for b, j in T.Parallel(NB, BLOCK):
                x[b, j] = T.cast(values[row, b * BLOCK + j], "float32")
                mag[b, j] = T.abs(x[b, j])
            T.reduce_max(mag, amax, dim=1)
            for b in T.Parallel(NB):
                s = ceil_pow2(T.max(amax[b], T.float32(FP8_AMAX_FLOOR)) / T.float32(FP8_MAX))
                finite = ~(T.isnan(s) | (s == T.infinity("float32")))
                sf[b] = T.where(finite, s, T.float32(1.0))
                scales[row, b] = T.cast((T.reinterpret("uint32", sf[b]) >> _u32(23)) & _u32(0xFF), "uint8")
            for b, j in T.Parallel(NB, BLOCK):
                data[row, b * BLOCK + j] = to_e4m3_byte(x[b, j] / sf[b])
            if rope > 0:
                for j in T.Parallel(rope):
                    bits = to_bf16_bits(T.cast(values[row, nope + j], "float32"))
                    data[row, nope + 2 * j] = T.cast(bits & _u32(0xFF), "uint8")
                    data[row, nope + 2 * j + 1] = T.cast(bits >> _u32(8), "uint8")
            if SB > NB:
                for j in T.Parallel(SB - NB):
                    scales[row, NB + j] = T.cast(0, "uint8")

    return fp8_kv_quantize_kernel


@T.tunable(block_tokens=[1, 4, 16, 64], threads=[64, 128, 256])
def fp8_kv_dequantize(nope: int, rope: int, block_size: int = 64, block_tokens: int = 16, threads: int = 128):
    """``pages uint8 [NB, block_size * (nope + 2 rope + scale_bytes)]`` -> ``out bfloat16
    [NB, block_size, nope + rope]``; a block decodes ``block_tokens`` tokens of one page."""
    _check("fp8_kv_dequantize", nope, rope)
    for arg, v in (("block_size", block_size), ("block_tokens", block_tokens)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"fp8_kv_dequantize: {arg} must be a positive int, got {v!r}")
    P = T.symbolic("P")
    SB, TB, BT = scale_bytes(nope), nope + 2 * rope, block_tokens
    page = block_size * (TB + SB)

    @T.prim_func
    def fp8_kv_dequantize_kernel(pages: T.Tensor((P, page), "uint8"),
                                 out: T.Tensor((P, block_size, nope + rope), "bfloat16")):
        with T.Kernel(T.ceildiv(block_size, BT), P, threads=threads) as (bt, p):
            for t, c in T.Parallel(BT, nope):
                tok = bt * BT + t
                if tok < block_size:
                    e = T.cast(pages[p, block_size * TB + tok * SB + c // BLOCK], "uint32")
                    scale = T.reinterpret("float32", T.where(e == _u32(0), _u32(0x00400000), e << _u32(23)))
                    code = T.cast(T.reinterpret("float8_e4m3", pages[p, tok * TB + c]), "float32")
                    out[p, tok, c] = T.reinterpret("bfloat16", T.cast(to_bf16_bits(code * scale), "uint16"))
            if rope > 0:
                for t, j in T.Parallel(BT, rope):
                    tok = bt * BT + t
                    if tok < block_size:
                        lo = T.cast(pages[p, tok * TB + nope + 2 * j], "uint16")
                        hi = T.cast(pages[p, tok * TB + nope + 2 * j + 1], "uint16")
                        out[p, tok, nope + j] = T.reinterpret("bfloat16", lo | (hi << T.cast(8, "uint16")))

    return fp8_kv_dequantize_kernel
