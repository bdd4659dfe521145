"""Torch references for the SwiGLU expert activation.

:func:`model_steps` replays :class:`kernforge.model.moe.Expert`'s in-place torch ops on a
fused ``[M, 2I]`` gate/up tensor (each step rounded to the input's dtype, as there);
:func:`float64` computes the same chain in float64, rounding to the input dtype exactly
where the model does, with a float64 ``exp`` (an independent oracle for the kernels'
float32 ``exp``)."""
from __future__ import annotations

from typing import Optional

import torch


def model_steps(x: torch.Tensor, weights: Optional[torch.Tensor], swiglu_limit: float) -> torch.Tensor:
    inter = x.shape[1] // 2
    gate, up = x[:, :inter].clone(), x[:, inter:].clone()
    if swiglu_limit > 0:
        up.clamp_(-swiglu_limit, swiglu_limit)
        gate.clamp_(max=swiglu_limit)
    h = torch.nn.functional.silu(gate).mul_(up)
    if weights is not None:
        h.mul_(weights.reshape(-1, 1))
    return h


def float64(x: torch.Tensor, weights: Optional[torch.Tensor], swiglu_limit: float) -> torch.Tensor:
    """float64 arithmetic; roundings to ``x.dtype`` after silu, the product and the weight
    (no-ops for float32 inputs beyond float32 rounding)."""
    dt = x.dtype
    inter = x.shape[1] // 2
    g, u = x[:, :inter].double(), x[:, inter:].double()
    if swiglu_limit > 0:
        lim = torch.tensor(swiglu_limit, dtype=torch.float32).double()
        u = torch.minimum(torch.maximum(u, -lim), lim)
        g = torch.minimum(g, lim)
    h = (g / (1.0 + torch.exp(-g))).to(dt).double()
    h = (h * u).to(dt).double()
    if weights is not None:
        h = (h * weights.double().reshape(-1, 1)).to(dt).double()
    return h
