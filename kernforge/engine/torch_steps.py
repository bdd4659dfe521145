"""Every engine step that is not a kernforge kernel yet, in one module.

Why one module: issue 15 asks for a forward pass made of kernforge kernels.
Until each of these is replaced, it runs here as torch code (mostly the
reference model's own functions, so it is the oracle's arithmetic), and the
table below is the honest list of what is left. Replacing a step means
writing its kernel, registering it as a "kernel" step in `engine.py` and
deleting it here; `tests/engine/test_dispatch.py` then fails until this
table is updated, and fails too if a torch fallback appears outside it.

| step | what it computes | kernel that replaces it |
|---|---|---|
| `embedding` | token rows of the embedding table | embedding gather (kernels/embedding) |
| `linear` | x W^T for every dense projection (dequantizing FP8/FP4 weights) | FP8/FP4/bf16 dense GEMM (kernels/gemm) |
| `rms_norm` | RMSNorm, with or without weight (q, kv, compressor, head norms) | RMSNorm (kernels/norm) |
| `rope` | RoPE/YaRN rotation of q, kv, entries; inverse rotation of the output | RoPE (kernels/rope) |
| `kv_fake_quant` | QAT rounding of the window KV nope dims to e4m3 (block 64) | FP8 quant (kernels/quant) |
| `grouped_output` | the grouped low-rank output projection wo_a | grouped GEMM (m_grouped_bf16_gemm_nt_masked) |
| `hc_pre` | hyper-connection mixes, Sinkhorn, collapse of the M streams | hyper-connection (kernels/hyper_connection) |
| `hc_post` | hyper-connection spread of the sublayer output and stream mixing | hyper-connection (kernels/hyper_connection) |
| `compressor_project` | the compressor's kv and gate projections plus the position bias | dense GEMM + elementwise |
| `compressor_pool` | softmax-gated pooling, RMSNorm, RoPE, Hadamard/FP4 or FP8 rounding of new entries | compressor kernel |
| `indexer_query` | indexer q: projection, RoPE, Hadamard, FP4 rounding | GEMM + rope + hadamard + quant kernels |
| `indexer_scores` | sum over heads of relu(q.k) * w: the indexer's entry scores | indexer score kernel |
| `moe` | gate (scores, hash/top-k routing), routed experts, shared expert | routing + grouped GEMM + SwiGLU kernels |
| `head` | final hyper-connection collapse, RMSNorm and the vocabulary projection | hyper-connection + norm + GEMM |
| `mtp_input` | MTP block input: e_proj(enorm(embed)) + h_proj(hnorm(stream)) | norm + GEMM |
| `fp8_kv_quantize` | packing KV into FP8 (MODEL1) pages on write (`is_fp8_kvcache`) | FP8 quant kernel |
| `fp8_kv_dequantize` | FP8 pages -> bf16 pages for the attention kernel (`is_fp8_kvcache`) | an MLA kernel reading MODEL1 pages |

Kernel steps (registered in `engine.py`): `sparse_mla` (`flash_mla_with_kvcache`,
sparse path, with the attention sink) and `indexer_topk` (`kernforge.ops.topk`).
"""

from __future__ import annotations

import torch

from kernforge.engine.steps import step
from kernforge.model import numerics as nx
from kernforge.model.block import hc_post as _hc_post, hc_pre as _hc_pre
from kernforge.model.primitives import hadamard, rms_normalize
from kernforge.model.quant import fake_quant_fp4, fake_quant_fp8


@step("embedding", "torch", "token rows of the embedding table")
def embedding(weight: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return weight[ids]


@step("linear", "torch", "x W^T for a dense projection")
def linear(module, x: torch.Tensor) -> torch.Tensor:
    return module(x)


@step("rms_norm", "torch", "RMSNorm")
def rms_norm(module, x: torch.Tensor, eps: float | None = None) -> torch.Tensor:
    """module(x), or with module None the unweighted normalisation (the per-head q renorm)."""
    return rms_normalize(x, eps) if module is None else module(x)


@step("rope", "torch", "RoPE/YaRN rotation")
def rope(table, x: torch.Tensor, positions: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    return table.rotate(x, positions, inverse=inverse)


@step("kv_fake_quant", "torch", "QAT e4m3 rounding of the KV nope dims")
def kv_fake_quant(kv: torch.Tensor, rope_dim: int) -> torch.Tensor:
    return torch.cat([fake_quant_fp8(kv[..., :-rope_dim]), kv[..., -rope_dim:]], dim=-1)


@step("grouped_output", "torch", "grouped low-rank output projection wo_a")
def grouped_output(attn, o: torch.Tensor) -> torch.Tensor:
    return attn._grouped_wo_a(o)


@step("hc_pre", "torch", "hyper-connection pre mixing + Sinkhorn")
def hc_pre(block, xs: list[torch.Tensor], which: str):
    fn, scale, base = (getattr(block, f"hc_{which}_{p}") for p in ("fn", "scale", "base"))
    return _hc_pre(xs, fn, scale, base, block.hc_iters, block.norm_eps, block.hc_eps)


@step("hc_post", "torch", "hyper-connection post mixing")
def hc_post(y: torch.Tensor, xs: list[torch.Tensor], post: torch.Tensor, comb: torch.Tensor):
    return _hc_post(y, xs, post, comb)


@step("compressor_project", "torch", "compressor kv/gate projections + position bias")
def compressor_project(comp, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return comp.wkv(x), comp.wgate(x) + comp.ape[positions % comp.ratio].to(x.dtype)


@step("compressor_pool", "torch", "gated pooling + norm + rope + rounding of new entries")
def compressor_pool(comp, seq_kv: torch.Tensor, seq_score: torch.Tensor, n_new: int, first: int) -> torch.Tensor:
    """seq_kv/seq_score [rows, width] from position (first-1)*r -> entries first..first+n_new-1 [n_new, d]."""
    r = comp.ratio
    rows = (n_new + 1) * r
    blocks_kv = seq_kv[None, :rows].unflatten(1, (n_new + 1, r))
    blocks_score = seq_score[None, :rows].unflatten(1, (n_new + 1, r))
    return comp._finish(comp._pool(blocks_kv, blocks_score, n_new), first)[0]


@step("indexer_query", "torch", "indexer q projection, rope, Hadamard, FP4 rounding")
def indexer_query(indexer, qr: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    q = indexer.rope.rotate(indexer.wq_b(qr).unflatten(-1, (indexer.n_heads, indexer.head_dim)), positions)
    q = hadamard(q)
    return fake_quant_fp4(q) if indexer.fake_quant else q


@step("indexer_scores", "torch", "indexer entry scores")
def indexer_scores(indexer, x: torch.Tensor, q: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """x [s, D], q [s, h, d], keys [n, d] -> scores [s, n] = sum_h relu(q_h . k) * w_h."""
    weights = indexer.weights_proj(x) * indexer.scale
    terms = []
    for i in range(indexer.n_heads):
        dots = nx.tree_sum(q[:, None, i, :] * keys[None], -1) if nx.is_deterministic() else q[:, i] @ keys.T
        terms.append(dots.relu_().mul_(weights[:, i, None]))
    # + 0.0 turns -0.0 (relu 0 times a negative weight) into +0.0: kernforge's topk ranks
    # -0.0 below +0.0 by bit order, the reference's sort treats them as a tie (lower index wins).
    return nx.sum_terms(terms) + 0.0


@step("moe", "torch", "routing, routed experts and the shared expert")
def moe(ffn, x: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    return ffn(x, token_ids)


@step("head", "torch", "final collapse, norm and vocabulary projection")
def head(model, xs: list[torch.Tensor], mtp=None) -> torch.Tensor:
    if mtp is None:
        return model._head(xs)
    return model._head(xs, mtp.hc_head_fn, mtp.hc_head_scale, mtp.hc_head_base, mtp.norm)


@step("mtp_input", "torch", "MTP input projections")
def mtp_input(mtp, embed_rows: torch.Tensor, streams: list[torch.Tensor]) -> list[torch.Tensor]:
    e = mtp.e_proj(mtp.enorm(embed_rows))
    return [e + mtp.h_proj(mtp.hnorm(x)) for x in streams]


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
