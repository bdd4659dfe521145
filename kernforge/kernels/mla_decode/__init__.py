"""MLA decode attention (FlashMLA-style): the kernel family as a package.

* :mod:`.kernel`: the DSL factories :func:`mla_decode` (dense, paged; split-KV),
  :func:`mla_decode_combine` (merges split-KV partials) and :func:`mla_decode_sparse`
  (index-selected, bf16 or V3.2 FP8 cache), built from shared macros;
* :mod:`.reference`: float64 torch references and the V3.2 FP8 cache format;
* :mod:`.problems`: the catalogue entries (``mla_decode``, ``mla_decode_sparse``,
  ``mla_decode_combine``, ``mla_decode_splitkv``), paged cache inputs and tolerances;
* :mod:`.schedule` and :mod:`.scheduled`: FlashMLA's balanced split-KV schedule (host)
  and the dense kernel + combine that follow it (``mla_decode_scheduled``);
* :mod:`.split_kv`: the uniform split kernel and the combine as one runnable (the op's split-KV
  path, and what the tuner sweeps split counts on);
* :mod:`.config`: the compile-time configuration choosers, used by
  :func:`kernforge.ops.flash_mla_with_kvcache` and the catalogue alike.
"""
from kernforge.kernels.mla_decode import config
from kernforge.kernels.mla_decode.config import choose, choose_combine, choose_sparse, choose_splits
from kernforge.kernels.mla_decode.kernel import (LOG2E, V32_BYTES, V32_ROPE_AT, V32_SCALES, V32_TILE, mla_decode,
                                                mla_decode_combine, mla_decode_sparse)
from kernforge.kernels.mla_decode.problems import (SPEC, SPEC_SPARSE, UNUSED_BLOCK, assert_close, make_cache,
                                                  make_inputs, make_inputs_sparse, tolerances)
from kernforge.kernels.mla_decode.reference import dequantize_kv_v32, quantize_kv_v32, reference, reference_sparse
from kernforge.kernels.mla_decode.scheduled import mla_decode_combine_scheduled, mla_decode_scheduled

__all__ = ["LOG2E", "SPEC", "SPEC_SPARSE", "UNUSED_BLOCK", "V32_BYTES", "V32_ROPE_AT", "V32_SCALES", "V32_TILE",
           "assert_close", "choose", "choose_combine", "choose_sparse", "choose_splits", "config",
           "dequantize_kv_v32", "make_cache", "make_inputs", "make_inputs_sparse", "mla_decode",
           "mla_decode_combine", "mla_decode_combine_scheduled", "mla_decode_scheduled", "mla_decode_sparse",
           "quantize_kv_v32", "reference", "reference_sparse", "tolerances"]
