"""MoE quantisation (DeepGEMM's FP8 recipes, V4's FP4 format): the kernel family as a package.

* :mod:`.kernel`: the DSL factories :func:`per_token_cast`, :func:`per_block_cast`,
  :func:`per_token_cast_fp4`, and the model's QAT roundings :func:`fake_quant_e4m3`,
  :func:`fake_quant_e2m1` (values rounded to the format and back, in x's dtype);
* :mod:`.reference`: the torch references (DeepGEMM's FP8 recipes; FP4 from the model's rounding);
* :mod:`.problems`: the catalogue entries;
* :mod:`.config`: the launch choosers, used by :mod:`kernforge.ops.quant` and the catalogue.
"""
from kernforge.kernels.quant import config
from kernforge.kernels.quant.kernel import (FAKE_FP8_BLOCK, FP4_BLOCK, FP8_BLOCK, fake_quant_e2m1, fake_quant_e4m3,
                                            per_block_cast, per_token_cast, per_token_cast_fp4)
from kernforge.kernels.quant.problems import (SPEC_BLOCK_FP8, SPEC_FAKE_FP4, SPEC_FAKE_FP8, SPEC_TOKEN_FP4,
                                              SPEC_TOKEN_FP8, SPEC_TOKEN_FP8_UE8M0)
from kernforge.kernels.quant.reference import (fake_quant_fp4, fake_quant_fp8, per_block_cast_to_fp8,
                                               per_token_cast_to_fp4, per_token_cast_to_fp8)

__all__ = ["FAKE_FP8_BLOCK", "FP4_BLOCK", "FP8_BLOCK", "SPEC_BLOCK_FP8", "SPEC_FAKE_FP4", "SPEC_FAKE_FP8",
           "SPEC_TOKEN_FP4", "SPEC_TOKEN_FP8", "SPEC_TOKEN_FP8_UE8M0", "config", "fake_quant_e2m1",
           "fake_quant_e4m3", "fake_quant_fp4", "fake_quant_fp8", "per_block_cast", "per_block_cast_to_fp8",
           "per_token_cast", "per_token_cast_fp4", "per_token_cast_to_fp4", "per_token_cast_to_fp8"]
