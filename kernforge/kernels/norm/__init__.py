"""RMSNorm: the kernel family as a package.

* :mod:`.kernel`: the DSL factory :func:`rms_norm` (with or without a weight);
* :mod:`.reference`: the float64 reference;
* :mod:`.problems`: the catalogue entry ``rms_norm``;
* :mod:`.config`: :func:`choose`, used by :func:`kernforge.ops.rms_norm` and the catalogue.
"""
from kernforge.kernels.norm import config
from kernforge.kernels.norm.config import choose
from kernforge.kernels.norm.kernel import rms_norm
from kernforge.kernels.norm.reference import reference

__all__ = ["choose", "config", "reference", "rms_norm"]
