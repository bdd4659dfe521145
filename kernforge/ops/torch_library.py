"""The ``kernforge.ops`` ops as torch custom ops: ``torch.ops.kernforge.<name>``.

The plain ops are Python functions over ctypes, so ``torch.compile`` breaks the graph
at each call (or fails with ``fullgraph=True``).  Registered here with
``torch.library.custom_op``, each op is one opaque node: torch.compile traces it with
the fake implementation below (output shapes and dtypes from the inputs' metadata,
nothing runs), functionalization orders the writes of the arguments it declares
mutated, and eager calls run the same Python op as before.

Schemas follow the Python signatures, with the adjustments custom ops need
(docs/torch-ops.md lists them):

* ``topk``: a custom op's output may not alias an input, so ``topk`` always returns new
  tensors and ``output_idx`` goes to ``topk_into(input, topk, output_idx, ...)``, which
  writes it (declared mutated) and returns the values (``(b, 0)`` with
  ``return_value=False``: a mutating op's outputs must be tensors);
  ``value_oob_fill_value`` defaults to ``None`` (= ``-inf``: a schema default cannot be
  infinite).
* ``flash_mla_with_kvcache``: ``tile_scheduler_metadata`` is a tensor or ``None``
  (a :class:`~kernforge.ops.mla.FlashMLASchedMeta` is a Python object no op can take);
  ``get_mla_metadata`` returns an empty int32 placeholder tensor for that slot.
* the FP8/FP4 GEMMs and ``expand_to_fused_with_sf``: the ``(data, scales)`` pairs are
  ``Tensor[]`` (a tuple or list of two tensors, as DeepGEMM callers pass them).
* ``get_fused_mapping`` returns its seven tensors, not the host list
  (``num_tokens_per_expert.tolist()``); with ``num_expanded_tokens=0`` the rows' count is
  data-dependent (an unbacked size under torch.compile, as ``nonzero``'s).
  ``reduce_fused`` takes ``x_sf`` as an argument of its own (a schema cannot take a tensor
  or a pair) and has no ``out``; ``swiglu`` always returns ``(out, out_sf or None)``.

Every op refuses inputs that require grad (inference only, see
:func:`kernforge.jit.kernel.register_torch_op`).  CUDA-graph capture needs ops whose
argument checks read no tensor data on the host: ``topk`` with
``abort_when_nan_found=False`` and no ``end``; the other ops validate index tensors on
the host (page ids, expert layouts, masks) and so synchronise (docs/torch-ops.md).
"""
from __future__ import annotations

import torch

from kernforge.jit.kernel import register_torch_op
from kernforge.ops import gemm, grouped_gemm, mla, moe, quant, routing
from kernforge.ops.topk import INT32_MAX, TopKValueError, _padded_empty
from kernforge.ops.topk import topk as _topk_op

# ---------------------------------------------------------------- topk


def _topk_run(input, topk, sorted=False, begin=None, end=None, indices_type=torch.int64,
              sorted_index=False, hint=None, output_idx=None, output_idx_offset=None,
              idx_oob_fill_value=INT32_MAX, value_oob_fill_value=None, return_value=True,
              abort_when_nan_found=True, backend=None):
    if output_idx is not None:
        raise TopKValueError("torch.ops.kernforge.topk returns new tensors (a custom op's "
                               "output may not alias an input): pass output_idx to "
                               "torch.ops.kernforge.topk_into instead")
    return _topk_op(input, topk, sorted, begin, end, indices_type, sorted_index, hint, None,
                    output_idx_offset, idx_oob_fill_value, _fill(value_oob_fill_value), return_value,
                    abort_when_nan_found, backend=backend)


def _topk_fake(input, topk, sorted=False, begin=None, end=None, indices_type=torch.int64,
               sorted_index=False, hint=None, output_idx=None, output_idx_offset=None,
               idx_oob_fill_value=INT32_MAX, value_oob_fill_value=None, return_value=True,
               abort_when_nan_found=True, backend=None):
    b = input.shape[0]
    # the real op's layout: (b, topk) views of rows padded to 32 bytes
    values = _padded_empty(b, topk, input.dtype, input.device) if return_value else None
    return values, _padded_empty(b, topk, indices_type, input.device)


def _topk_into_run(input, topk, output_idx, sorted=False, begin=None, end=None, sorted_index=False,
                   hint=None, output_idx_offset=None, idx_oob_fill_value=INT32_MAX,
                   value_oob_fill_value=None, return_value=True, abort_when_nan_found=True,
                   backend=None):
    values, _ = _topk_op(input, topk, sorted, begin, end, output_idx.dtype, sorted_index, hint,
                         output_idx, output_idx_offset, idx_oob_fill_value,
                         _fill(value_oob_fill_value), return_value, abort_when_nan_found,
                         backend=backend)
    return values if values is not None else input.new_empty((input.shape[0], 0))


def _topk_into_fake(input, topk, output_idx, sorted=False, begin=None, end=None, sorted_index=False,
                    hint=None, output_idx_offset=None, idx_oob_fill_value=INT32_MAX,
                    value_oob_fill_value=None, return_value=True, abort_when_nan_found=True,
                    backend=None):
    if not return_value:
        return input.new_empty((input.shape[0], 0))
    return _padded_empty(input.shape[0], topk, input.dtype, input.device)


def _fill(value):
    """``None`` stands for ``-inf``, DeepSelect's default: a schema default cannot be infinite."""
    return float("-inf") if value is None else value


_TOPK_TAIL = (f"Tensor? output_idx_offset=None, int idx_oob_fill_value={INT32_MAX}, "
              "float? value_oob_fill_value=None, bool return_value=True, "
              "bool abort_when_nan_found=True, str? backend=None)")
topk = register_torch_op(
    "kernforge::topk", _topk_run,
    "(Tensor input, int topk, bool sorted=False, Tensor? begin=None, Tensor? end=None, "
    "ScalarType indices_type=long, bool sorted_index=False, Tensor? hint=None, "
    "Tensor? output_idx=None, " + _TOPK_TAIL + " -> (Tensor?, Tensor)",
    _topk_fake)
topk_into = register_torch_op(
    "kernforge::topk_into", _topk_into_run,
    "(Tensor input, int topk, Tensor(a!) output_idx, bool sorted=False, Tensor? begin=None, "
    "Tensor? end=None, bool sorted_index=False, Tensor? hint=None, " + _TOPK_TAIL + " -> Tensor",
    _topk_into_fake, ("output_idx",))

# ---------------------------------------------------------------- FlashMLA


def _mla_run(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata=None,
             num_splits=None, softmax_scale=None, causal=False, is_fp8_kvcache=False, indices=None,
             attn_sink=None, extra_k_cache=None, extra_indices_in_kvcache=None, topk_length=None,
             extra_topk_length=None, *, backend=None, num_kv_splits=None):
    return mla.flash_mla_with_kvcache(
        q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata, num_splits,
        softmax_scale, causal, is_fp8_kvcache, indices, attn_sink, extra_k_cache,
        extra_indices_in_kvcache, topk_length, extra_topk_length, backend=backend,
        num_kv_splits=num_kv_splits)


def _mla_fake(q, k_cache, block_table, cache_seqlens, head_dim_v, *args, **kwargs):
    b, s_q, h_q, _ = q.shape
    return (q.new_empty((b, s_q, h_q, head_dim_v)),
            q.new_empty((b, h_q, s_q), dtype=torch.float32))


flash_mla_with_kvcache = register_torch_op(
    "kernforge::flash_mla_with_kvcache", _mla_run,
    "(Tensor q, Tensor k_cache, Tensor? block_table, Tensor? cache_seqlens, int head_dim_v, "
    "Tensor? tile_scheduler_metadata=None, Tensor? num_splits=None, float? softmax_scale=None, "
    "bool causal=False, bool is_fp8_kvcache=False, Tensor? indices=None, Tensor? attn_sink=None, "
    "Tensor? extra_k_cache=None, Tensor? extra_indices_in_kvcache=None, Tensor? topk_length=None, "
    "Tensor? extra_topk_length=None, *, str? backend=None, int? num_kv_splits=None) -> (Tensor, Tensor)",
    _mla_fake)


def _metadata_run(cache_seqlens=None, num_q_tokens_per_head_k=None, num_heads_k=None,
                  num_heads_q=None, is_fp8_kvcache=False, topk=None):
    """kernforge keeps no per-request schedule (see :func:`kernforge.ops.mla.get_mla_metadata`):
    an empty tensor stands in the ``tile_scheduler_metadata`` slot, ``num_splits`` is None."""
    device = cache_seqlens.device if cache_seqlens is not None else "cpu"
    return torch.empty(0, dtype=torch.int32, device=device), None


get_mla_metadata = register_torch_op(
    "kernforge::get_mla_metadata", _metadata_run,
    "(Tensor? cache_seqlens=None, int? num_q_tokens_per_head_k=None, int? num_heads_k=None, "
    "int? num_heads_q=None, bool is_fp8_kvcache=False, int? topk=None) -> (Tensor, Tensor?)",
    _metadata_run)

# ---------------------------------------------------------------- DeepGEMM grouped GEMMs


def _bf16_contiguous(a, b, d, grouped_layout, compiled_dims="nk", use_psum_layout=False,
                     ensure_zero_padding=True, expected_m_for_psum_layout=None, *, backend=None):
    grouped_gemm.m_grouped_bf16_gemm_nt_contiguous(
        a, b, d, grouped_layout, compiled_dims, use_psum_layout, ensure_zero_padding,
        expected_m_for_psum_layout, backend=backend)


def _fp8_contiguous(a, b, d, grouped_layout, recipe=None, recipe_a=None, recipe_b=None,
                    compiled_dims="nk", disable_ue8m0_cast=False, use_psum_layout=False,
                    ensure_zero_padding=True, expected_m_for_psum_layout=None, *, backend=None):
    grouped_gemm.m_grouped_fp8_gemm_nt_contiguous(
        tuple(a), tuple(b), d, grouped_layout, recipe, recipe_a, recipe_b, compiled_dims,
        disable_ue8m0_cast, use_psum_layout, ensure_zero_padding, expected_m_for_psum_layout,
        backend=backend)


def _bf16_masked(a, b, d, masked_m, expected_m, compiled_dims="nk", *, backend=None):
    grouped_gemm.m_grouped_bf16_gemm_nt_masked(a, b, d, masked_m, expected_m, compiled_dims,
                                               backend=backend)


def _writes_d_only(*args, **kwargs) -> None:
    """The grouped GEMMs return nothing: their one effect is writing ``d`` (declared mutated)."""


_CONTIGUOUS_TAIL = ("str compiled_dims=\"nk\", bool use_psum_layout=False, bool ensure_zero_padding=True, "
                    "int? expected_m_for_psum_layout=None, *, str? backend=None) -> ()")
m_grouped_bf16_gemm_nt_contiguous = register_torch_op(
    "kernforge::m_grouped_bf16_gemm_nt_contiguous", _bf16_contiguous,
    "(Tensor a, Tensor b, Tensor(a!) d, Tensor grouped_layout, " + _CONTIGUOUS_TAIL,
    _writes_d_only, ("d",))
_FP8_CONTIGUOUS = ("(Tensor[] a, Tensor[] b, Tensor(a!) d, Tensor grouped_layout, int[]? recipe=None, "
                   "int[]? recipe_a=None, int[]? recipe_b=None, str compiled_dims=\"nk\", "
                   "bool disable_ue8m0_cast=False, bool use_psum_layout=False, bool ensure_zero_padding=True, "
                   "int? expected_m_for_psum_layout=None, *, str? backend=None) -> ()")
m_grouped_fp8_gemm_nt_contiguous = register_torch_op(
    "kernforge::m_grouped_fp8_gemm_nt_contiguous", _fp8_contiguous, _FP8_CONTIGUOUS, _writes_d_only, ("d",))
m_grouped_bf16_gemm_nt_masked = register_torch_op(
    "kernforge::m_grouped_bf16_gemm_nt_masked", _bf16_masked,
    "(Tensor a, Tensor b, Tensor(a!) d, Tensor masked_m, int expected_m, str compiled_dims=\"nk\", "
    "*, str? backend=None) -> ()",
    _writes_d_only, ("d",))

m_grouped_fp8_fp4_gemm_nt_contiguous = register_torch_op(   # DeepGEMM's HEAD name: the same op, FP8 or FP4 b
    "kernforge::m_grouped_fp8_fp4_gemm_nt_contiguous", _fp8_contiguous, _FP8_CONTIGUOUS, _writes_d_only, ("d",))


def _fp8_fp4_masked(a, b, d, masked_m, expected_m, recipe=None, recipe_a=None, recipe_b=None,
                    compiled_dims="nk", disable_ue8m0_cast=False, *, backend=None):
    grouped_gemm.m_grouped_fp8_fp4_gemm_nt_masked(
        tuple(a), tuple(b), d, masked_m, expected_m, recipe, recipe_a, recipe_b, compiled_dims,
        disable_ue8m0_cast, backend=backend)


_MASKED_FP8 = ("(Tensor[] a, Tensor[] b, Tensor(a!) d, Tensor masked_m, int expected_m, int[]? recipe=None, "
               "int[]? recipe_a=None, int[]? recipe_b=None, str compiled_dims=\"nk\", "
               "bool disable_ue8m0_cast=False, *, str? backend=None) -> ()")
m_grouped_fp8_fp4_gemm_nt_masked = register_torch_op(
    "kernforge::m_grouped_fp8_fp4_gemm_nt_masked", _fp8_fp4_masked, _MASKED_FP8, _writes_d_only, ("d",))
m_grouped_fp8_gemm_nt_masked = register_torch_op(   # DeepGEMM's FP8 name of the same op
    "kernforge::m_grouped_fp8_gemm_nt_masked", _fp8_fp4_masked, _MASKED_FP8, _writes_d_only, ("d",))

# ---------------------------------------------------------------- DeepGEMM dense FP8 / FP8xFP4 GEMMs


def _dense_fp8(layout: str):
    """The runner of ``fp8_fp4_gemm_<layout>``: the ``(data, scales)`` pairs arrive as lists."""
    fn = getattr(gemm, f"fp8_fp4_gemm_{layout}")

    def run(a, b, d, c=None, recipe=None, recipe_a=None, recipe_b=None, compiled_dims=_dense_dims(layout),
            disable_ue8m0_cast=False, *, backend=None):
        fn(tuple(a), tuple(b), d, c, recipe, recipe_a, recipe_b, compiled_dims, disable_ue8m0_cast,
           backend=backend)
    return run


def _dense_dims(layout: str) -> str:
    return "mn" if layout[0] == "t" else "nk"   # DeepGEMM's defaults: tn / tt compile M and N


def _dense_schema(layout: str) -> str:
    dims = _dense_dims(layout)
    return ("(Tensor[] a, Tensor[] b, Tensor(a!) d, Tensor? c=None, int[]? recipe=None, int[]? recipe_a=None, "
            f"int[]? recipe_b=None, str compiled_dims=\"{dims}\", bool disable_ue8m0_cast=False, *, "
            "str? backend=None) -> ()")


_DENSE = {f"{prefix}_{layout}": register_torch_op(f"kernforge::{prefix}_{layout}", _dense_fp8(layout),
                                                  _dense_schema(layout), _writes_d_only, ("d",))
          for prefix in ("fp8_gemm", "fp8_fp4_gemm") for layout in ("nt", "nn", "tn", "tt")}

# ---------------------------------------------------------------- activation quantisation


def _cast_fp8_fake(x, use_ue8m0=False, *, backend=None):
    data = x.new_empty(x.shape, dtype=torch.float8_e4m3fn)
    return data, x.new_empty((*x.shape[:-1], -(-x.shape[-1] // 128)), dtype=torch.float32)


def _block_fp8_fake(x, use_ue8m0=False, *, backend=None):
    data = x.new_empty(x.shape, dtype=torch.float8_e4m3fn)
    n, k = x.shape[-2:]
    return data, x.new_empty((*x.shape[:-2], -(-n // 128), -(-k // 128)), dtype=torch.float32)


def _cast_fp4_fake(x, *, backend=None):
    k = x.shape[-1]
    return (x.new_empty((*x.shape[:-1], k // 2), dtype=torch.int8),
            x.new_empty((*x.shape[:-1], -(-k // 32)), dtype=torch.float32))


per_token_cast_to_fp8 = register_torch_op(
    "kernforge::per_token_cast_to_fp8", quant.per_token_cast_to_fp8,
    "(Tensor x, bool use_ue8m0=False, *, str? backend=None) -> (Tensor, Tensor)", _cast_fp8_fake)
per_block_cast_to_fp8 = register_torch_op(
    "kernforge::per_block_cast_to_fp8", quant.per_block_cast_to_fp8,
    "(Tensor x, bool use_ue8m0=False, *, str? backend=None) -> (Tensor, Tensor)", _block_fp8_fake)
per_token_cast_to_fp4 = register_torch_op(
    "kernforge::per_token_cast_to_fp4", quant.per_token_cast_to_fp4,
    "(Tensor x, *, str? backend=None) -> (Tensor, Tensor)", _cast_fp4_fake)

# ---------------------------------------------------------------- routing


def _topk_gate_fake(scores, num_topk, *, backend=None):
    return scores.new_empty((scores.shape[0], num_topk), dtype=torch.int64)


def _top2_sum_gate_fake(logits, bias, num_topk, num_topk_groups, num_groups, use_shared_as_routed,
                        num_shared_experts, *args, **kwargs):
    slots = num_topk + (num_shared_experts if use_shared_as_routed else 0)
    return (logits.new_empty((logits.shape[0], slots), dtype=torch.int64),
            logits.new_empty((logits.shape[0], slots), dtype=torch.float32))


def _normalize_weight_fake(w, *, backend=None):
    return w.new_empty((w.shape[0],)), torch.empty_like(w)


def _hash_gate_fake(logits, token_ids, tid2eid, *args, **kwargs):
    shape = (logits.shape[0], tid2eid.shape[1])
    return logits.new_empty(shape, dtype=torch.int64), logits.new_empty(shape, dtype=torch.float32)


topk_gate = register_torch_op(
    "kernforge::topk_gate", routing.topk_gate, "(Tensor scores, int num_topk, *, str? backend=None) -> Tensor",
    _topk_gate_fake)
top2_sum_gate = register_torch_op(
    "kernforge::top2_sum_gate", routing.top2_sum_gate,
    "(Tensor logits, Tensor bias, int num_topk, int num_topk_groups, int num_groups, bool use_shared_as_routed, "
    "int num_shared_experts, float routed_scaling_factor, int ep_rank, int num_ep_ranks, int tp_rank, "
    "int num_tp_ranks, str scoring_func, Tensor? mask=None, Tensor? fix_routing_mask=None, "
    "Tensor? to_physical_map=None, Tensor? logical_count=None, Tensor(a!)? unmapped_topk_idx=None, *, "
    "str? backend=None) -> (Tensor, Tensor)",
    _top2_sum_gate_fake, ("unmapped_topk_idx",))
normalize_weight = register_torch_op(
    "kernforge::normalize_weight", routing.normalize_weight, "(Tensor w, *, str? backend=None) -> (Tensor, Tensor)",
    _normalize_weight_fake)
hash_gate = register_torch_op(
    "kernforge::hash_gate", routing.hash_gate,
    "(Tensor logits, Tensor token_ids, Tensor tid2eid, float routed_scaling_factor, "
    "str scoring_func=\"sqrtsoftplus\", bool norm_topk_prob=True, *, str? backend=None) -> (Tensor, Tensor)",
    _hash_gate_fake)

# ---------------------------------------------------------------- MoE permutation and SwiGLU


def _mapping_run(topk_idx, num_experts, num_expanded_tokens, alignment, force_no_sync=False, *, backend=None):
    """The seven tensors; the host list (the eighth result) is ``num_tokens_per_expert.tolist()``."""
    return moe.get_fused_mapping(topk_idx, num_experts, num_expanded_tokens, alignment, force_no_sync,
                                 backend=backend)[:7]


def _mapping_fake(topk_idx, num_experts, num_expanded_tokens, alignment, force_no_sync=False, *, backend=None):
    # num_expanded_tokens = 0 trims the rows to the routing's total, known only after the run
    n = num_expanded_tokens or torch.library.get_ctx().new_dynamic_size()
    rows = [topk_idx.new_empty((n,), dtype=torch.int32) for _ in range(3)]
    experts = [topk_idx.new_empty((num_experts,), dtype=torch.int32) for _ in range(3)]
    return (*rows, topk_idx.new_empty(topk_idx.shape, dtype=torch.int32), *experts)


def _expand_fake(x, token_topk_to_pos, pos_to_expert, *, backend=None):
    return x.new_empty((pos_to_expert.shape[0], x.shape[1]))


def _expand_sf_fake(x, num_per_channels, token_topk_to_pos, pos_to_expert, use_tma_aligned_col_major_sf=False, *,
                    backend=None):
    data, sf = x
    n = pos_to_expert.shape[0]
    cols = sf.shape[1]
    if use_tma_aligned_col_major_sf:   # the real op's layout: an [N, S] view of an [S, align(N, 4)] store
        return data.new_empty((n, data.shape[1])), sf.new_empty((cols, -(-n // 4) * 4))[:, :n].T
    return data.new_empty((n, data.shape[1])), sf.new_empty((n, cols))


def _reduce_run(x, topk_weights, token_topk_to_pos, fp8_format="", sf=None, x_sf=None, *, backend=None):
    """``x_sf`` is an argument of its own: a schema cannot take ``x`` as a tensor or a pair."""
    return moe.reduce_fused(x if x_sf is None else (x, x_sf), topk_weights, token_topk_to_pos, fp8_format, sf,
                            backend=backend)


def _reduce_fake(x, topk_weights, token_topk_to_pos, fp8_format="", sf=None, x_sf=None, *, backend=None):
    dtype = torch.float8_e4m3fn if fp8_format == "e4m3" else x.dtype
    return x.new_empty((token_topk_to_pos.shape[0], x.shape[1]), dtype=dtype)


def _swiglu_run(x, weights=None, swiglu_limit=0.0, quantize=False, *, backend=None):
    out = moe.swiglu(x, weights, swiglu_limit, quantize, backend=backend)
    return out if quantize else (out, None)


def _swiglu_fake(x, weights=None, swiglu_limit=0.0, quantize=False, *, backend=None):
    m, inter = x.shape[0], x.shape[1] // 2
    if not quantize:
        return x.new_empty((m, inter)), None
    return (x.new_empty((m, inter), dtype=torch.float8_e4m3fn),
            x.new_empty((m, inter // 128), dtype=torch.float32))


get_fused_mapping = register_torch_op(
    "kernforge::get_fused_mapping", _mapping_run,
    "(Tensor topk_idx, int num_experts, int num_expanded_tokens, int alignment, bool force_no_sync=False, *, "
    "str? backend=None) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)",
    _mapping_fake)
expand_to_fused = register_torch_op(
    "kernforge::expand_to_fused", moe.expand_to_fused,
    "(Tensor x, Tensor token_topk_to_pos, Tensor pos_to_expert, *, str? backend=None) -> Tensor", _expand_fake)
expand_to_fused_with_sf = register_torch_op(
    "kernforge::expand_to_fused_with_sf", moe.expand_to_fused_with_sf,
    "(Tensor[] x, int num_per_channels, Tensor token_topk_to_pos, Tensor pos_to_expert, "
    "bool use_tma_aligned_col_major_sf=False, *, str? backend=None) -> (Tensor, Tensor)",
    _expand_sf_fake)
reduce_fused = register_torch_op(
    "kernforge::reduce_fused", _reduce_run,
    "(Tensor x, Tensor? topk_weights, Tensor token_topk_to_pos, str fp8_format=\"\", Tensor? sf=None, "
    "Tensor? x_sf=None, *, str? backend=None) -> Tensor",
    _reduce_fake)
swiglu = register_torch_op(
    "kernforge::swiglu", _swiglu_run,
    "(Tensor x, Tensor? weights=None, float swiglu_limit=0.0, bool quantize=False, *, str? backend=None) "
    "-> (Tensor, Tensor?)",
    _swiglu_fake)

#: every op registered here, by name (``torch.ops.kernforge.<name>``)
OPS = {"topk": topk, "topk_into": topk_into, "flash_mla_with_kvcache": flash_mla_with_kvcache,
       "get_mla_metadata": get_mla_metadata,
       "m_grouped_bf16_gemm_nt_contiguous": m_grouped_bf16_gemm_nt_contiguous,
       "m_grouped_fp8_gemm_nt_contiguous": m_grouped_fp8_gemm_nt_contiguous,
       "m_grouped_bf16_gemm_nt_masked": m_grouped_bf16_gemm_nt_masked,
       "m_grouped_fp8_fp4_gemm_nt_contiguous": m_grouped_fp8_fp4_gemm_nt_contiguous,
       "m_grouped_fp8_fp4_gemm_nt_masked": m_grouped_fp8_fp4_gemm_nt_masked,
       "m_grouped_fp8_gemm_nt_masked": m_grouped_fp8_gemm_nt_masked, **_DENSE,
       "per_token_cast_to_fp8": per_token_cast_to_fp8, "per_block_cast_to_fp8": per_block_cast_to_fp8,
       "per_token_cast_to_fp4": per_token_cast_to_fp4, "topk_gate": topk_gate, "top2_sum_gate": top2_sum_gate,
       "normalize_weight": normalize_weight, "hash_gate": hash_gate, "get_fused_mapping": get_fused_mapping,
       "expand_to_fused": expand_to_fused, "expand_to_fused_with_sf": expand_to_fused_with_sf,
       "reduce_fused": reduce_fused, "swiglu": swiglu}
