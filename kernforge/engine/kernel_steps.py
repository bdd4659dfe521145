"""The engine's steps that run as kernforge kernels (besides attention and the indexer top-k,
which live in `engine.py`).

Why a module of thin wrappers: each wrapper registers one step name as a
"kernel" step, so the dispatch-mode test can check that it issues no torch
math, and `steps.record()` times it. The ops are `kernforge.ops.layers`
(docs/kernels/layers.md); every one computes in float32 and rounds once, so at
the model's float32 they agree with the reference's functions to float32
rounding (the exact-mode tests' 1e-4 holds unchanged).

The hyper-connection streams travel as one contiguous tensor `[1, N, M, D]`
(copy j at `[..., j, :]`, the layout `hc_pre`/`hc_post`/`hc_head` read).

Every GEMM (projections, head, router, compressor and indexer projections, the grouped
output, routed and shared experts) is `ops.fp32_gemm_nn` at the float32 model's dtype, or
`ops.bf16_gemm_nn` for a bf16 one: float32 products summed in float32, so against the
reference's `F.linear` only the summation order differs. The weights are made once by
`Weights` (dequantized, fused, transposed to `[K, N]`) so no step converts a weight per call.
"""

from __future__ import annotations

import torch

from kernforge import ops
from kernforge.engine.steps import step
from kernforge.model.attention import Attention
from kernforge.model.compressor import Compressor
from kernforge.model.moe import Expert, Gate
from kernforge.model.primitives import Linear

_GEMM = {torch.float32: ops.fp32_gemm_nn, torch.bfloat16: ops.bf16_gemm_nn}


def _kn(w: torch.Tensor) -> torch.Tensor:
    """A `[N, K]` weight as the `[K, N]` contiguous operand of the `nn` GEMMs."""
    return w.detach().t().contiguous()


class Weights:
    """Every weight a GEMM step reads, dense, in the activations' dtype and transposed to a
    contiguous `[K, N]`, made once when the engine is built.

    Why: the reference dequantizes FP8/FP4 weights on every call (`Linear.dense_weight`) and
    concatenates nothing. Quantized weights are dequantized here to the model's dtype, exactly
    as the reference's per-call dequantization (the FP8/FP4 GEMMs would round the activations
    to e4m3, which the reference does not). `[K, N]` (N contiguous) is the layout the CPU GEMM
    micro-kernel reads in place; a `[N, K]` operand has each B tile transposed on every call,
    which at decode (M = 1-8) is most of the call: 3-6x slower at M = 1, ~15% at M = 2048
    (docs/performance.md). The copy costs one more set of dense weights in memory. Experts get
    `[w1; w3]`, the fused layout `ops.swiglu` reads; the grouped output projection wo_a one
    `[K, R]` operand per group."""

    def __init__(self, model, dtype: torch.dtype):
        if dtype not in _GEMM:
            raise TypeError(f"model: the engine runs float32 or bf16 weights, got {dtype}")
        modules = list(model.modules())
        dense = {m: m.dense_weight(dtype).detach() for m in modules if isinstance(m, Linear)}
        self._dense = {m: _kn(w) for m, w in dense.items()}
        self._gate_up = {m: _kn(torch.cat([dense[m.w1], dense[m.w3]])) for m in modules if isinstance(m, Expert)}
        self._router = {m: _kn(m.weight.to(dtype)) for m in modules if isinstance(m, Gate)}
        self._groups = {m: torch.stack([_kn(w) for w in dense[m.wo_a].unflatten(0, (m.o_groups, m.o_lora_rank))])
                        for m in modules if isinstance(m, Attention)}
        self._ape = {m: m.ape.detach().to(dtype).contiguous() for m in modules if isinstance(m, Compressor)}
        self._attn_input = {}
        for m in modules:
            if isinstance(m, Attention):
                parts, columns, lo = _input_projections(m), {}, 0
                for name, linear in parts:
                    columns[name] = (lo, lo + linear.out_features)
                    lo += linear.out_features
                self._attn_input[m] = (_kn(torch.cat([dense[linear] for _, linear in parts])), columns)

    def __getitem__(self, module: Linear) -> torch.Tensor:
        return self._dense[module]

    def router(self, gate: Gate) -> torch.Tensor:
        """`Gate.weight`^T [D, E], in the activations' dtype."""
        return self._router[gate]

    def gate_up(self, expert: Expert) -> torch.Tensor:
        """`[w1; w3]`^T of an `Expert`: one GEMM gives `ops.swiglu`'s `[gate | up]` rows."""
        return self._gate_up[expert]

    def attention_input(self, attn) -> tuple[torch.Tensor, dict]:
        """Every projection of an `Attention`'s input x, side by side: `[D, sum N]` and
        {part: (first column, end column)} (`_input_projections`)."""
        return self._attn_input[attn]

    def ape(self, comp: Compressor) -> torch.Tensor:
        """A compressor's gate position bias `[ratio, width]` in the activations' dtype (added by
        the pooling kernel, `compressor_pool`)."""
        return self._ape[comp]

    def groups(self, attn) -> torch.Tensor:
        """wo_a as `[G, h*d/G, R]`: group g's rows g*R..(g+1)*R-1, transposed, contiguous per group."""
        return self._groups[attn]


def _input_projections(attn) -> list[tuple[str, Linear]]:
    """(part, Linear) for every projection that reads the attention's input x: wq_a, wkv, the
    compressor's kv and gate, the indexer compressor's kv and gate and the indexer's head
    weights (those that exist)."""
    parts = [("q", attn.wq_a), ("kv", attn.wkv)]
    if attn.compressor is not None:
        parts += [("main_kv", attn.compressor.wkv), ("main_score", attn.compressor.wgate)]
    if attn.indexer is not None:
        comp = attn.indexer.compressor
        parts += [("index_kv", comp.wkv), ("index_score", comp.wgate), ("head_w", attn.indexer.weights_proj)]
    return parts


def gemm(weight: torch.Tensor, x: torch.Tensor, backend: str, add: torch.Tensor | None = None,
         out: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] @ weight [K, N] (a `Weights` operand; + add [..., N], added after the
    product, as the reference's `linear(x) + add`), into `out` [rows, N] when given."""
    rows = x.reshape(-1, x.shape[-1])
    if out is None:
        out = torch.empty(rows.shape[0], weight.shape[1], dtype=x.dtype, device=x.device)
    c = None if add is None else add.reshape(out.shape).contiguous()
    _GEMM[x.dtype](rows.contiguous(), weight, out, c, backend=backend)
    return out.view(*x.shape[:-1], weight.shape[1])


@step("linear", "kernel", "x W^T on the dense GEMM (ops.fp32_gemm_nn / ops.bf16_gemm_nn)")
def linear(weight: torch.Tensor, x: torch.Tensor, backend: str, add: torch.Tensor | None = None,
           out: torch.Tensor | None = None) -> torch.Tensor:
    return gemm(weight, x, backend, add, out)


@step("router_logits", "kernel", "gate logits x W_gate^T in float32 (ops.fp32_gemm_nn)")
def router_logits(weights: Weights, gate, x: torch.Tensor, backend: str) -> torch.Tensor:
    return gemm(weights.router(gate), x, backend).float()


@step("grouped_output", "kernel", "grouped low-rank output projection wo_a, one GEMM per group")
def grouped_output(weights: Weights, attn, o: torch.Tensor, backend: str) -> torch.Tensor:
    """o [1, N, h, d] -> [1, N, G*R]: group g's h/G heads times wo_a's rows g*R..(g+1)*R-1,
    as the reference's `_grouped_wo_a`."""
    groups = o.flatten(2).unflatten(-1, (attn.o_groups, -1))  # [1, N, G, h*d/G]
    w = weights.groups(attn)
    return torch.cat([gemm(w[g], groups[:, :, g], backend) for g in range(attn.o_groups)], dim=-1)


@step("attention_input", "kernel", "wq_a, wkv, compressor and indexer projections of x in one GEMM")
def attention_input(weights: Weights, attn, x: torch.Tensor, backend: str) -> dict[str, torch.Tensor]:
    """x [1, N, D] -> {part: [1, N, n]} for every part of `_input_projections`: one GEMM over
    the side-by-side weights instead of up to seven (at decode a GEMM call costs more than its
    work). The compressors' gate parts are the plain `wgate(x)`: the pooling kernel adds the
    position bias `ape` (`compressor_pool`), since a GEMM that accumulates into a bias-filled
    output cost ~1.6x the plain one (tiny(), 8 x 1024 prefill: 110 against 65 ms). "q" and
    "kv" come back contiguous (the RMSNorm reads contiguous rows), the others as column views."""
    w, columns = weights.attention_input(attn)
    y = gemm(w, x, backend)
    parts = {name: y[..., lo:hi] for name, (lo, hi) in columns.items()}
    parts["q"], parts["kv"] = parts["q"].contiguous(), parts["kv"].contiguous()
    return parts


@step("expert_gemm", "kernel", "per-expert segment GEMMs (ops.fp32_gemm_nn per segment)")
def expert_gemm(weights: Weights, experts, which: str, rows: torch.Tensor, starts: list[int], ends: list[int],
                backend: str, out: torch.Tensor | None = None) -> torch.Tensor:
    """rows [N, K] (expert-major, as moe_expand writes them) -> [N, Nout]: segment e
    (rows starts[e]:ends[e]) times expert e's [w1; w3]^T (which="w13", the fused gate/up
    layout `ops.swiglu` reads) or w2^T (which="w2"); rows of no segment are zero. `out`
    [N, Nout], when given, is written instead (the MoE writes the routed rows in front of the
    shared expert's, so one `reduce_fused` sums both)."""
    def weight(e):
        return weights.gate_up(e) if which == "w13" else weights[e.w2]

    n_out = experts[0].w1.out_features * 2 if which == "w13" else experts[0].w2.out_features
    if out is None:
        out = torch.empty(rows.shape[0], n_out, dtype=rows.dtype, device=rows.device)
    covered = 0  # segments are expert-major: ascending, disjoint
    for e, lo, hi in zip(experts, starts, ends):
        if hi > lo:
            out[covered:lo].zero_()
            gemm(weight(e), rows[lo:hi], backend, out=out[lo:hi])
            covered = hi
    out[covered:].zero_()
    return out


@step("moe_reduce", "kernel", "shared expert + routed rows per token (ops.reduce_fused)")
def moe_reduce(rows: torch.Tensor, token_topk_to_pos: torch.Tensor, backend: str) -> torch.Tensor:
    """rows [N + T, D]: the routed rows, then the shared expert's row of each of the T tokens.
    out[t] = shared[t] + the routed rows of t in slot order: the shared row is slot 0 of
    `reduce_fused`'s float32 chain (0 + shared is exact), as `shared + routed_0 + routed_1`."""
    t = token_topk_to_pos.shape[0]
    shared_pos = torch.arange(rows.shape[0] - t, rows.shape[0], dtype=torch.int32, device=rows.device)
    slots = torch.cat([shared_pos[:, None], token_topk_to_pos], dim=1).contiguous()
    return ops.reduce_fused(rows, None, slots, backend=backend)


@step("embedding", "kernel", "token rows of the embedding table (ops.embedding)")
def embedding(weight: torch.Tensor, ids: torch.Tensor, backend: str) -> torch.Tensor:
    return ops.embedding(ids, weight, backend=backend)


@step("rms_norm", "kernel", "RMSNorm, weighted or not (ops.rms_norm)")
def rms_norm(module, x: torch.Tensor, eps: float | None, backend: str) -> torch.Tensor:
    """module(x) for an RMSNorm module, or with module None the unweighted normalisation."""
    if module is None:
        return ops.rms_norm(x, None, eps, backend=backend)
    return ops.rms_norm(x, module.weight, module.eps, backend=backend)


@step("rope", "kernel", "RoPE/YaRN rotation (ops.rotary_embedding)")
def rope(cos_sin: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor, positions: torch.Tensor, backend: str,
         inverse: bool = False) -> torch.Tensor:
    """x [1, N, (h,) d] rotated at positions [N] (one position per flattened token)."""
    cos, sin = cos_sin
    return ops.rotary_embedding(x, positions.expand(x.shape[:2]).contiguous(), cos, sin, inverse=inverse,
                                backend=backend)


@step("hadamard", "kernel", "Hadamard transform of the indexer q (ops.hadamard_transform)")
def hadamard(x: torch.Tensor, backend: str) -> torch.Tensor:
    return ops.hadamard_transform(x, backend=backend)


@step("hc_pre", "kernel", "hyper-connection pre mixing + Sinkhorn (ops.hc_pre)")
def hc_pre(block, streams: torch.Tensor, which: str, backend: str):
    """streams [1, N, M, D] -> (u [1, N, D], post [1, N, M], comb [1, N, M, M])."""
    fn, scale, base = (getattr(block, f"hc_{which}_{p}") for p in ("fn", "scale", "base"))
    return ops.hc_pre(streams, fn, scale, base, block.hc_iters, block.norm_eps, block.hc_eps, backend=backend)


@step("hc_post", "kernel", "hyper-connection post mixing (ops.hc_post)")
def hc_post(y: torch.Tensor, streams: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
            backend: str) -> torch.Tensor:
    return ops.hc_post(y, streams, post, comb, backend=backend)


@step("hc_head", "kernel", "final hyper-connection collapse (ops.hc_head)")
def hc_head(streams: torch.Tensor, fn, scale, base, norm_eps: float, hc_eps: float, backend: str) -> torch.Tensor:
    return ops.hc_head(streams, fn, scale, base, norm_eps, hc_eps, backend=backend)


@step("routing", "kernel", "expert choice and weights (ops.hash_gate / ops.top2_sum_gate)")
def routing(gate, logits: torch.Tensor, token_ids: torch.Tensor, backend: str):
    """`Gate.forward` from its logits [T, E] (float32): (topk_idx int64 [T, k], weights float32 [T, k]).

    Hash layers: `hash_gate` (experts `tid2eid[token]`). Scored layers: `top2_sum_gate`
    without groups, shared slots or EP/TP masking, which docs/kernels/routing.md states
    equals `Gate.forward` (weights renormalised, so the engine requires norm_topk_prob
    and sigmoid or sqrtsoftplus scoring for them)."""
    if gate.hash:
        return ops.hash_gate(logits, token_ids, gate.tid2eid, gate.route_scale, gate.scoring_func,
                             gate.norm_topk_prob, backend=backend)
    return ops.top2_sum_gate(logits, gate.bias.float().contiguous(), gate.topk, 0, 0, False, 0,
                             gate.route_scale, 0, 1, 0, 1, gate.scoring_func, backend=backend)


@step("moe_mapping", "kernel", "expert-major row mapping of the routed slots (ops.get_fused_mapping)")
def moe_mapping(topk_idx: torch.Tensor, num_experts: int, backend: str):
    return ops.get_fused_mapping(topk_idx, num_experts, 0, MOE_ALIGNMENT, backend=backend)


MOE_ALIGNMENT = 64  # the smaller of get_fused_mapping's two alignments: less padding per expert


@step("moe_expand", "kernel", "token rows copied to their experts' rows (ops.expand_to_fused)")
def moe_expand(x: torch.Tensor, token_topk_to_pos: torch.Tensor, pos_to_expert: torch.Tensor,
               backend: str) -> torch.Tensor:
    return ops.expand_to_fused(x, token_topk_to_pos, pos_to_expert, backend=backend)


@step("swiglu", "kernel", "expert activation with the routing weight (ops.swiglu)")
def swiglu(gate_up: torch.Tensor, weights: torch.Tensor | None, limit: float, backend: str) -> torch.Tensor:
    return ops.swiglu(gate_up, weights, limit, backend=backend)


@step("indexer_scores", "kernel", "indexer entry scores sum_h relu(q.k) * w (ops.indexer_scores)")
def indexer_scores(indexer, head_weights: torch.Tensor, q: torch.Tensor, keys: torch.Tensor,
                   backend: str) -> torch.Tensor:
    """head_weights [s, h] (weights_proj(x), a `linear` step), q [s, h, d], keys [n, d] -> float32
    scores [s, n], each summed in the reference's deterministic order (bits independent of s, n)."""
    return ops.indexer_scores(q.contiguous(), keys.contiguous(), head_weights.contiguous(), indexer.scale,
                              backend=backend)


@step("fp8_kv_quantize", "kernel", "KV -> FP8 MODEL1 page bytes (ops.fp8_kv_quantize)")
def fp8_kv_quantize(values: torch.Tensor, layout, backend: str | None) -> tuple[torch.Tensor, torch.Tensor]:
    """values [n, nope + rope] -> (data uint8 [n, token_bytes], scales uint8 [n, scale_bytes])."""
    return ops.fp8_kv_quantize(values.contiguous(), layout.nope, backend=backend)


@step("fp8_kv_dequantize", "kernel", "FP8 MODEL1 pages -> bf16 pages (ops.fp8_kv_dequantize)")
def fp8_kv_dequantize(buf: torch.Tensor, layout, backend: str | None) -> torch.Tensor:
    """uint8 [nb, page_bytes] -> bf16 [nb, block, 1, nope + rope]."""
    return ops.fp8_kv_dequantize(buf, layout.nope, layout.rope, layout.block_size, backend=backend)


@step("kv_fake_quant", "kernel", "QAT e4m3 rounding of the KV nope dims (ops.fake_quant_fp8)")
def kv_fake_quant(kv: torch.Tensor, rope_dim: int, backend: str) -> torch.Tensor:
    """kv [..., d]: the model's fake_quant_fp8 (blocks of 64) on the first d - rope_dim dims,
    the rope dims as they are (the kernel reads a contiguous copy of the nope dims)."""
    nope = ops.fake_quant_fp8(kv[..., :-rope_dim].contiguous(), backend=backend)
    return torch.cat([nope, kv[..., -rope_dim:]], dim=-1)


@step("indexer_fp4_round", "kernel", "QAT e2m1 rounding of the indexer q (ops.fake_quant_fp4)")
def indexer_fp4_round(q: torch.Tensor, backend: str) -> torch.Tensor:
    return ops.fake_quant_fp4(q.contiguous(), backend=backend)


@step("compressor_pool", "kernel", "gated pooling (ops.compressor_pool) + norm + rope + rounding of new entries")
def compressor_pool(comp, cos_sin: tuple[torch.Tensor, torch.Tensor], seq_kv: torch.Tensor,
                    seq_score: torch.Tensor, n_pool: int, chosen: torch.Tensor, entry_ids: torch.Tensor,
                    backend: str, ape: torch.Tensor | None = None) -> torch.Tensor:
    """seq_kv/seq_score [rows, width] (the plain `wgate(x)`: the kernel adds `ape` [ratio, width],
    `Weights.ape`; None: the compressor's own), block 0 being the one before the first pooled entry ->
    the pooled entries `chosen` [n] of n_pool, whose entry indices are `entry_ids` [n] -> [n, d]:
    `Compressor._pool` then `_finish` (RMSNorm, RoPE at each entry's block start
    entry_ids * ratio, then Hadamard + FP4 for the indexer's keys or FP8 on the nope dims for
    the main ones), each an op of its own; `cos_sin` is the compressor's RoPE table
    (`ops.rope_cos_sin`). Several sequences' rows may be stacked (the engine's `_compress`):
    `chosen` then skips the entries that straddle two of them."""
    if ape is None:
        ape = comp.ape.detach().to(seq_kv.dtype).contiguous()
    entries = ops.compressor_pool(seq_kv.contiguous(), seq_score.contiguous(), n_pool, comp.ratio, comp.overlap,
                                  ape, backend=backend)
    if chosen.numel() != n_pool:
        entries = entries[chosen]
    out = rope(cos_sin, rms_norm(comp.norm, entries[None], None, backend), entry_ids * comp.ratio, backend)
    if comp.rotate:  # indexer keys: Hadamard, then FP4 over all dims
        out = hadamard(out, backend)
        return (indexer_fp4_round(out, backend) if comp.fake_quant else out)[0]
    return (kv_fake_quant(out, comp.rope_dim, backend) if comp.fake_quant else out)[0]
