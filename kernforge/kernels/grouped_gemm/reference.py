"""Host-side (torch) grouped GEMM code: float64 references and DeepGEMM's FP8 casting recipes."""
from __future__ import annotations

import torch


def reference(a: torch.Tensor, b: torch.Tensor, m_indices: torch.Tensor) -> torch.Tensor:
    """``D[r] = A[r] @ B[m_indices[r]]^T`` in float64; padding rows (``-1``) are 0."""
    d = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float64, device=a.device)
    idx = m_indices.long()
    for g in idx[idx >= 0].unique().tolist():
        rows = idx == g
        d[rows] = a[rows].double() @ b[g].double().T
    return d


def reference_masked(a: torch.Tensor, b: torch.Tensor, masked_m: torch.Tensor) -> torch.Tensor:
    """float64 ``D[g, :masked_m[g]]``; rows past ``masked_m[g]`` are NaN (not defined)."""
    d = torch.full((a.shape[0], a.shape[1], b.shape[1]), float("nan"), dtype=torch.float64,
                   device=a.device)
    for g, rows in enumerate(masked_m.tolist()):
        d[g, :rows] = a[g, :rows].double() @ b[g].double().T
    return d


def _scale(amax: torch.Tensor, use_ue8m0: bool) -> torch.Tensor:
    sf = amax.clamp(min=1e-4) / 448.0
    return torch.exp2(torch.ceil(torch.log2(sf))) if use_ue8m0 else sf


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
