"""Manifold-constrained hyper-connections: the kernel family as a package.

* :mod:`.kernel`: the DSL factories :func:`hc_pre`, :func:`hc_post`, :func:`hc_head`;
* :mod:`.reference`: float64 references (mixes, Sinkhorn, pre/post/head);
* :mod:`.problems`: the catalogue entries ``hc_pre``, ``hc_post``, ``hc_head``;
* :mod:`.config`: the choosers used by :mod:`kernforge.ops.layers` and the catalogue.
"""
from kernforge.kernels.hyper_connection import config, reference
from kernforge.kernels.hyper_connection.config import choose_head, choose_post, choose_pre
from kernforge.kernels.hyper_connection.kernel import hc_head, hc_post, hc_pre

__all__ = ["choose_head", "choose_post", "choose_pre", "config", "hc_head", "hc_post", "hc_pre", "reference"]
