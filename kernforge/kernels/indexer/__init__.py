"""The lightning indexer's entry scores: the kernel family as a package.

* :mod:`.kernel`: the DSL factory :func:`indexer_scores` (one GEMM over the head dimension
  per head, the heads added in order: a fixed summation order);
* :mod:`.reference`: the torch oracle (the engine's former torch step);
* :mod:`.problems`: the catalogue entry ``indexer_scores``;
* :mod:`.config`: :func:`choose`, used by :func:`kernforge.ops.indexer_scores` and the catalogue.
"""
from kernforge.kernels.indexer import config
from kernforge.kernels.indexer.config import choose
from kernforge.kernels.indexer.kernel import indexer_scores
from kernforge.kernels.indexer.problems import SPEC
from kernforge.kernels.indexer.reference import indexer_scores as reference

__all__ = ["SPEC", "choose", "config", "indexer_scores", "reference"]
