"""The compressor's softmax-gated pooling (``kernforge.model.compressor.Compressor._pool``),
written once in the tile DSL.

A compressor turns every ``ratio`` (r) tokens into one KV entry: per channel, a softmax
over the candidates' gate scores weights their kv values.  The gate's position bias ``ape``
is added here, on load (the model adds it to ``wgate(x)``): the engine's input GEMM then
writes plain products, which at tiny()'s 8 x 1024 prefill is 20 ms cheaper than a GEMM that
accumulates into a bias-filled output.  The rows are the sequence's
projections ``kv, score [R, W]`` from the start of the block before the first new entry
(the engine's ``seq_kv``/``seq_score``), so entry k's own block is rows ``(k+1)r ..
(k+2)r-1``:

* ratio 4 overlaps (``overlap``, ``W = 2d``): entry k pools the first halves (channels
  ``0..d-1``) of block k's rows and the second halves (``d..2d-1``) of its own block's,
  ``2r`` candidates per channel;
* any other ratio (``W = d``) pools its own block's ``r`` rows.

One block computes one entry for ``block_d`` channels: candidate i's row is
``k r + i`` (overlap; its column moves to the second half for ``i >= r``) or ``(k+1) r + i``,
so the gather is one index expression and both layouts share the code.  The softmax is the
model's ``exp(s - max) / sum``, its exponential within 2 ulps of the exact one
(``kernforge.kernels.vexp``: branch-free float32, so the CPU loop vectorises; a
float64 ``exp`` call per candidate kept it scalar, 2.8x slower at tiny()'s prefill), then
``sum(w * kv)``.  Absent rows score ``-inf`` and weigh 0; a channel whose candidates are
all ``-inf`` is NaN, as in torch.  At bf16 the weights and products are rounded to bf16 as
the model's bf16 ops round them; sums are float32, rounded once.
"""
from __future__ import annotations

import kernforge.dsl as T
from kernforge.kernels.vexp import exp

DTYPES = ("float32", "bfloat16")


def _in_dtype(v, dtype: str):
    return T.cast(T.cast(v, "bfloat16"), "float32") if dtype == "bfloat16" else v


@T.tunable(block_d=[16, 32, 64], threads=[32, 64, 128])
def compressor_pool(head_dim: int, ratio: int, overlap: bool, dtype: str = "float32", block_d: int = 32,
                    threads: int = 64):
    """``kv, score [R, W]``, ``ape [ratio, W]`` -> ``out [N, head_dim]`` (entries 0..N-1;
    ``R >= (N + 1) * ratio``, ``W = 2 * head_dim`` with ``overlap``, else ``head_dim``).  The
    gate of row ``i`` is ``score[i] + ape[i % ratio]``, rounded to the dtype (the model's
    ``wgate(x) + ape``).  ``block_d`` divides ``head_dim``."""
    if dtype not in DTYPES:
        raise ValueError(f"compressor_pool: dtype must be one of {DTYPES}, got {dtype!r}")
    if ratio < 1 or head_dim < 1:
        raise ValueError(f"compressor_pool: ratio and head_dim must be positive, got {ratio}, {head_dim}")
    if head_dim % block_d:
        raise ValueError(f"compressor_pool: block_d {block_d} does not divide head_dim {head_dim}")
    d, r, BD = head_dim, ratio, block_d
    C = 2 * r if overlap else r  # candidates per channel
    row0 = 0 if overlap else r  # the first candidate's row, past entry k's k * r
    W = 2 * d if overlap else d
    R = T.symbolic("R")
    N = T.symbolic("N")

    @T.prim_func
    def compressor_pool_kernel(kv: T.Tensor((R, W), dtype), score: T.Tensor((R, W), dtype),
                               ape: T.Tensor((r, W), dtype), out: T.Tensor((N, d), dtype)):
        with T.Kernel(N, d // BD, threads=threads) as (k, cb):
            s = T.alloc_fragment((C, BD), "float32")
            v = T.alloc_fragment((C, BD), "float32")
            top = T.alloc_fragment((BD,), "float32")
            den = T.alloc_fragment((BD,), "float32")
            acc = T.alloc_fragment((BD,), "float32")
            for i, j in T.Parallel(C, BD):
                col = cb * BD + j + (i // r) * d if overlap else cb * BD + j
                # the gate's position bias: candidate i sits at position i % r of its block
                gate = T.cast(score[k * r + row0 + i, col], "float32") + T.cast(ape[i % r, col], "float32")
                s[i, j] = _in_dtype(gate, dtype)
                v[i, j] = T.cast(kv[k * r + row0 + i, col], "float32")
            T.reduce_max(s, top, dim=0)
            for i, j in T.Parallel(C, BD):
                s[i, j] = exp(s[i, j] - top[j])
            T.reduce_sum(s, den, dim=0)
            for i, j in T.Parallel(C, BD):
                s[i, j] = _in_dtype(_in_dtype(s[i, j] / den[j], dtype) * v[i, j], dtype)
            T.reduce_sum(s, acc, dim=0)
            for j in T.Parallel(BD):
                out[k, cb * BD + j] = acc[j]

    return compressor_pool_kernel
