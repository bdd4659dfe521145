"""TopK select (DeepSelect-compatible): the kernel family as a package.

* :mod:`.kernel`: the DSL factory :func:`topk_select` and its device-side helpers;
* :mod:`.reference`: the torch reference with the same semantics;
* :mod:`.problems`: the catalogue entries (``topk_fp32``, ``topk_bf16``);
* :mod:`.config`: :func:`choose`, the compile-time configuration per backend, used by
  :func:`kernforge.ops.topk` and the catalogue alike.
"""
from kernforge.kernels.topk import config
from kernforge.kernels.topk.config import choose
from kernforge.kernels.topk.kernel import MAX_TOPK, MAX_VOCAB, NAN_ROW_MARKER, bit_tables, topk_select
from kernforge.kernels.topk.problems import SPEC_BF16, SPEC_FP32
from kernforge.kernels.topk.reference import ordered_keys, reference

__all__ = ["MAX_TOPK", "MAX_VOCAB", "NAN_ROW_MARKER", "SPEC_BF16", "SPEC_FP32", "bit_tables", "choose", "config",
           "ordered_keys", "reference", "topk_select"]
