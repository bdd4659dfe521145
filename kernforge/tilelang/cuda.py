"""``tilelang.cuda``: present so that ``import tilelang.cuda`` works unchanged.  TileLang's CUDA
helpers (pass pipelines, arch queries) have no kernforge counterpart; using one raises
:class:`kernforge.dsl.compat.UnsupportedError`."""
from kernforge.dsl.compat import unsupported


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    return unsupported(f"cuda.{name}", "TileLang's CUDA pass pipeline and driver helpers are not "
                       "part of kernforge; kernforge's CUDA backend lowers kernels itself")
