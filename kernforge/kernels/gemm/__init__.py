"""Dense block-scaled GEMMs (DeepGEMM's ``fp8_gemm_*`` / ``fp8_fp4_gemm_*``): the kernel family.

* :mod:`.kernel`: the DSL factories (FP8 x FP8 in four majors, FP8 x FP4, and the unscaled
  bf16/float32 ``dense_gemm`` of ``bf16_gemm_*``/``fp32_gemm_*``) and the FP4 decoder the
  grouped family shares;
* :mod:`.reference`: DeepGEMM's casting recipes and layout helpers, float64 references,
  ``calc_diff``;
* :mod:`.problems`: the catalogue entries (registered through ``kernels.registry``);
* :mod:`.config`: the tile chooser, used by :mod:`kernforge.ops.gemm` and the catalogue.
"""
from kernforge.kernels.gemm import config
from kernforge.kernels.gemm.kernel import decode_fp4_tile, dense_gemm, fp4_value, fp8_fp4_gemm, fp8_gemm
from kernforge.kernels.gemm.reference import (calc_diff, ceil_to_ue8m0, dequantize, dequantize_fp4,
                                              get_mn_major_tma_aligned_tensor, get_tma_aligned_size, pack_fp4,
                                              pack_ue8m0_to_int, per_block_cast_to_fp8, per_token_cast_to_fp4,
                                              per_token_cast_to_fp8, reference, unpack_ue8m0_from_int)

__all__ = ["calc_diff", "ceil_to_ue8m0", "config", "decode_fp4_tile", "dense_gemm", "dequantize", "dequantize_fp4",
           "fp4_value", "fp8_fp4_gemm", "fp8_gemm", "get_mn_major_tma_aligned_tensor", "get_tma_aligned_size",
           "pack_fp4", "pack_ue8m0_to_int", "per_block_cast_to_fp8", "per_token_cast_to_fp4", "per_token_cast_to_fp8",
           "reference", "unpack_ue8m0_from_int"]
