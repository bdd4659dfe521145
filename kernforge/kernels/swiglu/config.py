"""SwiGLU's compile-time configuration (:func:`choose`): used by :func:`kernforge.ops.swiglu`
and the catalogue; keys on the backend's language, never on its name."""
from __future__ import annotations

from kernforge import backends
from kernforge.tune.consult import tuned


@tuned("swiglu")
def choose(backend: str, inter: int, dtype: str, with_weights: bool, quantize: bool) -> dict:
    """:func:`~kernforge.kernels.swiglu.swiglu` parameters: 8 rows per block on compiled
    backends (a 8 x 128 float32 tile per step: one vector row per row on the CPU, 8 values
    a thread on a 128-thread GPU block), 4 on the interpreter."""
    rows = 4 if backends.lang(backend) == "ir" else 8
    return dict(inter=inter, dtype=dtype, with_weights=with_weights, quantize=quantize, rows=rows)
