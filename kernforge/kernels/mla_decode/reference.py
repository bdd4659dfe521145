"""Host-side (torch) MLA code: float64 reference attention and FlashMLA's V3.2 FP8 cache format."""
from __future__ import annotations

import math

import torch

from kernforge.kernels.mla_decode.kernel import V32_ROPE_AT, V32_SCALES, V32_TILE


def quantize_kv_v32(kv: torch.Tensor) -> torch.Tensor:
    """``[..., 576]`` bf16/float -> FlashMLA's V3.2 bytes ``[..., 656]`` uint8.  Scale per
    128 values = ``2^ceil(log2(max(amax / 448, 1e-4)))`` (FlashMLA's reference quantizer)."""
    x = kv.float()
    nope = x[..., :512].unflatten(-1, (V32_SCALES, V32_TILE))
    scale = torch.exp2(torch.ceil(torch.log2((nope.abs().amax(-1) / 448).clamp(min=1e-4))))
    data = (nope / scale[..., None]).to(torch.float8_e4m3fn).flatten(-2)
    parts = [data.view(torch.uint8), scale.contiguous().view(torch.uint8),
             x[..., 512:].bfloat16().contiguous().view(torch.uint8)]
    return torch.cat(parts, dim=-1)


def dequantize_kv_v32(raw: torch.Tensor) -> torch.Tensor:
    """V3.2 bytes ``[..., 656]`` -> ``[..., 576]`` bf16 (e4m3 x scale rounded to bf16)."""
    nope = raw[..., :512].contiguous().view(torch.float8_e4m3fn).float()
    scale = raw[..., 512:V32_ROPE_AT].contiguous().view(torch.float32)
    rope = raw[..., V32_ROPE_AT:].contiguous().view(torch.bfloat16)
    nope = (nope.unflatten(-1, (V32_SCALES, V32_TILE)) * scale[..., None]).flatten(-2)
    return torch.cat([nope.bfloat16(), rope], dim=-1)


def reference(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
              cache_seqlens: torch.Tensor, attn_sink: torch.Tensor | None, sm_scale: float,
              dim_v: int, causal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain float64 attention over the gathered pages (independent of the DSL).

    q ``[b, s_q, h_q, d]``, kv_cache ``[num_pages, page, h_kv, d]``; returns
    ``out [b, s_q, h_q, dim_v]`` (float64) and ``lse [b, h_q, s_q]`` (float64)."""
    b, s_q, h_q, d = q.shape
    page, h_kv = kv_cache.shape[1], kv_cache.shape[2]
    group = h_q // h_kv
    dev = q.device                      # float64 on the inputs' device (GPU-sized problems)
    out = torch.zeros(b, s_q, h_q, dim_v, dtype=torch.float64, device=dev)
    lse = torch.full((b, h_q, s_q), math.inf, dtype=torch.float64, device=dev)
    for i in range(b):
        n = int(cache_seqlens[i])
        if n == 0:
            continue
        pages = block_table[i, :-(-n // page)].long()
        k = kv_cache[pages].reshape(-1, h_kv, d)[:n].double().repeat_interleave(group, dim=1)
        scores = torch.einsum("shd,lhd->hsl", q[i].double(), k) * sm_scale
        if causal:
            pos = torch.arange(max(n, s_q), device=dev)
            visible = pos[None, :n] < (n - s_q + pos[:s_q] + 1)[:, None]
            scores = scores.masked_fill(~visible[None], -math.inf)
        out[i], lse[i] = _softmax_rows(scores, k[..., :dim_v], attn_sink, h_q)
    return out, lse


def reference_sparse(q: torch.Tensor, kv_flat: torch.Tensor, indices: torch.Tensor,
                     topk_length: torch.Tensor | None, attn_sink: torch.Tensor | None,
                     sm_scale: float, dim_v: int) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 attention of each query token over its listed cache rows.

    q ``[b, s_q, h_q, d]``, kv_flat ``[num_tokens, d]``, indices ``[b, s_q, topk]`` (``-1``
    = empty; only the first ``topk_length[b]`` slots count)."""
    b, s_q, h_q, d = q.shape
    out = torch.zeros(b, s_q, h_q, dim_v, dtype=torch.float64, device=q.device)
    lse = torch.full((b, h_q, s_q), math.inf, dtype=torch.float64, device=q.device)
    for i in range(b):
        n = indices.shape[-1] if topk_length is None else min(int(topk_length[i]), indices.shape[-1])
        for t in range(s_q):
            idx = indices[i, t, :n].long()
            k = kv_flat[idx[idx != -1]].double()[:, None, :]                   # [L, 1, d]
            if k.shape[0] == 0:
                continue
            scores = torch.einsum("hd,lhd->hl", q[i, t].double(), k.expand(-1, h_q, -1))
            o, row_lse = _softmax_rows(scores[:, None, :] * sm_scale,
                                       k[..., :dim_v].expand(-1, h_q, -1), attn_sink, h_q)
            out[i, t], lse[i, :, t] = o[0], row_lse[:, 0]
    return out, lse


def _softmax_rows(scores, v, attn_sink, h_q):
    """softmax(scores) @ v per head, with the sink; rows with nothing visible: 0 and +inf.
    A NaN score makes its row NaN, as torch's softmax does: only the empty rows' NaNs
    (``-inf - -inf``) are zeroed, not every NaN."""
    row_lse = torch.logsumexp(scores, dim=-1)                          # [h, s]
    empty = torch.isneginf(row_lse)
    p = torch.exp(scores - row_lse[..., None]).masked_fill(empty[..., None], 0.0)
    o = torch.einsum("hsl,lhd->shd", p, v)
    if attn_sink is not None:
        o = o / (1 + torch.exp(attn_sink.double()[:, None] - row_lse)).T[..., None]
    o = o.masked_fill(empty.T[..., None], 0.0)
    return o, row_lse.masked_fill(empty, math.inf)
