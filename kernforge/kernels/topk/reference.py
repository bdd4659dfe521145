"""Plain torch TopK with the kernel's semantics (independent of the radix select)."""
from __future__ import annotations

import torch

from kernforge.kernels.topk.kernel import NAN_ROW_MARKER


def ordered_keys(x: torch.Tensor) -> torch.Tensor:
    """int64 keys with the kernel's total order: float order, ``-0 < +0``, NaN largest."""
    if x.dtype == torch.bfloat16:
        raw = x.view(torch.int16).to(torch.int64) & 0xFFFF
        bits = 16
    else:
        raw = x.float().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
        bits = 32
    top = 1 << (bits - 1)
    keys = torch.where(raw >= top, ((1 << bits) - 1) - raw, raw + top)
    return torch.where(torch.isnan(x), torch.full_like(keys, (1 << bits) - 1), keys)


def reference(x: torch.Tensor, k: int, end=None, sorted_values: bool = False,
              offset=None, idx_fill: int = 2**31 - 1, val_fill: float = float("-inf"),
              index_dtype=torch.int64):
    """Plain torch top-k with the kernel's semantics, by a stable full sort (independent
    of the radix select): ``(values, indices, nan_rows)``.

    Winners are the ``min(end[i], k)`` largest keys, ties to the lowest index;
    unsorted output is in ascending index order.  NaN rows get the marker row."""
    b, n = x.shape
    values = torch.empty((b, k), dtype=x.dtype)
    indices = torch.empty((b, k), dtype=index_dtype)
    nan_rows = torch.zeros(b, dtype=torch.int32)
    fill = torch.tensor(val_fill, dtype=torch.float32).to(x.dtype)
    for r in range(b):
        length = n if end is None else int(end[r])
        keys = ordered_keys(x[r, :length].cpu())
        order = torch.sort(keys, descending=True, stable=True).indices[:k]
        if not sorted_values:
            order = torch.sort(order).values
        c = order.numel()
        values[r, :c] = x[r, order].cpu()
        values[r, c:] = fill
        off = 0 if offset is None else int(offset[r])
        indices[r, :c] = (order.to(torch.int64) + off).to(index_dtype)
        indices[r, c:] = idx_fill
        if bool(torch.isnan(x[r, :length]).any()):
            nan_rows[r] = 1
            indices[r] = NAN_ROW_MARKER
    return values, indices, nan_rows
