"""User-facing ops with the signatures of the DeepSeek libraries they replace.

Switching is a one-line import change:

* ``deep_select.topk``                 -> ``kernforge.ops.topk``
* ``flash_mla.flash_mla_with_kvcache`` -> ``kernforge.ops.flash_mla_with_kvcache``
* ``deep_gemm.m_grouped_*``            -> ``kernforge.ops.m_grouped_*``

Each op checks its inputs before launch (typed errors), picks a kernel
configuration, and runs the kernel on ``backend=`` (default: by the tensor's
device).  What they share at the edges (NaN propagates as torch does, or topk's typed
NaN error; empty batches give empty results; inapplicable flags raise) is
docs/ops.md.
"""
from kernforge.ops.grouped_gemm import (get_k_alignment_for_contiguous_layout,
                                        get_m_alignment_for_contiguous_layout,
                                        get_mk_alignment_for_contiguous_layout,
                                        m_grouped_bf16_gemm_nt_contiguous,
                                        m_grouped_bf16_gemm_nt_masked,
                                        m_grouped_fp8_gemm_nt_contiguous,
                                        m_grouped_gemm_fp8_fp8_bf16_nt_contiguous,
                                        set_mk_alignment_for_contiguous_layout)
# DeepGEMM's dense and FP8/FP4 grouped GEMMs (docs/kernels/gemm.md); the legacy names stay out of __all__
from kernforge.ops.gemm import (fp8_fp4_gemm_nn, fp8_fp4_gemm_nt, fp8_fp4_gemm_tn, fp8_fp4_gemm_tt,  # noqa: F401
                                fp8_gemm_nn, fp8_gemm_nt, fp8_gemm_tn, fp8_gemm_tt, gemm_fp8_fp8_bf16_nt)
# unscaled dense GEMMs: DeepGEMM's bf16_gemm_*, and fp32_gemm_* for the float32 engine (docs/kernels/gemm.md)
from kernforge.ops.gemm import (bf16_gemm_nn, bf16_gemm_nt, bf16_gemm_tn, bf16_gemm_tt,  # noqa: F401
                                fp32_gemm_nn, fp32_gemm_nt, fp32_gemm_tn, fp32_gemm_tt)
from kernforge.ops.grouped_gemm import (fp8_m_grouped_gemm_nt_masked, m_grouped_fp8_fp4_gemm_nt_contiguous,  # noqa: F401
                                        m_grouped_fp8_fp4_gemm_nt_masked, m_grouped_fp8_gemm_nt_masked,
                                        m_grouped_gemm_fp8_fp8_bf16_nt_masked)
from kernforge.ops.mla import FlashMLASchedMeta, flash_mla_with_kvcache, get_mla_metadata
# MoE permutation and the expert activation (docs/kernels/moe_permute.md)
from kernforge.ops.moe import (expand_to_fused, expand_to_fused_with_sf, get_fused_mapping,  # noqa: F401
                               reduce_fused, swiglu)
# the dense-layer steps (docs/kernels/layers.md); not in __all__ until torch_library registers them
from kernforge.ops.layers import (LayerIndexError, LayerTypeError, LayerValueError, embedding,  # noqa: F401
                                 hadamard_transform, hc_head, hc_post, hc_pre, rms_norm, rope_cos_sin,
                                 rotary_embedding)
# MoE quantisation and routing (docs/kernels/quant.md, routing.md); in __all__ once torch_library registers them
from kernforge.ops.quant import (QuantTypeError, QuantValueError, fake_quant_fp4, fake_quant_fp8,  # noqa: F401
                                 per_block_cast_to_fp8, per_token_cast_to_fp4, per_token_cast_to_fp8)
from kernforge.ops.routing import (RoutingNonFiniteError, RoutingTypeError, RoutingValueError,  # noqa: F401
                                   hash_gate, normalize_weight, top2_sum_gate, topk_gate)
from kernforge.ops.topk import get_stride_requirement, topk
# the indexer scores and FP8 KV pages (docs/engine.md); not in __all__ until torch_library registers them
from kernforge.ops.indexer import IndexerTypeError, IndexerValueError, indexer_scores  # noqa: F401
from kernforge.ops.kv_quant import (KVQuantTypeError, KVQuantValueError, fp8_kv_dequantize,  # noqa: F401
                                    fp8_kv_quantize)
# the compressor's pooling (docs/engine.md); not in __all__ until torch_library registers it
from kernforge.ops.compressor import CompressorTypeError, CompressorValueError, compressor_pool  # noqa: F401
from kernforge.ops import torch_library  # noqa: F401  (registers torch.ops.kernforge.*)

__all__ = [
    "FlashMLASchedMeta", "flash_mla_with_kvcache", "get_k_alignment_for_contiguous_layout",
    "get_m_alignment_for_contiguous_layout", "get_mk_alignment_for_contiguous_layout",
    "get_mla_metadata", "get_stride_requirement", "m_grouped_bf16_gemm_nt_contiguous",
    "m_grouped_bf16_gemm_nt_masked", "m_grouped_fp8_gemm_nt_contiguous",
    "m_grouped_gemm_fp8_fp8_bf16_nt_contiguous", "set_mk_alignment_for_contiguous_layout", "topk",
    # the MoE ops and the dense FP8 GEMMs (torch.ops.kernforge.* too)
    "m_grouped_fp8_fp4_gemm_nt_contiguous", "m_grouped_fp8_fp4_gemm_nt_masked", "m_grouped_fp8_gemm_nt_masked",
    "fp8_gemm_nt", "fp8_gemm_nn", "fp8_gemm_tn", "fp8_gemm_tt",
    "fp8_fp4_gemm_nt", "fp8_fp4_gemm_nn", "fp8_fp4_gemm_tn", "fp8_fp4_gemm_tt",
    "per_token_cast_to_fp8", "per_block_cast_to_fp8", "per_token_cast_to_fp4",
    "topk_gate", "top2_sum_gate", "normalize_weight", "hash_gate",
    "get_fused_mapping", "expand_to_fused", "expand_to_fused_with_sf", "reduce_fused", "swiglu",
]
