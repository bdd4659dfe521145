"""The MoE expert activation: SwiGLU with V4's ``swiglu_limit`` clamp, fused with the
routing-weight multiply and, optionally, the FP8 re-quantisation a down projection
consumes.  Written once in the tile DSL.

``x [M, 2I]`` is a fused gate/up projection output (gate ``x[:, :I]``, up ``x[:, I:]``,
the layout of one GEMM against ``[w1; w3]``).  Each element follows
:class:`kernforge.model.moe.Expert` step by step, each step rounded to ``x``'s dtype as
the model's in-place torch ops round it:

1. ``limit > 0``: ``up = clamp(up, -limit, limit)``, ``gate = min(gate, limit)``;
2. ``h = silu(gate)`` (``gate / (1 + exp(-gate))``), then ``h = h * up``;
3. with weights, ``h = h * w[row]``.

With ``quantize`` the output is DeepGEMM's 1x128 per-token e4m3 recipe of that ``h``
(``sf = max(amax(|h|), 1e-4) / 448`` per 128 columns, ``data = h / sf``): the same bits as
:func:`kernforge.kernels.grouped_gemm.reference.per_token_cast_to_fp8` applied to the
unquantised output.  Clamps propagate NaN (``T.min``/``T.max``), as ``torch.clamp`` does.
"""
from __future__ import annotations

import kernforge.dsl as T
from kernforge.kernels.vexp import exp

#: the quantisation block (DeepGEMM's activation recipe: 1 x 128)
QBLOCK = 128


@T.tunable(rows=[1, 4, 8, 16])
def swiglu(inter: int, dtype: str = "bfloat16", with_weights: bool = False, quantize: bool = False,
           rows: int = 4, threads: int = 128):
    """``out [M, inter]`` (or e4m3 ``out`` + float32 ``out_sf [M, inter / 128]``) from
    ``x [M, 2 * inter]``; one block per ``rows`` rows, 128 columns at a time.
    ``swiglu_limit`` is a runtime scalar (``<= 0``: no clamp); ``weights [M]`` float32."""
    if inter <= 0:
        raise ValueError(f"swiglu: inter must be positive, got {inter}")
    if quantize and inter % QBLOCK:
        raise ValueError(f"swiglu: quantize needs inter % {QBLOCK} == 0, got {inter}")
    I = inter
    BC = QBLOCK if quantize else min(QBLOCK, inter)
    nblk = T.ceildiv(I, BC)
    M = T.symbolic("M")
    WM = M if with_weights else T.symbolic("weight_rows")
    SM = M if quantize else T.symbolic("sf_rows")
    SC = I // QBLOCK if quantize else 1
    out_dtype = "float8_e4m3" if quantize else dtype

    @T.prim_func
    def swiglu_kernel(x: T.Tensor((M, 2 * I), dtype),
                      weights: T.Tensor((WM,), "float32"),
                      swiglu_limit: T.float32,
                      out: T.Tensor((M, I), out_dtype),
                      out_sf: T.Tensor((SM, SC), "float32")):
        with T.Kernel(T.ceildiv(M, rows), threads=threads) as bx:
            h = T.alloc_fragment((rows, BC), "float32")
            e = T.alloc_fragment((rows, BC), "float32")
            if quantize:
                mag = T.alloc_fragment((rows, BC), "float32")
                amax = T.alloc_fragment((rows,), "float32")
                sf = T.alloc_fragment((rows,), "float32")
            for c in T.serial(nblk):
                # rows past M and columns past I read the last row / column (clamped indices,
                # no branch in the loop: it vectorises) and are never stored
                for r, j in T.Parallel(rows, BC):
                    g = T.cast(x[T.min(bx * rows + r, M - 1), T.min(c * BC + j, I - 1)], "float32")
                    h[r, j] = T.where(swiglu_limit > 0, T.min(g, swiglu_limit), g)
                for r, j in T.Parallel(rows, BC):
                    e[r, j] = exp(-h[r, j])
                for r, j in T.Parallel(rows, BC):
                    row = T.min(bx * rows + r, M - 1)
                    u = T.cast(x[row, I + T.min(c * BC + j, I - 1)], "float32")
                    u = T.where(swiglu_limit > 0, T.min(T.max(u, -swiglu_limit), swiglu_limit), u)
                    act = T.cast(T.cast(h[r, j] / (1.0 + e[r, j]), dtype), "float32")
                    prod = T.cast(T.cast(act * u, dtype), "float32")
                    if with_weights:
                        prod = T.cast(T.cast(prod * weights[row], dtype), "float32")
                    h[r, j] = prod
                if quantize:
                    for r, j in T.Parallel(rows, BC):
                        mag[r, j] = T.abs(h[r, j])
                    T.reduce_max(mag, amax, dim=1)
                    for r in T.Parallel(rows):
                        sf[r] = T.max(amax[r], 1e-4) / 448.0
                        if bx * rows + r < M:
                            out_sf[bx * rows + r, c] = sf[r]
                for r in T.serial(rows):
                    if bx * rows + r < M:
                        for j in T.Parallel(BC):
                            if quantize:
                                out[bx * rows + r, c * BC + j] = h[r, j] / sf[r]
                            elif I % BC == 0:
                                out[bx * rows + r, c * BC + j] = h[r, j]
                            elif c * BC + j < I:
                                out[bx * rows + r, c * BC + j] = h[r, j]

    return swiglu_kernel
