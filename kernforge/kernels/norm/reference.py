"""Float64 RMSNorm, written from the definition (independent of the kernel and of the model's torch code)."""
from __future__ import annotations

from typing import Optional

import torch


def reference(x: torch.Tensor, weight: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last dim, in float64."""
    xd = x.double()
    y = xd / torch.sqrt(xd.pow(2).mean(-1, keepdim=True) + eps)
    return y if weight is None else y * weight.double()
