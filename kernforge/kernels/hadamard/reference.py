"""Float64 Hadamard transform as a matrix product with the Sylvester matrix (independent of the
butterflies of the kernel and of the model)."""
from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=8)
def sylvester(n: int) -> torch.Tensor:
    """``H_n`` (float64, entries +-1) with ``H_1 = [1]``, ``H_2k = [[H, H], [H, -H]]``."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def reference(x: torch.Tensor) -> torch.Tensor:
    """``x @ H_n / sqrt(n)`` over the last dim (``H_n`` is symmetric), float64."""
    n = x.shape[-1]
    return (x.double() @ sylvester(n)) / n ** 0.5
