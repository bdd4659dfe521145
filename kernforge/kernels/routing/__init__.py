"""MoE routing (TileKernels' gating, V4's hash routing): the kernel family as a package.

* :mod:`.kernel`: the DSL factories :func:`topk_gate`, :func:`top2_sum_gate`,
  :func:`normalize_weight`, :func:`hash_gate` (one token per block, arg-max selection);
* :mod:`.reference`: the torch references;
* :mod:`.problems`: the catalogue entries;
* :mod:`.config`: the launch choosers, used by :mod:`kernforge.ops.routing` and the catalogue.
"""
from kernforge.kernels.routing import config, reference
from kernforge.kernels.routing.kernel import (MAX_EXPERTS_PER_GROUP, MAX_GROUPS, MAX_TOPK, SCORING_FUNCS,
                                              hash_gate, normalize_weight, top2_sum_gate, topk_gate)
from kernforge.kernels.routing.problems import (SPEC_HASH_GATE, SPEC_NORMALIZE_WEIGHT, SPEC_TOP2_SUM_GATE,
                                                SPEC_TOPK_GATE)

__all__ = ["MAX_EXPERTS_PER_GROUP", "MAX_GROUPS", "MAX_TOPK", "SCORING_FUNCS", "SPEC_HASH_GATE",
           "SPEC_NORMALIZE_WEIGHT", "SPEC_TOP2_SUM_GATE", "SPEC_TOPK_GATE", "config", "hash_gate",
           "normalize_weight", "reference", "top2_sum_gate", "topk_gate"]
