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
output, routed and shared experts) is `ops.fp32_gemm_nt` at the float32 model's dtype, or
`ops.bf16_gemm_nt` for a bf16 one: float32 products summed in float32, so against the
reference's `F.linear` only the summation order differs. The weights are made once by
`Weights` (dequantized, fused, contiguous) so no step converts a weight per call.
"""

from __future__ import annotations

import torch

from kernforge import ops
from kernforge.engine.steps import step
from kernforge.model.moe import Expert, Gate
from kernforge.model.primitives import Linear

_GEMM = {torch.float32: ops.fp32_gemm_nt, torch.bfloat16: ops.bf16_gemm_nt}


class Weights:
    """Every weight a GEMM step reads, dense, contiguous and in the activations' dtype, made
    once when the engine is built.

    Why: the reference dequantizes FP8/FP4 weights on every call (`Linear.dense_weight`) and
    concatenates nothing; the GEMM kernel wants one `[N, K]` operand. Quantized weights are
    dequantized here to the model's dtype, exactly as the reference's per-call dequantization
    (the FP8/FP4 GEMMs would round the activations to e4m3, which the reference does not);
    dense float32 ones are the parameters themselves (no copy). Experts get `[w1; w3]`, the
    fused layout `ops.swiglu` reads."""

    def __init__(self, model, dtype: torch.dtype):
        if dtype not in _GEMM:
            raise TypeError(f"model: the engine runs float32 or bf16 weights, got {dtype}")
        modules = list(model.modules())
        self._dense = {m: m.dense_weight(dtype).detach().contiguous() for m in modules if isinstance(m, Linear)}
        self._gate_up = {m: torch.cat([self[m.w1], self[m.w3]]).contiguous() for m in modules
                         if isinstance(m, Expert)}
        self._router = {m: m.weight.detach().to(dtype).contiguous() for m in modules if isinstance(m, Gate)}

    def __getitem__(self, module: Linear) -> torch.Tensor:
        return self._dense[module]

    def router(self, gate: Gate) -> torch.Tensor:
        """`Gate.weight` [E, D], in the activations' dtype."""
        return self._router[gate]

    def gate_up(self, expert: Expert) -> torch.Tensor:
        """`[w1; w3]` of an `Expert`: one GEMM gives `ops.swiglu`'s `[gate | up]` rows."""
        return self._gate_up[expert]


def gemm(weight: torch.Tensor, x: torch.Tensor, backend: str, add: torch.Tensor | None = None,
         out: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] @ weight [N, K]^T (+ add [..., N], added after the product, as the
    reference's `linear(x) + add`), into `out` [rows, N] when given."""
    rows = x.reshape(-1, x.shape[-1])
    if out is None:
        out = torch.empty(rows.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
    c = None if add is None else add.reshape(out.shape).contiguous()
    _GEMM[x.dtype](rows.contiguous(), weight, out, c, backend=backend)
    return out.view(*x.shape[:-1], weight.shape[0])


@step("linear", "kernel", "x W^T on the dense GEMM (ops.fp32_gemm_nt / ops.bf16_gemm_nt)")
def linear(weight: torch.Tensor, x: torch.Tensor, backend: str, add: torch.Tensor | None = None,
           out: torch.Tensor | None = None) -> torch.Tensor:
    return gemm(weight, x, backend, add, out)


@step("router_logits", "kernel", "gate logits x W_gate^T in float32 (ops.fp32_gemm_nt)")
def router_logits(weights: Weights, gate, x: torch.Tensor, backend: str) -> torch.Tensor:
    return gemm(weights.router(gate), x, backend).float()


@step("grouped_output", "kernel", "grouped low-rank output projection wo_a, one GEMM per group")
def grouped_output(weights: Weights, attn, o: torch.Tensor, backend: str) -> torch.Tensor:
    """o [1, N, h, d] -> [1, N, G*R]: group g's h/G heads times wo_a's rows g*R..(g+1)*R-1,
    as the reference's `_grouped_wo_a`."""
    groups = o.flatten(2).unflatten(-1, (attn.o_groups, -1))  # [1, N, G, h*d/G]
    w = weights[attn.wo_a].unflatten(0, (attn.o_groups, attn.o_lora_rank))
    return torch.cat([gemm(w[g], groups[:, :, g], backend) for g in range(attn.o_groups)], dim=-1)


@step("compressor_project", "kernel", "compressor kv/gate projections + position bias (the GEMM's c)")
def compressor_project(weights: Weights, comp, x: torch.Tensor, positions: torch.Tensor,
                       backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    bias = comp.ape[positions % comp.ratio].to(x.dtype)[None]
    return gemm(weights[comp.wkv], x, backend), gemm(weights[comp.wgate], x, backend, add=bias)


@step("expert_gemm", "kernel", "per-expert segment GEMMs (ops.fp32_gemm_nt per segment)")
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
