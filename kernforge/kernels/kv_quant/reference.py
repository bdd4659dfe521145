"""The torch oracles of the FP8 KV page kernels: the engine's former `fp8_kv_quantize` and
`fp8_kv_dequantize` torch steps, moved here unchanged.

Why these and not a fresh formulation: the pages they wrote are what the engine's FP8
cache held before the kernels, and the kernels must write the same bytes (frexp/ldexp
arithmetic here, exponent bits in the kernels).  `layout` is any object with `nope`,
`rope`, `block_size`, `token_bytes` and `scale_bytes` (`kernforge.engine.cache.Fp8KVLayout`).
"""
from __future__ import annotations

import torch

_E4M3_MAX = 448.0


def fp8_kv_quantize(values: torch.Tensor, layout) -> tuple[torch.Tensor, torch.Tensor]:
    """values [n, nope + rope] -> (data uint8 [n, token_bytes], scales uint8 [n, scale_bytes]).

    Nope dims: e4m3 codes with one power-of-two scale per 64 values,
    2^ceil(log2(max(amax, 1e-4) / 448)) (the model's QAT rule), stored as the
    E8M0 byte exponent + 127; rope dims: bf16 bytes.
    """
    n = values.shape[0]
    nope = values[:, :layout.nope].float().unflatten(-1, (-1, 64))
    amax = nope.abs().amax(-1, keepdim=True).clamp(min=1e-4) / _E4M3_MAX
    mant, exp = torch.frexp(amax)
    exp = torch.where(mant == 0.5, exp - 1, exp)  # ceil(log2(v))
    scale = torch.ldexp(torch.ones_like(amax), exp)
    codes = (nope / scale).to(torch.float8_e4m3fn).view(torch.uint8).flatten(1)
    rope = values[:, layout.nope:].to(torch.bfloat16).contiguous().view(torch.uint8).view(n, -1)
    scales = torch.zeros(n, layout.scale_bytes, dtype=torch.uint8, device=values.device)
    scales[:, :layout.nope // 64] = (exp[..., 0] + 127).to(torch.uint8)
    return torch.cat([codes, rope], dim=1), scales


def fp8_kv_dequantize_pages(buf: torch.Tensor, layout) -> torch.Tensor:
    """uint8 [nb, page_bytes] -> bf16 [nb, block, 1, nope + rope]."""
    nb, bs = buf.shape[0], layout.block_size
    data = buf[:, :bs * layout.token_bytes].reshape(nb, bs, layout.token_bytes)
    scales = buf[:, bs * layout.token_bytes:].reshape(nb, bs, layout.scale_bytes)[..., :layout.nope // 64]
    codes = data[..., :layout.nope].contiguous().view(torch.float8_e4m3fn).float().unflatten(-1, (-1, 64))
    scale = torch.ldexp(torch.ones_like(scales, dtype=torch.float32), scales.to(torch.int32) - 127)
    nope = (codes * scale[..., None]).flatten(-2).to(torch.bfloat16)
    rope = data[..., layout.nope:].contiguous().view(torch.bfloat16)
    return torch.cat([nope, rope], dim=-1)[:, :, None]
