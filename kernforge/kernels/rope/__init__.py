"""RoPE (plain and YaRN tables): the kernel family as a package.

* :mod:`.kernel`: the DSL factory :func:`rotary_embedding`;
* :mod:`.reference`: the float64 complex-rotation reference and :func:`angle_tables`;
* :mod:`.problems`: the catalogue entry ``rotary_embedding``;
* :mod:`.config`: :func:`choose`, used by :func:`kernforge.ops.rotary_embedding` and the catalogue.
"""
from kernforge.kernels.rope import config
from kernforge.kernels.rope.config import choose
from kernforge.kernels.rope.kernel import rotary_embedding
from kernforge.kernels.rope.reference import angle_tables, reference

__all__ = ["angle_tables", "choose", "config", "reference", "rotary_embedding"]
