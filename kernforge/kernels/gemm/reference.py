"""Host-side (torch) code for the dense block-scaled GEMMs: DeepGEMM's casting recipes and
layout helpers (FP4, UE8M0, MN-major TMA-aligned scales), float64 references, ``calc_diff``.

The FP8 casts are shared with the grouped GEMM family (which imports them from here);
FP4 values follow :mod:`kernforge.model.quant` (e2m1, two codes per int8, low nibble first).
"""
from __future__ import annotations

import torch

from kernforge.model.quant import FP4_VALUES, round_e2m1, unpack_fp4

__all__ = ["calc_diff", "ceil_to_ue8m0", "dequantize", "dequantize_fp4", "get_mn_major_tma_aligned_tensor",
           "get_tma_aligned_size", "pack_fp4", "pack_ue8m0_to_int", "per_block_cast_to_fp8",
           "per_token_cast_to_fp4", "per_token_cast_to_fp8", "reference", "unpack_ue8m0_from_int"]

_MAGNITUDES = torch.tensor(FP4_VALUES[:8])


def _scale(amax: torch.Tensor, use_ue8m0: bool) -> torch.Tensor:
    sf = amax.clamp(min=1e-4) / 448.0
    return ceil_to_ue8m0(sf) if use_ue8m0 else sf


def per_token_cast_to_fp8(x: torch.Tensor, use_ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepGEMM's activation recipe: one float32 scale per 1x128 slice of a row
    (``amax / 448``, rounded up to a power of two with ``use_ue8m0``); data = x / scale."""
    k = x.shape[-1]
    kb = -(-k // 128)
    v = torch.nn.functional.pad(x.float(), (0, kb * 128 - k)).view(*x.shape[:-1], kb, 128)
    sf = _scale(v.abs().amax(-1), use_ue8m0)
    data = (v / sf[..., None]).view(*x.shape[:-1], kb * 128)[..., :k]
    return data.to(torch.float8_e4m3fn).contiguous(), sf.float().contiguous()


def per_block_cast_to_fp8(x: torch.Tensor, use_ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepGEMM's weight recipe: one float32 scale per 128x128 block of ``[..., N, K]``."""
    n, k = x.shape[-2:]
    nb, kb = -(-n // 128), -(-k // 128)
    v = torch.nn.functional.pad(x.float(), (0, kb * 128 - k, 0, nb * 128 - n))
    v = v.view(*x.shape[:-2], nb, 128, kb, 128)
    sf = _scale(v.abs().amax(dim=(-3, -1)), use_ue8m0)
    data = (v / sf[..., :, None, :, None]).view(*x.shape[:-2], nb * 128, kb * 128)[..., :n, :k]
    return data.to(torch.float8_e4m3fn).contiguous(), sf.float().contiguous()


def dequantize(data: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """float64 ``data * scale`` with one scale per ``block`` (rows, cols) of the last two dims."""
    s = scale.double()
    s = s.repeat_interleave(block[0], dim=-2)[..., :data.shape[-2], :]
    s = s.repeat_interleave(block[1], dim=-1)[..., :data.shape[-1]]
    return data.double() * s


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """DeepGEMM's test metric, ``1 - 2 sum(xy) / sum(x^2 + y^2)`` in float64: 0 for equal
    tensors, scale-free; its tests accept 0.001 (FP8), 0.01 (one FP4 side), 0.02 (both)."""
    x, y = x.double(), y.double()
    denominator = (x * x + y * y).sum()
    if denominator == 0:
        return 0.0
    return float(1 - 2 * (x * y).sum() / denominator)


def reference(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None = None) -> torch.Tensor:
    """float64 ``c + a @ b^T`` for dequantized ``a [M, K]``, ``b [N, K]``."""
    d = a.double() @ b.double().T
    return d if c is None else d + c.double()


def ceil_to_ue8m0(x: torch.Tensor) -> torch.Tensor:
    """DeepGEMM's ``ceil_to_ue8m0``: the smallest power of two >= ``x`` (``x > 0``)."""
    return torch.exp2(torch.ceil(torch.log2(x.abs().float())))


def per_token_cast_to_fp4(x: torch.Tensor, use_ue8m0: bool = False,
                          gran_k: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """One float32 scale per ``1 x gran_k`` slice (``amax / 6``, a power of two with
    ``use_ue8m0``), codes = e2m1 round of ``x / scale`` packed two per int8 along K.
    K must be a multiple of ``gran_k``."""
    k = x.shape[-1]
    if k % gran_k:
        raise ValueError(f"K ({k}) must be a multiple of the FP4 scale width {gran_k}")
    v = x.float().unflatten(-1, (k // gran_k, gran_k))
    sf = v.abs().amax(-1).clamp(min=1e-4) / 6.0
    if use_ue8m0:
        sf = ceil_to_ue8m0(sf)
    values = round_e2m1((v / sf[..., None]).clamp(-6.0, 6.0)).flatten(-2)
    return pack_fp4(values), sf.contiguous()


def pack_fp4(values: torch.Tensor) -> torch.Tensor:
    """e2m1 values (already on the grid) -> int8 codes, element ``2i`` in the low nibble."""
    if values.shape[-1] % 2:
        raise ValueError("FP4 packing needs an even last dimension")
    mag = torch.searchsorted(_MAGNITUDES.to(values.device), values.abs().contiguous())
    codes = (mag | (torch.signbit(values).to(torch.int64) << 3)).to(torch.uint8)
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).view(torch.int8).contiguous()


def dequantize_fp4(packed: torch.Tensor, sf: torch.Tensor, gran_k: int = 32) -> torch.Tensor:
    """float64 ``fp4(packed) * sf`` with one scale per ``1 x gran_k``."""
    values = unpack_fp4(packed.reshape(-1, packed.shape[-1])).reshape(*packed.shape[:-1], -1)
    return values.double() * sf.double().repeat_interleave(gran_k, dim=-1)[..., :values.shape[-1]]


def get_tma_aligned_size(x: int, element_size: int) -> int:
    """DeepGEMM's ``align(x, 16 / element_size)``: a TMA row is a multiple of 16 bytes."""
    step = 16 // element_size
    return -(-x // step) * step


def get_mn_major_tma_aligned_tensor(sf: torch.Tensor) -> torch.Tensor:
    """``sf [..., MN, k]`` in DeepGEMM's required layout: same values, ``stride(-2) == 1``,
    ``stride(-1) == align(MN, 4)`` (and ``stride(-3) == stride(-1) * k`` for a batch)."""
    mn, k = sf.shape[-2:]
    ld = get_tma_aligned_size(mn, sf.element_size())
    out = torch.empty(*sf.shape[:-2], k, ld, dtype=sf.dtype, device=sf.device)
    out[..., :mn] = sf.transpose(-1, -2)
    return out.transpose(-1, -2)[..., :mn, :]


def pack_ue8m0_to_int(sf: torch.Tensor) -> torch.Tensor:
    """Powers of two ``[..., k]`` -> int32 ``[..., ceil(k/4)]``: byte ``j`` of word ``p`` is
    the exponent byte of scale ``4p + j`` (DeepGEMM's SM100 form).  Rejects other values,
    where DeepGEMM's device-side cast would assert."""
    bits = sf.float().contiguous().view(torch.int32)
    exps = (bits >> 23) & 0xFF
    if (bits & 0x807FFFFF).any() or (exps == 0).any() or (exps == 255).any():
        raise ValueError("UE8M0 packing needs positive normal powers of two, 2^-126..2^127 "
                         "(quantize with use_ue8m0=True)")
    k = sf.shape[-1]
    exps = torch.nn.functional.pad(exps, (0, (-k) % 4), value=127)
    exps = exps.unflatten(-1, (-1, 4))
    word = exps[..., 0] | (exps[..., 1] << 8) | (exps[..., 2] << 16) | (exps[..., 3] << 24)
    return word.to(torch.int32).contiguous()


def unpack_ue8m0_from_int(packed: torch.Tensor, k: int) -> torch.Tensor:
    """Inverse of :func:`pack_ue8m0_to_int`: float32 ``[..., k]`` powers of two (exact), each byte
    ``e`` read as the tensor cores read UE8M0 -- ``2^(e - 127)``, so 0 is ``2^-127`` (a float32
    subnormal, not 0.0) and 255 is NaN (not +inf) -- so that host backends and the CUDA kernels
    (``fp8_gemm(sf_format="ue8m0")``, block-scaled ``tcgen05.mma``) give one result."""
    words = packed.to(torch.int64) & 0xFFFFFFFF
    exps = torch.stack([(words >> (8 * j)) & 0xFF for j in range(4)], dim=-1).flatten(-2)[..., :k]
    bits = torch.where(exps == 0, 0x00400000, torch.where(exps == 255, 0x7FC00000, exps << 23))
    return bits.to(torch.int32).view(torch.float32).contiguous()
