"""torch references for the quantisation kernels.

The FP8 recipes are DeepGEMM's, as :mod:`kernforge.kernels.grouped_gemm.reference` already
writes them (re-exported here, so the family and its tests have one import).  The FP4 one
is built from the model's own rounding (:mod:`kernforge.model.quant`), so the kernel, which
derives codes from comparisons and scales from exponent bits, is checked against an
independent formulation of the same format.  The fake-quant kernels' references are the
model's QAT functions themselves (``fake_quant_fp8``, ``fake_quant_fp4``): the engine must
reproduce the oracle's rounding bit for bit, so its own code is the test.
"""
from __future__ import annotations

import torch

from kernforge.kernels.grouped_gemm.reference import per_block_cast_to_fp8, per_token_cast_to_fp8
from kernforge.model.quant import (FP4_BLOCK, FP4_MAX, FP4_VALUES, _pow2_ceil_scale, fake_quant_fp4, fake_quant_fp8,
                                   round_e2m1)

__all__ = ["fake_quant_fp4", "fake_quant_fp8", "per_block_cast_to_fp8", "per_token_cast_to_fp4",
           "per_token_cast_to_fp8"]


def per_token_cast_to_fp4(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """V4's FP4 activation format: ``x [M, K]`` (K even) -> ``(int8 [M, K / 2], float32 [M, ceil(K / 32)])``.

    One power-of-two scale per 32 values (``kernforge.model.quant.fake_quant_fp4``'s), the
    scaled values rounded to e2m1 by the model's ``round_e2m1`` (ties to even), the sign
    from the sign bit; element ``2i`` in the low nibble of byte ``i``.  A ragged last block
    is padded with zeros."""
    m, k = x.shape
    kb = -(-k // FP4_BLOCK)
    v = torch.nn.functional.pad(x.float(), (0, kb * FP4_BLOCK - k)).view(m, kb, FP4_BLOCK)
    scale = _pow2_ceil_scale(v.abs().amax(-1), FP4_MAX, FP4_MAX * 2.0 ** -126)
    q = round_e2m1(v / scale[..., None])
    table = torch.tensor(FP4_VALUES[:8])
    magnitude = (q.abs()[..., None] == table).to(torch.uint8).argmax(-1).to(torch.uint8)
    code = magnitude | (torch.signbit(q).to(torch.uint8) << 3)
    code = code.view(m, kb * FP4_BLOCK)[:, :k].view(m, k // 2, 2)
    packed = code[..., 0] | (code[..., 1] << 4)
    return packed.view(torch.int8).contiguous(), scale.float().contiguous()
