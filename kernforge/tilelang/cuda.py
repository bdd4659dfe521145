"""``tilelang.cuda``: present so that ``import tilelang.cuda`` works unchanged.  Its layout
makers (``tilelang.cuda.intrinsics.make_mma_swizzle_layout``) are hint markers
(:mod:`kernforge.tilelang.layout`); TileLang's other CUDA helpers (pass pipelines, arch
queries) have no kernforge counterpart, and using one raises
:class:`kernforge.dsl.compat.UnsupportedError`."""
import sys

from kernforge.dsl.compat import unsupported
from kernforge.tilelang.layout import make_mma_swizzle_layout  # noqa: F401

intrinsics = sys.modules[__name__]


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    return unsupported(f"cuda.{name}", "TileLang's CUDA pass pipeline and driver helpers are not "
                       "part of kernforge; kernforge's CUDA backend lowers kernels itself")
