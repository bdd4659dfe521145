"""Host-side (torch) grouped GEMM code: float64 references, and DeepGEMM's FP8 casting recipes
(shared with the dense family, which defines them: :mod:`kernforge.kernels.gemm.reference`)."""
from __future__ import annotations

import torch

from kernforge.kernels.gemm.reference import dequantize, per_block_cast_to_fp8, per_token_cast_to_fp8

__all__ = ["dequantize", "per_block_cast_to_fp8", "per_token_cast_to_fp8", "reference", "reference_masked"]


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
