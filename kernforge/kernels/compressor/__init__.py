"""The V4 compressor's pooling (``kernforge.model.compressor.Compressor._pool``) as a kernel
family.

* :mod:`.kernel`: the DSL factory :func:`compressor_pool`;
* :mod:`.reference`: the float64 torch reference;
* :mod:`.problems`: the catalogue entry ``compressor_pool``;
* :mod:`.config`: :func:`choose`, used by :func:`kernforge.ops.compressor_pool` and the catalogue.

The rest of an entry's making (RMSNorm, RoPE, Hadamard, QAT rounding) is other families'
kernels, chained by the op and the engine's ``compressor_pool`` step.
"""
from kernforge.kernels.compressor import config, reference
from kernforge.kernels.compressor.config import choose
from kernforge.kernels.compressor.kernel import compressor_pool
from kernforge.kernels.compressor.problems import SPEC

__all__ = ["SPEC", "choose", "compressor_pool", "config", "reference"]
