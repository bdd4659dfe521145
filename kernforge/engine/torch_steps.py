"""Every engine step that is not a kernforge kernel yet, in one module.

Why one module: issue 15 asks for a forward pass made of kernforge kernels.
Until each of these is replaced, it runs here as torch code (mostly the
reference model's own functions, so it is the oracle's arithmetic), and the
table below is the honest list of what is left. Replacing a step means
writing its kernel, registering it as a "kernel" step (`kernel_steps.py`) and
deleting it here; `tests/engine/test_dispatch.py` then fails until this
table is updated, and fails too if a torch fallback appears outside it.

| step | what it computes | kernel that replaces it |
|---|---|---|
| `kv_fake_quant` | QAT rounding of the window KV nope dims to e4m3 (block 64) | an FP8 fake-quant: `ops.per_token_cast_to_fp8` returns codes + scales per 1x128, not block-64 rounded values |
| `compressor_pool` | softmax-gated pooling, RMSNorm, RoPE, Hadamard/FP4 or FP8 rounding of new entries (its projections are the `compressor_project` kernel step) | compressor kernel |
| `indexer_fp4_round` | QAT rounding of the indexer q to e2m1 (block 32, power-of-two scales) | FP4 fake-quant (ops.quant's `per_token_cast_to_fp4` returns codes + float scales, not the rounded values) |
| `indexer_scores` | sum over heads of relu(q.k) * w: the indexer's entry scores (its weights_proj is a `linear` kernel step) | indexer score kernel |
| `fp8_kv_quantize` | packing KV into FP8 (MODEL1) pages on write (`is_fp8_kvcache`) | FP8 quant kernel |
| `fp8_kv_dequantize` | FP8 pages -> bf16 pages for the attention kernel (`is_fp8_kvcache`) | an MLA kernel reading MODEL1 pages |

Kernel steps: `sparse_mla` and `indexer_topk` (registered in `engine.py`), and in
`kernel_steps.py` `embedding`, `rms_norm`, `rope`, `hadamard`, `hc_pre`, `hc_post`,
`hc_head`, `routing`, `moe_mapping`, `moe_expand`, `swiglu`, and on the dense GEMM
(`ops.fp32_gemm_nt`) `linear`, `router_logits`, `grouped_output`, `compressor_project`
and `expert_gemm`, and `moe_reduce` (`ops.reduce_fused`). The MTP input's add is the
`linear` step's `c` (h_proj(hnorm(x)) + e).
"""

from __future__ import annotations

import torch

from kernforge.engine.steps import step
from kernforge.model import numerics as nx
from kernforge.model.quant import fake_quant_fp4, fake_quant_fp8


@step("kv_fake_quant", "torch", "QAT e4m3 rounding of the KV nope dims")
def kv_fake_quant(kv: torch.Tensor, rope_dim: int) -> torch.Tensor:
    return torch.cat([fake_quant_fp8(kv[..., :-rope_dim]), kv[..., -rope_dim:]], dim=-1)


@step("compressor_pool", "torch", "gated pooling + norm + rope + rounding of new entries")
def compressor_pool(comp, seq_kv: torch.Tensor, seq_score: torch.Tensor, n_new: int, first: int) -> torch.Tensor:
    """seq_kv/seq_score [rows, width] from position (first-1)*r -> entries first..first+n_new-1 [n_new, d]."""
    r = comp.ratio
    rows = (n_new + 1) * r
    blocks_kv = seq_kv[None, :rows].unflatten(1, (n_new + 1, r))
    blocks_score = seq_score[None, :rows].unflatten(1, (n_new + 1, r))
    return comp._finish(comp._pool(blocks_kv, blocks_score, n_new), first)[0]


@step("indexer_fp4_round", "torch", "QAT e2m1 rounding of the indexer q")
def indexer_fp4_round(q: torch.Tensor) -> torch.Tensor:
    return fake_quant_fp4(q)


@step("indexer_scores", "torch", "indexer entry scores")
def indexer_scores(indexer, head_weights: torch.Tensor, q: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """head_weights [s, h] (weights_proj(x), a `linear` kernel step), q [s, h, d], keys [n, d]
    -> scores [s, n] = sum_h relu(q_h . k) * w_h * scale."""
    weights = head_weights * indexer.scale
    terms = []
    for i in range(indexer.n_heads):
        dots = nx.tree_sum(q[:, None, i, :] * keys[None], -1) if nx.is_deterministic() else q[:, i] @ keys.T
        terms.append(dots.relu_().mul_(weights[:, i, None]))
    # + 0.0 turns -0.0 (relu 0 times a negative weight) into +0.0: kernforge's topk ranks
    # -0.0 below +0.0 by bit order, the reference's sort treats them as a tie (lower index wins).
    return nx.sum_terms(terms) + 0.0


_E4M3_MAX = 448.0


@step("fp8_kv_quantize", "torch", "KV -> FP8 MODEL1 page bytes")
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


@step("fp8_kv_dequantize", "torch", "FP8 MODEL1 pages -> bf16 pages")
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
