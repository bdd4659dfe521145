"""FP8 KV pages (FlashMLA's V4 "MODEL1" layout): the kernel family as a package.

* :mod:`.kernel`: the DSL factories :func:`fp8_kv_quantize` and :func:`fp8_kv_dequantize`;
* :mod:`.reference`: the torch oracles (the engine's former torch steps);
* :mod:`.problems`: the catalogue entries;
* :mod:`.config`: the launch choosers, used by :mod:`kernforge.ops.kv_quant` and the catalogue.
"""
from kernforge.kernels.kv_quant import config
from kernforge.kernels.kv_quant.kernel import BLOCK, fp8_kv_dequantize, fp8_kv_quantize, scale_bytes
from kernforge.kernels.kv_quant.problems import SPEC_DEQUANTIZE, SPEC_QUANTIZE, PageLayout
from kernforge.kernels.kv_quant.reference import fp8_kv_dequantize_pages, fp8_kv_quantize as quantize_reference

__all__ = ["BLOCK", "PageLayout", "SPEC_DEQUANTIZE", "SPEC_QUANTIZE", "config", "fp8_kv_dequantize",
           "fp8_kv_dequantize_pages", "fp8_kv_quantize", "quantize_reference", "scale_bytes"]
