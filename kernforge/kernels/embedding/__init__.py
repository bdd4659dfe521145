"""Token embedding lookup: the kernel family as a package.

* :mod:`.kernel`: the DSL factory :func:`embedding`;
* :mod:`.reference`: the gather reference;
* :mod:`.problems`: the catalogue entry ``embedding``;
* :mod:`.config`: :func:`choose`, used by :func:`kernforge.ops.embedding` and the catalogue.
"""
from kernforge.kernels.embedding import config
from kernforge.kernels.embedding.config import choose
from kernforge.kernels.embedding.kernel import embedding
from kernforge.kernels.embedding.reference import reference

__all__ = ["choose", "config", "embedding", "reference"]
