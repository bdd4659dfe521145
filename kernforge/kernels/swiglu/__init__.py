"""SwiGLU expert activation (V4's clamped SwiGLU, fused routing weight, optional FP8 out).

* :mod:`.kernel`: the DSL factory :func:`swiglu`;
* :mod:`.reference`: torch references (the model's step-by-step ops, float64);
* :mod:`.problems`: the catalogue entry ``swiglu``;
* :mod:`.config`: :func:`choose`, used by :func:`kernforge.ops.swiglu` and the catalogue.
"""
from kernforge.kernels.swiglu import config, reference
from kernforge.kernels.swiglu.config import choose
from kernforge.kernels.swiglu.kernel import QBLOCK, swiglu
from kernforge.kernels.swiglu.problems import SPEC

__all__ = ["QBLOCK", "SPEC", "choose", "config", "reference", "swiglu"]
