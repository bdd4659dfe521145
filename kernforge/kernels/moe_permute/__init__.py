"""MoE permutation (TileKernels' fused mapping, expand and reduce) as a kernel family.

* :mod:`.kernel`: the DSL factories :func:`moe_mapping_scan`, :func:`moe_mapping_scatter`,
  :func:`expand_to_fused`, :func:`reduce_fused`;
* :mod:`.reference`: independent torch references;
* :mod:`.problems`: the catalogue entries;
* :mod:`.config`: the choosers used by :mod:`kernforge.ops.moe` and the catalogue.
"""
from kernforge.kernels.moe_permute import config, reference
from kernforge.kernels.moe_permute.kernel import (DEFAULT_CHUNK, expand_to_fused, moe_mapping_scan,
                                                  moe_mapping_scatter, reduce_fused)
from kernforge.kernels.moe_permute.problems import SPEC_EXPAND, SPEC_MAP_SCAN, SPEC_MAP_SCATTER, SPEC_REDUCE

__all__ = ["DEFAULT_CHUNK", "SPEC_EXPAND", "SPEC_MAP_SCAN", "SPEC_MAP_SCATTER", "SPEC_REDUCE", "config",
           "expand_to_fused", "moe_mapping_scan", "moe_mapping_scatter", "reduce_fused", "reference"]
