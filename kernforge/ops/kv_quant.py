"""FP8 KV pages (FlashMLA's V4 "MODEL1" layout) as ops: the engine's ``fp8_kv_quantize`` and
``fp8_kv_dequantize`` steps (`kernforge.engine.cache`, ``is_fp8_kvcache=True``).

* ``fp8_kv_quantize(values, nope)``: ``values [n, nope + rope]`` (float32 or bfloat16) ->
  ``(data uint8 [n, nope + 2 rope], scales uint8 [n, scale_bytes])``: per token the e4m3
  codes of the nope dims (one power-of-two scale ``2^ceil(log2(max(amax, 1e-4) / 448))``
  per 64 values), the rope dims as bf16 bytes, and the scales as E8M0 bytes (exponent +
  127), zero-padded to a multiple of 8;
* ``fp8_kv_dequantize(pages, nope, rope, block_size)``: ``pages uint8 [P, block_size *
  (nope + 2 rope + scale_bytes)]`` (a page's token bytes, then its scale bytes) -> bf16
  ``[P, block_size, 1, nope + rope]``, the page layout ``flash_mla_with_kvcache`` reads.

The bytes and values are those of the torch oracles (`kernforge.kernels.kv_quant.reference`,
the engine's former torch steps) bit for bit, non-finite values included.  Validation
raises before launch: :class:`KVQuantTypeError` (types, dtypes) and :class:`KVQuantValueError`
(shapes, layout, sizes), both naming the argument.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

import kernforge
from kernforge import backends
from kernforge.kernels import kv_quant as kernels

_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16"}


class KVQuantTypeError(TypeError):
    """An argument of the wrong type or dtype."""


class KVQuantValueError(ValueError):
    """An argument with a bad shape, layout or size."""


@functools.lru_cache(maxsize=None)
def _kernel(factory, backend: str, params: tuple):
    return kernforge.compile(factory, backend=backend, **dict(params))


def _int(name: str, v, low: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise KVQuantValueError(f"{name} must be an int >= {low}, got {v!r}")
    return v


def _nope(nope) -> int:
    _int("nope", nope, 1)
    if nope % kernels.BLOCK:
        raise KVQuantValueError(f"nope must be a positive multiple of {kernels.BLOCK} (one scale per "
                                f"{kernels.BLOCK} values), got {nope}")
    return nope


def _tensor(name: str, t, dtypes, dim: int) -> None:
    if not isinstance(t, torch.Tensor):
        raise KVQuantTypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise KVQuantTypeError(f"{name} must have dtype {' or '.join(map(str, dtypes))}, got {t.dtype}")
    if t.dim() != dim:
        raise KVQuantValueError(f"{name} must be {dim}-D, got shape {tuple(t.shape)}")
    if not t.is_contiguous():
        raise KVQuantValueError(f"{name} must be contiguous, got strides {tuple(t.stride())}")


def fp8_kv_quantize(values: torch.Tensor, nope: int, *,
                    backend: Optional[str] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """KV rows -> their MODEL1 token bytes and E8M0 scale bytes (module docstring)."""
    _tensor("values", values, tuple(_DTYPES), 2)
    nope = _nope(nope)
    n, width = values.shape
    if width < nope:
        raise KVQuantValueError(f"values must have at least nope={nope} columns, got {width}")
    rope = width - nope
    data = torch.empty(n, nope + 2 * rope, dtype=torch.uint8, device=values.device)
    scales = torch.empty(n, kernels.scale_bytes(nope), dtype=torch.uint8, device=values.device)
    if n == 0:
        return data, scales
    name = backends.for_tensor(values, backend)
    params = kernels.config.choose_quantize(name, nope, rope, _DTYPES[values.dtype])
    _kernel(kernels.fp8_kv_quantize, name, tuple(sorted(params.items())))(values, data, scales)
    return data, scales


def fp8_kv_dequantize(pages: torch.Tensor, nope: int, rope: int, block_size: int, *,
                      backend: Optional[str] = None) -> torch.Tensor:
    """MODEL1 pages -> bf16 pages ``[P, block_size, 1, nope + rope]`` (module docstring)."""
    _tensor("pages", pages, (torch.uint8,), 2)
    nope, rope, block_size = _nope(nope), _int("rope", rope, 0), _int("block_size", block_size, 1)
    page_bytes = block_size * (nope + 2 * rope + kernels.scale_bytes(nope))
    if pages.shape[1] != page_bytes:
        raise KVQuantValueError(f"pages must be [P, {page_bytes}] (block_size={block_size} tokens of "
                                f"nope={nope}, rope={rope}), got {tuple(pages.shape)}")
    p = pages.shape[0]
    out = torch.empty(p, block_size, 1, nope + rope, dtype=torch.bfloat16, device=pages.device)
    if p == 0:
        return out
    name = backends.for_tensor(pages, backend)
    params = kernels.config.choose_dequantize(name, nope, rope, block_size)
    _kernel(kernels.fp8_kv_dequantize, name, tuple(sorted(params.items())))(pages, out.view(p, block_size, -1))
    return out
