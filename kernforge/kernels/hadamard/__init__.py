"""The Walsh-Hadamard transform: the kernel family as a package.

* :mod:`.kernel`: the DSL factory :func:`hadamard`;
* :mod:`.reference`: the float64 Sylvester-matrix reference;
* :mod:`.problems`: the catalogue entry ``hadamard``;
* :mod:`.config`: :func:`choose`, used by :func:`kernforge.ops.hadamard_transform` and the catalogue.
"""
from kernforge.kernels.hadamard import config
from kernforge.kernels.hadamard.config import choose
from kernforge.kernels.hadamard.kernel import hadamard
from kernforge.kernels.hadamard.reference import reference, sylvester

__all__ = ["choose", "config", "hadamard", "reference", "sylvester"]
