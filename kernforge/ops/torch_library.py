"""The ``kernforge.ops`` ops as torch custom ops: ``torch.ops.kernforge.<name>``.

The plain ops are Python functions over ctypes, so ``torch.compile`` breaks the graph
at each call (or fails with ``fullgraph=True``).  Registered here with
``torch.library.custom_op``, each op is one opaque node: torch.compile traces it with
the fake implementation below (output shapes and dtypes from the inputs' metadata,
nothing runs), functionalization orders the writes of the arguments it declares
mutated, and eager calls run the same Python op as before.

Schemas follow the Python signatures, with three adjustments custom ops need
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
* ``m_grouped_fp8_gemm_nt_contiguous``: the ``(data, scales)`` pairs are ``Tensor[]``
  (a tuple or list of two tensors, as DeepGEMM callers pass them).

Every op refuses inputs that require grad (inference only, see
:func:`kernforge.jit.kernel.register_torch_op`).  CUDA-graph capture needs ops whose
argument checks read no tensor data on the host: ``topk`` with
``abort_when_nan_found=False`` and no ``end``; the other ops validate index tensors on
the host (page ids, expert layouts, masks) and so synchronise (docs/torch-ops.md).
"""
from __future__ import annotations

import torch

from kernforge.jit.kernel import register_torch_op
from kernforge.ops import grouped_gemm, mla
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
m_grouped_fp8_gemm_nt_contiguous = register_torch_op(
    "kernforge::m_grouped_fp8_gemm_nt_contiguous", _fp8_contiguous,
    "(Tensor[] a, Tensor[] b, Tensor(a!) d, Tensor grouped_layout, int[]? recipe=None, "
    "int[]? recipe_a=None, int[]? recipe_b=None, str compiled_dims=\"nk\", "
    "bool disable_ue8m0_cast=False, bool use_psum_layout=False, bool ensure_zero_padding=True, "
    "int? expected_m_for_psum_layout=None, *, str? backend=None) -> ()",
    _writes_d_only, ("d",))
m_grouped_bf16_gemm_nt_masked = register_torch_op(
    "kernforge::m_grouped_bf16_gemm_nt_masked", _bf16_masked,
    "(Tensor a, Tensor b, Tensor(a!) d, Tensor masked_m, int expected_m, str compiled_dims=\"nk\", "
    "*, str? backend=None) -> ()",
    _writes_d_only, ("d",))

#: every op registered here, by name (``torch.ops.kernforge.<name>``)
OPS = {"topk": topk, "topk_into": topk_into, "flash_mla_with_kvcache": flash_mla_with_kvcache,
       "get_mla_metadata": get_mla_metadata,
       "m_grouped_bf16_gemm_nt_contiguous": m_grouped_bf16_gemm_nt_contiguous,
       "m_grouped_fp8_gemm_nt_contiguous": m_grouped_fp8_gemm_nt_contiguous,
       "m_grouped_bf16_gemm_nt_masked": m_grouped_bf16_gemm_nt_masked}
