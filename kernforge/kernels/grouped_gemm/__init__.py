"""MoE grouped GEMM (DeepGEMM's M-grouped layouts): the kernel family as a package.

* :mod:`.kernel`: the DSL factories (contiguous bf16, contiguous fp8, masked);
* :mod:`.reference`: float64 torch references and DeepGEMM's FP8 casting recipes;
* :mod:`.problems`: the catalogue entries, layouts, inputs and error bounds;
* :mod:`.config`: the tile-size choosers, used by :mod:`kernforge.ops.grouped_gemm`
  and the catalogue alike.
"""
from kernforge.kernels.grouped_gemm import config
from kernforge.kernels.grouped_gemm.config import choose, choose_fp8, choose_masked
from kernforge.kernels.grouped_gemm.kernel import (m_grouped_fp8_gemm_nt_contiguous, m_grouped_gemm_nt_contiguous,
                                                  m_grouped_gemm_nt_masked)
from kernforge.kernels.grouped_gemm.problems import (FP4_FOLD_ROUNDING, SPEC, SPEC_FP8, SPEC_MASKED, assert_close,
                                                    contiguous_layout, error_bound, make_inputs, make_inputs_fp8, make_inputs_masked)
from kernforge.kernels.grouped_gemm.reference import (dequantize, per_block_cast_to_fp8, per_token_cast_to_fp8,
                                                     reference, reference_masked)

__all__ = ["FP4_FOLD_ROUNDING", "SPEC", "SPEC_FP8", "SPEC_MASKED", "assert_close", "choose", "choose_fp8", "choose_masked", "config",
           "contiguous_layout", "dequantize", "error_bound", "m_grouped_fp8_gemm_nt_contiguous",
           "m_grouped_gemm_nt_contiguous", "m_grouped_gemm_nt_masked", "make_inputs", "make_inputs_fp8",
           "make_inputs_masked", "per_block_cast_to_fp8", "per_token_cast_to_fp8", "reference", "reference_masked"]
