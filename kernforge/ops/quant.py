"""DeepGEMM's casting helpers (``deep_gemm.utils``) and V4's FP4 activation format, as kernels.

* ``per_token_cast_to_fp8(x, use_ue8m0=False)``: ``x [..., K]`` -> ``(e4m3 [..., K], float32
  [..., ceil(K / 128)])``, one scale per 1x128 slice of a row (SFA, the activations' recipe);
* ``per_block_cast_to_fp8(x, use_ue8m0=False)``: ``x [N, K]`` or ``[G, N, K]`` -> ``(e4m3, float32
  [(G,) ceil(N / 128), ceil(K / 128)])``, one scale per 128x128 block (SFB, the weights');
* ``per_token_cast_to_fp4(x)``: ``x [..., K]`` (K even) -> ``(int8 [..., K / 2], float32
  [..., ceil(K / 32)])``: e2m1 codes two per byte (element ``2i`` in the low nibble) with one
  power-of-two scale per 32, the format of ``kernforge.model.quant`` (``dequantize_fp4``
  of the result with the scales as E8M0 is the model's ``fake_quant_fp4`` of ``x``);
* ``fake_quant_fp8(x, block=64)`` / ``fake_quant_fp4(x, block=32)``: the model's QAT roundings
  (``kernforge.model.quant``): ``x [..., K]`` rounded to e4m3 / e2m1 with one power-of-two
  scale per ``block`` values and back, in x's dtype (FP4: float32, as the model's), equal
  to the model's functions bit for bit, NaN and infinity included (such a block's scale is
  1, as ``torch.frexp`` makes it there).

The results equal the torch references bit for bit (``kernforge.kernels.grouped_gemm.reference``
for FP8, ``kernforge.kernels.quant.reference`` for FP4) on every backend; NaN propagates as
there (a NaN makes its block's scale and data NaN).  Where DeepGEMM's own FP4 helper
differs (it rounds ties down, maps ``-0`` to ``+0``, floors amax at 1e-4 and scales by
``amax / 6`` without rounding unless ``use_ue8m0``), this op follows the model's format.
Validation raises before launch: :class:`QuantTypeError` (dtype, non-tensor) and
:class:`QuantValueError` (shape, contiguity), both naming the argument.
"""
from __future__ import annotations

import functools
import math
from typing import Optional

import torch

import kernforge
from kernforge import backends
from kernforge.kernels import quant as kernels
from kernforge.kernels.quant import config

_DTYPES = {torch.bfloat16: "bfloat16", torch.float32: "float32"}


class QuantTypeError(TypeError, RuntimeError):
    """An argument of the wrong type or dtype (RuntimeError too, as DeepGEMM's C++ checks raise)."""


class QuantValueError(ValueError, RuntimeError):
    """An argument with a bad shape or layout."""


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _check_x(x, name: str = "x", min_dim: int = 1, max_dim: Optional[int] = None) -> str:
    if not isinstance(x, torch.Tensor):
        raise QuantTypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _DTYPES:
        raise QuantTypeError(f"{name} must be bfloat16 or float32, got {x.dtype}")
    if x.dim() < min_dim or (max_dim is not None and x.dim() > max_dim):
        want = f"{min_dim}-D" if max_dim == min_dim else f"{min_dim}-D to {max_dim}-D" if max_dim else \
            f"at least {min_dim}-D"
        raise QuantValueError(f"{name} must be {want}, got shape {tuple(x.shape)}")
    if not x.is_contiguous():
        raise QuantValueError(f"{name} must be contiguous (K-major)")
    return _DTYPES[x.dtype]


@functools.lru_cache(maxsize=None)
def _kernel(factory, backend: str, **params):
    return kernforge.compile(factory, backend=backend, **params)


def per_token_cast_to_fp8(x: torch.Tensor, use_ue8m0: bool = False, *,
                          backend: Optional[str] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One float32 scale per 1x128 slice of each row: ``max(amax, 1e-4) / 448``, rounded up to
    a power of two with ``use_ue8m0``; data = ``x / scale`` in e4m3 (round to nearest even)."""
    dtype = _check_x(x, min_dim=1)
    k = x.shape[-1]
    m = math.prod(x.shape[:-1])
    data = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    sf = torch.empty(*x.shape[:-1], _cdiv(k, kernels.FP8_BLOCK), dtype=torch.float32, device=x.device)
    if m == 0 or k == 0:
        return data, sf
    name = backends.for_tensor(x, backend)
    kernel = _kernel(kernels.per_token_cast, name, **config.choose_token(name, dtype, bool(use_ue8m0)))
    kernel(x.view(m, k), data.view(m, k), sf.view(m, -1))
    return data, sf


def per_block_cast_to_fp8(x: torch.Tensor, use_ue8m0: bool = False, *,
                          backend: Optional[str] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One float32 scale per 128x128 block of the last two dims (``max(amax, 1e-4) / 448``,
    power of two with ``use_ue8m0``); ``x`` is ``[N, K]`` or ``[G, N, K]``."""
    dtype = _check_x(x, min_dim=2, max_dim=3)
    n, k = x.shape[-2:]
    g = math.prod(x.shape[:-2])
    data = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    sf = torch.empty(*x.shape[:-2], _cdiv(n, kernels.FP8_BLOCK), _cdiv(k, kernels.FP8_BLOCK),
                     dtype=torch.float32, device=x.device)
    if g == 0 or n == 0 or k == 0:
        return data, sf
    name = backends.for_tensor(x, backend)
    kernel = _kernel(kernels.per_block_cast, name, **config.choose_block(name, dtype, bool(use_ue8m0)))
    kernel(x.view(g, n, k), data.view(g, n, k), sf.view(g, sf.shape[-2], sf.shape[-1]))
    return data, sf


def per_token_cast_to_fp4(x: torch.Tensor, *, backend: Optional[str] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """V4's FP4: one power-of-two scale ``2^ceil(log2(max(amax, 6 * 2^-126) / 6))`` per 32
    values of a row, the scaled values rounded to e2m1 (ties to the even code, sign from the
    sign bit), packed two per int8 byte, low nibble first."""
    dtype = _check_x(x, min_dim=1)
    k = x.shape[-1]
    if k % 2:
        raise QuantValueError(f"x's last dim must be even (two e2m1 codes per byte), got {k}")
    m = math.prod(x.shape[:-1])
    codes = torch.empty(*x.shape[:-1], k // 2, dtype=torch.int8, device=x.device)
    sf = torch.empty(*x.shape[:-1], _cdiv(k, kernels.FP4_BLOCK), dtype=torch.float32, device=x.device)
    if m == 0 or k == 0:
        return codes, sf
    name = backends.for_tensor(x, backend)
    kernel = _kernel(kernels.per_token_cast_fp4, name, **config.choose_fp4(name, dtype))
    kernel(x.view(m, k), codes.view(torch.uint8).view(m, k // 2), sf.view(m, -1))
    return codes, sf


def _fake_quant_args(x, block, dtypes: tuple) -> tuple[int, int]:
    if not isinstance(x, torch.Tensor):
        raise QuantTypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in dtypes:
        raise QuantTypeError(f"x must be {' or '.join(str(d)[6:] for d in dtypes)}, got {x.dtype}")
    if isinstance(block, bool) or not isinstance(block, int):
        raise QuantTypeError(f"block must be an int, got {type(block).__name__}")
    if block < 1:
        raise QuantValueError(f"block must be positive, got {block}")
    if x.dim() < 1:
        raise QuantValueError(f"x must be at least 1-D, got shape {tuple(x.shape)}")
    if x.shape[-1] % block:
        raise QuantValueError(f"x's last dim {x.shape[-1]} is not a multiple of block {block}")
    if not x.is_contiguous():
        raise QuantValueError("x must be contiguous")
    return math.prod(x.shape[:-1]), x.shape[-1]


def fake_quant_fp8(x: torch.Tensor, block: int = kernels.FAKE_FP8_BLOCK, *,
                   backend: Optional[str] = None) -> torch.Tensor:
    """The model's ``fake_quant_fp8``: ``x`` rounded to e4m3 with one power-of-two scale
    ``2^ceil(log2(max(amax, 1e-4) / 448))`` per ``block`` values, and back, in x's dtype
    (float32 or bfloat16, the model's bf16 roundings included)."""
    m, k = _fake_quant_args(x, block, (torch.float32, torch.bfloat16))
    out = torch.empty_like(x)
    if m == 0 or k == 0:
        return out
    name = backends.for_tensor(x, backend)
    kernel = _kernel(kernels.fake_quant_e4m3, name, **config.choose_fake_fp8(name, _DTYPES[x.dtype], block))
    kernel(x.view(m, k), out.view(m, k))
    return out


def fake_quant_fp4(x: torch.Tensor, block: int = kernels.FP4_BLOCK, *,
                   backend: Optional[str] = None) -> torch.Tensor:
    """The model's ``fake_quant_fp4``: ``x`` (float32, the one dtype the model's rounding
    takes) rounded to e2m1 with one power-of-two scale ``2^ceil(log2(max(amax, 6 * 2^-126) /
    6))`` per ``block`` values (ties to even), and back."""
    m, k = _fake_quant_args(x, block, (torch.float32,))
    out = torch.empty_like(x)
    if m == 0 or k == 0:
        return out
    name = backends.for_tensor(x, backend)
    kernel = _kernel(kernels.fake_quant_e2m1, name, **config.choose_fake_fp4(name, block))
    kernel(x.view(m, k), out.view(m, k))
    return out
