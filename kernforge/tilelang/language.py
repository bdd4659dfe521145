"""``tilelang.language`` on kernforge: ``import kernforge.tilelang.language as T`` (or, under
``python -m kernforge.tilelang``, plain ``import tilelang.language as T``).

Everything of ``kernforge.dsl`` is here under its TileLang name, plus TileLang's other
spellings (``kernforge.dsl.compat``): dtype aliases, ``T.Tensor[...]``, ``T.Cast``,
``T.clamp``, ``T.floordiv``, ``T.reduce_absmax``, ``T.alloc_buffer``/``alloc_global``,
``T.Pipelined(num_stages=0)``, and the performance hints, which are recorded.  A TileLang
name kernforge does not have raises :class:`UnsupportedError` naming it (never an
``AttributeError``); docs/tilelang.md lists what is supported, recorded and refused.
"""
import re as _re

from kernforge import dtypes as _dtypes
from kernforge.dsl import *  # noqa: F401,F403 - the language is the DSL
from kernforge.dsl import __all__ as _dsl_all
from kernforge.dsl.compat import (Cast, DivergentBarrierError, Pipelined, alloc_local, alloc_var, Serial, Tensor, UnsupportedError, alloc_buffer,  # noqa: F401
                                  alloc_global, annotate_l2_hit_ratio, annotate_layout,
                                  clamp, device_assert, dtype, float, float8_e4m3fn,
                                  floordiv, floormod, get_thread_binding, get_thread_bindings,
                                  no_set_max_nreg, print, reduce_absmax, reinterpret, sigmoid, shfl_down,
                                  shfl_sync, shfl_up, shfl_xor, sync_threads, sync_warp, tfloat32,
                                  thread_binding, tvm_warp_shuffle, unsupported, use_swizzle, vectorized, WarpLaneError)
from kernforge.dsl.reducer import (alloc_reducer, attr, comm_reducer, evaluate, finalize_reducer,  # noqa: F401
                                   tvm_thread_allreduce)

Buffer = Tensor

_DTYPE_NAME = _re.compile(r"u?int\d+x?\d*|b?float\d+\w*|float\d*_e\d+m\d+\w*")

_EXTRA = ["Buffer", "Cast", "DivergentBarrierError", "alloc_local", "alloc_var", "Pipelined", "Serial", "Tensor", "UnsupportedError", "alloc_buffer",
          "alloc_global", "alloc_reducer", "annotate_l2_hit_ratio", "annotate_layout", "clamp",
          "device_assert", "dtype", "finalize_reducer", "float", "float8_e4m3fn", "floordiv",
          "floormod", "get_thread_binding", "get_thread_bindings", "no_set_max_nreg", "print",
          "reduce_absmax", "reinterpret", "shfl_down", "shfl_sync", "shfl_up", "shfl_xor",
          "sync_threads", "sync_warp", "tfloat32", "thread_binding", "tvm_warp_shuffle", "use_swizzle", "vectorized", "WarpLaneError",
          "attr", "comm_reducer", "evaluate", "tvm_thread_allreduce", "sigmoid"]
__all__ = sorted(set(_dsl_all) | set(_EXTRA))


def __getattr__(name: str):
    """A TileLang name kernforge does not provide: calling it (or using it) is an
    :class:`UnsupportedError` at the author's line.  Python's own protocol names stay
    ``AttributeError`` so that imports, ``hasattr`` and introspection keep working."""
    if name.startswith("__"):
        raise AttributeError(name)
    if _DTYPE_NAME.fullmatch(name):
        return unsupported(name, "kernforge has no such dtype; its dtypes are " + ", ".join(_dtypes.BY_NAME))
    return unsupported(name, "kernforge has no such construct (docs/tilelang.md lists the "
                       "supported TileLang names)")
