"""``kernforge.ops.topk``: DeepSelect's ``topk()`` API and semantics on every backend.

Differences from DeepSelect, all in the direction of doing more:

* any row stride and any vocab size (no 1024-byte row padding; tails handled
  by the kernel), and only the logical ``(b, topk)`` output elements are written;
* the tie policy is defined: among elements equal to the k-th value the lowest
  indices win (bit order of the values, so ``-0.0`` ranks below ``+0.0``);
  unsorted results come out in ascending index order, on every backend;
* the NaN check always runs, short rows included, in the same pass over the
  data: by default :class:`TopKNaNError` names the first NaN row (after the
  kernel ran, as Ascend does); with ``abort_when_nan_found=False`` the whole index
  row of every NaN row is ``0x3F3F3F3F``;
* validation raises before any work, with exception classes that are the union
  of DeepSelect's branches (e.g. a bad ``topk`` is both ``ValueError`` and
  ``RuntimeError``), and ``end`` is checked to lie in ``[0, vocab]``.
"""
from __future__ import annotations

import functools
from typing import Optional

import numpy as np
import torch

from kernforge.ops._capture import capturing

import kernforge
from kernforge import backends
from kernforge.kernels import topk as kernels
from kernforge.kernels.topk import config
from kernforge.tune import consult

INT32_MAX = 2**31 - 1
_INDEX_TYPES = (torch.int32, torch.int64)


class TopKValueError(ValueError, RuntimeError):
    """An argument with a bad value or shape (DeepSelect raises ValueError in Python
    and RuntimeError natively for these; this is both)."""


class TopKTypeError(TypeError, RuntimeError):
    """An argument with the wrong dtype (TypeError in Python, RuntimeError natively)."""


class TopKUnsupportedError(TopKValueError, AssertionError):
    """``begin`` / ``hint``: reserved by DeepSelect and not supported (main asserts)."""


class TopKNaNError(RuntimeError):
    """The input holds a NaN inside a row's ``[0, end)`` and ``abort_when_nan_found`` is set."""

    def __init__(self, rows: list[int]):
        self.rows = rows
        more = f" (and {len(rows) - 1} more rows)" if len(rows) > 1 else ""
        super().__init__(f"[topk_select] NaN detected at batch index {rows[0]}{more}")


@functools.lru_cache(maxsize=1)
def get_stride_requirement() -> tuple[int, int]:
    """``(input_row_stride_bytes, output_row_stride_bytes)`` the fastest path prefers.

    Nothing is *required*: any stride works.  Rows starting on a 64-byte cache line
    let the CPU backend's loads stay within lines; 32-byte output rows match
    DeepSelect's default allocation."""
    return (64, 32)


def topk(input: torch.Tensor, topk: int, sorted: bool = False, begin=None, end=None,
         indices_type=torch.int64, sorted_index: bool = False, hint=None,
         output_idx: Optional[torch.Tensor] = None, output_idx_offset: Optional[torch.Tensor] = None,
         idx_oob_fill_value: int = INT32_MAX, value_oob_fill_value: float = float("-inf"),
         return_value: bool = True, abort_when_nan_found: bool = True,
         backend: Optional[str] = None):
    """Top-``topk`` values and indices of every row of ``input`` (``(b, vocab)``,
    bfloat16 or float32), DeepSelect-compatible; returns ``(values or None, indices)``.

    ``backend``: ``None`` picks by ``input.device`` (cpu / cuda), or one of
    ``"interp"``, ``"cpu"``, ``"cuda"``, ``"ascend"``."""
    _check_scalars(topk, begin, hint, sorted, sorted_index, return_value, indices_type,
                   idx_oob_fill_value, value_oob_fill_value)
    _check_input(input, sorted)
    b, vocab = input.shape
    _check_row_tensor(end, "end", b, input)
    _check_row_tensor(output_idx_offset, "output_idx_offset", b, input)
    if output_idx is not None:
        _check_output_idx(output_idx, indices_type, b, topk, input)
    if end is not None and b > 0 and not capturing(input):
        bad = ((end < 0) | (end > vocab)).nonzero()
        if bad.numel():
            r = int(bad[0, 0])
            raise TopKValueError(f"end[{r}] = {int(end[r])} must be in [0, vocab_size={vocab}]")
    name = backends.for_tensor(input, backend)

    idx = output_idx if output_idx is not None else _padded_empty(b, topk, indices_type, input.device)
    values = _padded_empty(b, topk, input.dtype, input.device) if return_value else None
    if b == 0:
        return values, idx
    kernel = _compiled(name, topk, _DTYPE_NAME[input.dtype], _DTYPE_NAME[indices_type],
                       bool(sorted), bool(return_value), config.row_bucket(vocab), consult.stamp())
    if end is None:
        end = torch.full((b,), vocab, dtype=torch.int32, device=input.device)
    if output_idx_offset is None:
        output_idx_offset = torch.zeros(b, dtype=torch.int32, device=input.device)
    nan_rows = torch.empty(b, dtype=torch.int32, device=input.device)
    out_val = values if values is not None else torch.empty((1, 1), dtype=input.dtype,
                                                            device=input.device)
    kernel(input, end, output_idx_offset, int(idx_oob_fill_value),
           _as_float32(value_oob_fill_value), nan_rows, idx, out_val, *kernels.bit_tables(input.device))
    if abort_when_nan_found and not capturing(input):
        rows = nan_rows.nonzero()
        if rows.numel():
            raise TopKNaNError(rows[:, 0].tolist())
    return values, idx


# ---------------------------------------------------------------- configuration

_DTYPE_NAME = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.int32: "int32",
               torch.int64: "int64"}
#: the kernel parameters this op uses for one call (shared with the benchmarks and tests):
#: the family's configuration chooser, ``kernel_params(backend, k, dtype, index_dtype,
#: sorted_values, return_value)``
kernel_params = config.choose


@functools.lru_cache(maxsize=None)
def _compiled(backend: str, k: int, dtype: str, index_dtype: str, sorted_values: bool,
              return_value: bool, row, stamp: tuple):
    """The kernel for one call signature, the chooser asked once per signature and
    ``stamp`` (:func:`kernforge.tune.consult.stamp`: a sweep recorded in this process, or
    ``KERNFORGE_TUNE``/``KERNFORGE_TUNE_DB`` changed, gives a new one), so a hot call
    skips the chooser and still follows the tuning database.  ``row`` is the row-length
    bucket (:func:`~kernforge.kernels.topk.config.row_bucket`): short rows get their own
    configuration on a CPU."""
    params = config.choose(backend, k, dtype, index_dtype, sorted_values, return_value, row=row)
    return kernforge.compile(kernels.topk_select, backend=backend, **params)


# ---------------------------------------------------------------- validation


def _check_scalars(k, begin, hint, sorted_values, sorted_index, return_value, indices_type,
                   idx_fill, val_fill) -> None:
    if isinstance(k, bool) or not isinstance(k, int):
        raise TopKTypeError(f"`topk` (k) must be an int, got {type(k).__name__} {k!r}")
    if not 1 <= k <= kernels.MAX_TOPK:
        raise TopKValueError(f"topk must be between 1 and {kernels.MAX_TOPK}, got {k!r}")
    if begin is not None:
        raise TopKUnsupportedError("`begin` is not supported now: it must be None")
    if hint is not None:
        raise TopKUnsupportedError("`hint` is not supported now: it must be None")
    if sorted_values and not return_value:
        raise TopKValueError("`sorted=True` needs `return_value=True`: values are sorted, so "
                             "they must be returned")
    if sorted_values and sorted_index:
        raise TopKValueError("`sorted=True` and `sorted_index=True` cannot be used at the same time")
    if indices_type not in _INDEX_TYPES:
        raise TopKTypeError(f"indices_type must be torch.int32 or torch.int64, got {indices_type}")
    if isinstance(idx_fill, bool) or not isinstance(idx_fill, int) or not -2**31 <= idx_fill < 2**31:
        raise TopKValueError(f"idx_oob_fill_value must be an int32, got {idx_fill!r}")
    if isinstance(val_fill, bool) or not isinstance(val_fill, (int, float)):
        raise TopKValueError(f"value_oob_fill_value must be a float, got {val_fill!r}")


def _check_input(x, sorted_values) -> None:
    if not isinstance(x, torch.Tensor):
        raise TopKTypeError(f"input must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise TopKValueError(f"input must be 2-D (batch, vocab_size), got shape {tuple(x.shape)}")
    if x.dtype not in (torch.bfloat16, torch.float32):
        raise TopKTypeError(f"input dtype must be bfloat16 or float32, got {x.dtype}")
    if sorted_values and x.dtype != torch.float32:
        raise TopKTypeError(f"`sorted=True` is only supported for float32 input, got {x.dtype} "
                            "(sort the returned values yourself, or pass a float32 input)")
    if x.shape[1] >= kernels.MAX_VOCAB:
        raise TopKValueError(f"vocab_size must be < 2^23 for {_DTYPE_NAME[x.dtype]} input, "
                             f"got {x.shape[1]}")
    if x.shape[0] > 2**32 - 1:
        raise TopKValueError("batch size exceeds uint32 capacity")
    if x.shape[1] > 1 and x.stride(1) != 1:
        raise TopKValueError(f"input's last dimension must be contiguous (stride(1) == 1), "
                             f"got strides {tuple(x.stride())}")


def _check_row_tensor(t, name, b, x) -> None:
    if t is None:
        return
    if not isinstance(t, torch.Tensor):
        raise TopKTypeError(f"`{name}` must be a torch.Tensor or None, got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise TopKTypeError(f"`{name}` must be int32, got {t.dtype}")
    if tuple(t.shape) != (b,):
        raise TopKValueError(f"`{name}` must have shape ({b},), got {tuple(t.shape)}")
    if b > 1 and t.stride(0) != 1:
        raise TopKValueError(f"`{name}` must be contiguous, got stride {t.stride(0)}")
    if t.device != x.device:
        raise TopKValueError(f"`{name}` must be on the same device as `input` ({x.device}), "
                             f"got {t.device}")


def _check_output_idx(out, indices_type, b, k, x) -> None:
    if not isinstance(out, torch.Tensor):
        raise TopKTypeError(f"`output_idx` must be a torch.Tensor, got {type(out).__name__}")
    if out.dtype != indices_type:
        raise TopKTypeError(f"`output_idx` dtype ({out.dtype}) must match `indices_type` "
                            f"({indices_type})")
    if tuple(out.shape) != (b, k):
        raise TopKValueError(f"`output_idx` must have shape ({b}, {k}), got {tuple(out.shape)}")
    if k > 1 and out.stride(1) != 1:
        raise TopKValueError(f"`output_idx`'s last dimension must be contiguous, got strides "
                             f"{tuple(out.stride())}")
    if b > 1 and out.stride(0) < k:
        raise TopKValueError(f"output_index rows must not overlap: stride(0) = {out.stride(0)} "
                             f"< topk = {k}")
    if out.device != x.device:
        raise TopKValueError(f"`output_idx` must be on the same device as `input` ({x.device}), "
                             f"got {out.device}")


# ---------------------------------------------------------------- helpers


def _padded_empty(b: int, k: int, dtype, device) -> torch.Tensor:
    """``(b, k)`` view of rows padded to 32 bytes, as DeepSelect allocates outputs."""
    per = 32 // torch.empty((), dtype=dtype).element_size()
    return torch.empty((b, -(-k // per) * per), dtype=dtype, device=device)[:, :k]


def _as_float32(v) -> float:
    """The fill value narrowed to float32 (round to nearest even, overflow to inf), as
    DeepSelect's binding does; numpy's scalar conversion costs 0.4 us, a torch tensor 3."""
    with np.errstate(over="ignore"):
        return float(np.float32(v))
