"""Low-precision formats of V4: weight dequantization and QAT fake quantization (spec §2.2, §3).

Weights: FP8 e4m3 values with one E8M0 (power-of-two) scale per 128x128 tile,
and FP4 e2m1 routed experts packed two per byte with one E8M0 scale per 32
inputs. Activations: the model simulates the FP8/FP4 storage it was trained
for by rounding KV vectors (FP8, blocks of 64) and indexer q/k (FP4, blocks of
32) to the format and back, with power-of-two block scales.

Every step is exact arithmetic or a single IEEE rounding, so the results do
not depend on batch layout (see numerics.py).
"""

from __future__ import annotations

import torch

from kernforge.model.numerics import pow2

FP8_MAX = 448.0
FP4_MAX = 6.0
FP4_BLOCK = 32
# e2m1 code -> value for the 16 nibble codes (bit 3 is the sign).
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def e8m0_to_float(scale: torch.Tensor) -> torch.Tensor:
    """E8M0 scales (float8_e8m0fnu or raw uint8 bytes) as float32: byte e means 2**(e-127)."""
    if scale.dtype == torch.uint8:
        scale = scale.view(torch.float8_e8m0fnu)
    if scale.dtype != torch.float8_e8m0fnu:
        raise TypeError(f"E8M0 scale must be float8_e8m0fnu or uint8, got {scale.dtype}")
    return scale.float()


def dequantize_fp8(weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] = (128, 128)) -> torch.Tensor:
    """W[i, j] = q[i, j] * s[i // 128, j // 128] for an e4m3 weight [out, in]."""
    if weight.dtype != torch.float8_e4m3fn:
        raise TypeError(f"FP8 weight must be float8_e4m3fn, got {weight.dtype}")
    out_f, in_f = weight.shape
    bo, bi = block
    expect = (-(-out_f // bo), -(-in_f // bi))
    if tuple(scale.shape) != expect:
        raise ValueError(f"FP8 scale shape {tuple(scale.shape)} != {expect} for weight {tuple(weight.shape)}")
    s = e8m0_to_float(scale).repeat_interleave(bo, 0)[:out_f].repeat_interleave(bi, 1)[:, :in_f]
    return weight.float() * s


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """int8 [out, in/2] -> float32 [out, in]; low nibble = even column, high nibble = odd column."""
    if packed.dtype not in (torch.int8, torch.uint8):
        raise TypeError(f"packed FP4 weight must be int8/uint8, got {packed.dtype}")
    b = packed.view(torch.uint8).to(torch.int64)
    table = torch.tensor(FP4_VALUES, dtype=torch.float32)
    codes = torch.stack([b & 0xF, b >> 4], dim=-1).flatten(-2)
    return table[codes]


def dequantize_fp4(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """W[i, j] = fp4(q[i, j]) * s[i, j // 32]."""
    values = unpack_fp4(packed)
    expect = (values.shape[0], values.shape[1] // FP4_BLOCK)
    if tuple(scale.shape) != expect:
        raise ValueError(f"FP4 scale shape {tuple(scale.shape)} != {expect} for weight {tuple(values.shape)}")
    return values * e8m0_to_float(scale).repeat_interleave(FP4_BLOCK, 1)


def _pow2_ceil_scale(amax: torch.Tensor, qmax: float, floor: float) -> torch.Tensor:
    """2**ceil(log2(max(amax, floor) / qmax)), computed exactly with frexp."""
    v = amax.clamp(min=floor) / qmax
    m, e = torch.frexp(v)  # v = m * 2**e, m in [0.5, 1)
    k = torch.where(m == 0.5, e - 1, e)
    return pow2(k.double()).to(v.dtype)  # exact, unlike a pow() call


def _blocked(x: torch.Tensor, block: int) -> torch.Tensor:
    if x.shape[-1] % block:
        raise ValueError(f"last dim {x.shape[-1]} is not a multiple of the quant block {block}")
    return x.unflatten(-1, (-1, block))


def fake_quant_fp8(x: torch.Tensor, block: int = 64) -> torch.Tensor:
    """Round to e4m3 with one power-of-two scale per `block` values, and back."""
    xb = _blocked(x, block)
    scale = _pow2_ceil_scale(xb.abs().amax(-1, keepdim=True), FP8_MAX, 1e-4)
    q = (xb / scale).to(torch.float8_e4m3fn).to(x.dtype)
    return (q * scale).flatten(-2)


def round_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Round |x| <= 6 to the e2m1 grid {0, .5, 1, 1.5, 2, 3, 4, 6}, ties to even codes.

    The grid spacing is 0.5 below 2, 1 below 4 and 2 above: half the largest
    power of two <= |x|, clamped to [0.5, 2]. torch.round rounds halves to
    even, which matches the even mantissa code at every tie. The spacing comes
    from the exponent bits, not from comparisons and torch.where (which is
    ~10x slower than arithmetic per element on the CPU).
    """
    return torch.copysign(_round_e2m1_magnitude(x.abs()), x)


def _round_e2m1_magnitude(a: torch.Tensor) -> torch.Tensor:
    """round_e2m1 for a >= 0."""
    step = (_pow2_floor(a) * 0.5).clamp_(0.5, 2.0)
    return torch.round(a / step).mul_(step)


_EXPONENT_BITS = {torch.float32: (torch.int32, 0x7F800000), torch.float64: (torch.int64, 0x7FF0000000000000)}


def _pow2_floor(a: torch.Tensor) -> torch.Tensor:
    """Largest power of two <= a for a >= 0 (0 for zero and subnormals): a with its mantissa bits cleared."""
    if a.dtype not in _EXPONENT_BITS:
        raise TypeError(f"FP4 rounding supports float32 and float64, got {a.dtype}")
    int_type, mask = _EXPONENT_BITS[a.dtype]
    return (a.view(int_type) & mask).view(a.dtype)


def fake_quant_fp4(x: torch.Tensor, block: int = FP4_BLOCK) -> torch.Tensor:
    """Round to e2m1 with one power-of-two scale per `block` values, and back."""
    xb = _blocked(x, block)
    magnitude = xb.abs()  # rounded as magnitudes, the sign put back once at the end
    scale = _pow2_ceil_scale(magnitude.amax(-1, keepdim=True), FP4_MAX, FP4_MAX * 2.0 ** -126)
    return torch.copysign(_round_e2m1_magnitude(magnitude / scale).mul_(scale), xb).flatten(-2)
