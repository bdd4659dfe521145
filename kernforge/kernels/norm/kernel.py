"""RMSNorm, written once in the tile DSL: the model's ``RMSNorm`` and ``rms_normalize``.

One block normalises ``block_rows`` whole rows.  The row dimension is a compile-time
size (hidden 4096, q_lora_rank 1024, head_dim 512 in V4-Flash), so a row is one tile:
it is loaded once, its sum of squares reduced, and scaled in place, with no second
pass over global memory.  The math is float32 whatever the storage dtype
(``primitives.rms_normalize`` runs in the activation dtype; at float32 the two agree
to rounding), and the scale is ``1 / sqrt(mean + eps)`` as the model's ``nx.rsqrt``
writes it: two correctly rounded operations, not an approximate ``rsqrt``.
"""
from __future__ import annotations

import kernforge.dsl as T

DTYPES = ("float32", "bfloat16")


@T.tunable(block_rows=[1, 2, 4, 8], threads=[64, 128, 256])
def rms_norm(dim: int, dtype: str = "float32", weight_dtype: str | None = "float32",
             out_dtype: str | None = None, block_rows: int = 1, threads: int = 128):
    """``out = x * (mean(x^2) + eps)^-1/2 * weight`` over rows ``x [rows, dim]``.

    ``weight_dtype=None`` builds the weightless form (``rms_normalize``, the per-head
    query normalisation); ``out_dtype`` defaults to ``dtype``.  ``rows`` is symbolic:
    one compiled kernel serves every token count."""
    out_dtype = out_dtype or dtype
    for name, dt in (("dtype", dtype), ("out_dtype", out_dtype)) + ((("weight_dtype", weight_dtype),)
                                                                       if weight_dtype else ()):
        if dt not in DTYPES:
            raise ValueError(f"rms_norm: {name} must be one of {DTYPES}, got {dt!r}")
    if dim < 1:
        raise ValueError(f"rms_norm: dim must be positive, got {dim}")
    R = T.symbolic("rows")
    BR = block_rows
    # the weightless form still takes a (1,) placeholder so both share one signature
    wshape = (dim,) if weight_dtype else (1,)

    @T.prim_func
    def rms_norm_kernel(x: T.Tensor((R, dim), dtype), weight: T.Tensor(wshape, weight_dtype or "float32"),
                        out: T.Tensor((R, dim), out_dtype), eps: T.float32):
        with T.Kernel(T.ceildiv(R, BR), threads=threads) as bx:
            xf = T.alloc_fragment((BR, dim), "float32")
            sq = T.alloc_fragment((BR, dim), "float32")
            ss = T.alloc_fragment((BR,), "float32")
            T.copy(x[bx * BR, 0], xf)  # rows past the end read 0 and are never stored
            for i, j in T.Parallel(BR, dim):
                sq[i, j] = xf[i, j] * xf[i, j]
            T.reduce_sum(sq, ss, dim=1)
            for i in T.Parallel(BR):  # one division and square root per row, not per element
                ss[i] = 1.0 / T.sqrt(ss[i] / dim + eps)
            for i, j in T.Parallel(BR, dim):
                if weight_dtype:
                    xf[i, j] = xf[i, j] * ss[i] * weight[j]
                else:
                    xf[i, j] = xf[i, j] * ss[i]
            T.copy(xf, out[bx * BR, 0])

    return rms_norm_kernel
