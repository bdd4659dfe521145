"""Manifold-constrained hyper-connections (mHC), written once in the tile DSL.

The model's ``block.hc_pre`` / ``hc_post`` / ``hc_head`` (docs/model.md, spec §2.3).  The
residual stream is ``M`` copies per token, stored as ``x [tokens, M * D]`` (copy ``j`` at
columns ``j*D .. j*D+D-1``, which is ``flat(X)``, the layout ``fn``'s columns follow).

* :func:`hc_pre`: one block per ``block_tokens`` tokens computes the mixes
  ``m = (fn . flat(X)) / rms(flat(X))`` (a ``[tokens, M*D]`` by ``[M*D, mix]`` ``T.gemm``,
  streamed over ``M*D`` in tiles), the pre weights ``sigmoid(s0 m + b) + eps``, the post
  weights ``2 sigmoid(s1 m + b)``, the combination matrix (row softmax, then ``iters``
  column and ``iters - 1`` row normalisations: the model's Sinkhorn), and the sublayer input
  ``u = sum_j pre_j X_j``, all without leaving the block.
* :func:`hc_post`: ``X'_k = post_k y + sum_j comb[j, k] X_j`` (rows of ``comb`` are
  sources), one element per iteration, the sum in the model's order ``j = 0, 1, ...``.
* :func:`hc_head`: the final collapse, the mixes of an ``[M, M*D]`` ``fn`` and sigmoid pre
  weights only (no Sinkhorn, no post).

The math is float32; ``u`` and ``X'`` are stored in the streams' dtype, ``post`` and
``comb`` in float32 (the model keeps them in the streams' dtype, which is float32 for
the default model).
"""
from __future__ import annotations

import kernforge.dsl as T

DTYPES = ("float32", "bfloat16")


def _check(name: str, hc_mult: int, dim: int, dtype: str, block_k: int) -> None:
    if dtype not in DTYPES:
        raise ValueError(f"{name}: dtype must be one of {DTYPES}, got {dtype!r}")
    if hc_mult < 1 or dim < 1:
        raise ValueError(f"{name}: hc_mult and dim must be positive, got {hc_mult}, {dim}")
    if block_k is not None and (hc_mult * dim) % block_k:
        raise ValueError(f"{name}: block_k={block_k} must divide hc_mult * dim = {hc_mult * dim}")


def _sigmoid(v):
    return 1.0 / (1.0 + T.exp(-v))


def _mixes(x, fn, acc, ss, xt, ft, sq, t0, width: int, block_tokens: int, rows: int, block_k: int, norm_eps):
    """``acc [block_tokens, rows] = (fn . x_t) * (mean(x_t^2) + norm_eps)^-1/2`` for the block's tokens
    (tokens past the end read zeros and are never stored).  The mixing product is one
    ``T.gemm`` per ``block_k`` slice (``x`` tile times the ``fn`` tile transposed): the GEMM
    micro-kernel on the CPU (CUDA lowers a float32 ``T.gemm`` to its scalar loop), instead
    of a ``[tokens, rows, block_k]`` product tile and a reduction."""
    T.clear(acc)
    T.clear(ss)
    for kk in T.serial(width // block_k):
        T.copy(x[t0, kk * block_k], xt)
        T.copy(fn[0, kk * block_k], ft)
        T.gemm(xt, ft, acc, transpose_B=True)
        for t, k in T.Parallel(block_tokens, block_k):
            sq[t, k] = xt[t, k] * xt[t, k]
        T.reduce_sum(sq, ss, dim=1, clear=False)
    for t in T.Parallel(block_tokens):  # one division and square root per token
        ss[t] = 1.0 / T.sqrt(ss[t] / width + norm_eps)
    for t, r in T.Parallel(block_tokens, rows):
        acc[t, r] = acc[t, r] * ss[t]


@T.macro
def _collapse(x, u, pre, t0, n_tokens, hc_mult: int, dim: int, block_tokens: int):
    """``u[t] = sum_j pre[t, j] X_j[t]``, accumulated in the model's order."""
    for t, d in T.Parallel(block_tokens, dim):
        if t0 + t < n_tokens:
            acc = pre[t, 0] * x[t0 + t, d]
            for j in range(1, hc_mult):
                acc = acc + pre[t, j] * x[t0 + t, j * dim + d]
            u[t0 + t, d] = acc


@T.tunable(block_tokens=[1, 2, 4, 8, 16, 32], block_k=[64, 128, 256, 512], threads=[64, 128, 256])
def hc_pre(hc_mult: int, dim: int, sinkhorn_iters: int, dtype: str = "float32", fn_dtype: str = "float32",
           block_tokens: int = 1, block_k: int = 128, threads: int = 128):
    """``(u [tokens, D], post [tokens, M], comb [tokens, M, M])`` from ``x [tokens, M*D]``,
    ``fn [(2+M)*M, M*D]``, ``scale [3]``, ``base [(2+M)*M]`` (float32)."""
    _check("hc_pre", hc_mult, dim, dtype, block_k)
    if fn_dtype not in DTYPES:
        raise ValueError(f"hc_pre: fn_dtype must be one of {DTYPES}, got {fn_dtype!r}")
    if sinkhorn_iters < 1:
        raise ValueError(f"hc_pre: sinkhorn_iters must be >= 1, got {sinkhorn_iters}")
    M, D, BT, BK = hc_mult, dim, block_tokens, block_k
    mix, width = (2 + M) * M, M * D
    N = T.symbolic("tokens")

    @T.prim_func
    def hc_pre_kernel(x: T.Tensor((N, width), dtype), fn: T.Tensor((mix, width), fn_dtype),
                      scale: T.Tensor((3,), "float32"), base: T.Tensor((mix,), "float32"),
                      u: T.Tensor((N, D), dtype), post: T.Tensor((N, M), "float32"),
                      comb: T.Tensor((N, M, M), "float32"), norm_eps: T.float32, hc_eps: T.float32):
        with T.Kernel(T.ceildiv(N, BT), threads=threads) as bx:
            xt = T.alloc_shared((BT, BK), "float32")
            ft = T.alloc_shared((mix, BK), "float32")
            sq = T.alloc_fragment((BT, BK), "float32")
            acc = T.alloc_fragment((BT, mix), "float32")
            ss = T.alloc_fragment((BT,), "float32")
            pre = T.alloc_fragment((BT, M), "float32")
            c = T.alloc_fragment((BT, M, M), "float32")
            rowv = T.alloc_fragment((BT, M), "float32")  # per source j: row max, then row sums
            colv = T.alloc_fragment((BT, M), "float32")  # per destination k: column sums
            t0 = bx * BT
            _mixes(x, fn, acc, ss, xt, ft, sq, t0, width, BT, mix, BK, norm_eps)
            for t, j in T.Parallel(BT, M):
                pre[t, j] = _sigmoid(scale[0] * acc[t, j] + base[j]) + hc_eps
                if t0 + t < N:
                    post[t0 + t, j] = 2.0 * _sigmoid(scale[1] * acc[t, M + j] + base[M + j])
            for t, j, k in T.Parallel(BT, M, M):
                c[t, j, k] = scale[2] * acc[t, 2 * M + j * M + k] + base[2 * M + j * M + k]
            # Sinkhorn: softmax over destinations, + eps, column normalisation ...
            T.reduce_max(c, rowv, dim=2)
            for t, j, k in T.Parallel(BT, M, M):
                c[t, j, k] = T.exp(c[t, j, k] - rowv[t, j])
            T.reduce_sum(c, rowv, dim=2)
            for t, j, k in T.Parallel(BT, M, M):
                c[t, j, k] = c[t, j, k] / rowv[t, j] + hc_eps
            T.reduce_sum(c, colv, dim=1)
            for t, j, k in T.Parallel(BT, M, M):
                c[t, j, k] = c[t, j, k] / (colv[t, k] + hc_eps)
            # ... then iters - 1 rounds of row and column normalisation
            for _ in T.serial(sinkhorn_iters - 1):
                T.reduce_sum(c, rowv, dim=2)
                for t, j, k in T.Parallel(BT, M, M):
                    c[t, j, k] = c[t, j, k] / (rowv[t, j] + hc_eps)
                T.reduce_sum(c, colv, dim=1)
                for t, j, k in T.Parallel(BT, M, M):
                    c[t, j, k] = c[t, j, k] / (colv[t, k] + hc_eps)
            for t, j, k in T.Parallel(BT, M, M):
                if t0 + t < N:
                    comb[t0 + t, j, k] = c[t, j, k]
            _collapse(x, u, pre, t0, N, M, D, BT)

    return hc_pre_kernel


@T.tunable(block_tokens=[1, 2, 4, 8, 16, 32], block_k=[64, 128, 256, 512], threads=[64, 128, 256])
def hc_head(hc_mult: int, dim: int, dtype: str = "float32", fn_dtype: str = "float32", block_tokens: int = 1,
            block_k: int = 128, threads: int = 128):
    """``u [tokens, D]`` from ``x [tokens, M*D]``, ``fn [M, M*D]``, ``scale [1]``, ``base [M]``."""
    _check("hc_head", hc_mult, dim, dtype, block_k)
    if fn_dtype not in DTYPES:
        raise ValueError(f"hc_head: fn_dtype must be one of {DTYPES}, got {fn_dtype!r}")
    M, D, BT, BK = hc_mult, dim, block_tokens, block_k
    width = M * D
    N = T.symbolic("tokens")

    @T.prim_func
    def hc_head_kernel(x: T.Tensor((N, width), dtype), fn: T.Tensor((M, width), fn_dtype),
                       scale: T.Tensor((1,), "float32"), base: T.Tensor((M,), "float32"),
                       u: T.Tensor((N, D), dtype), norm_eps: T.float32, hc_eps: T.float32):
        with T.Kernel(T.ceildiv(N, BT), threads=threads) as bx:
            xt = T.alloc_shared((BT, BK), "float32")
            ft = T.alloc_shared((M, BK), "float32")
            sq = T.alloc_fragment((BT, BK), "float32")
            acc = T.alloc_fragment((BT, M), "float32")
            ss = T.alloc_fragment((BT,), "float32")
            pre = T.alloc_fragment((BT, M), "float32")
            t0 = bx * BT
            _mixes(x, fn, acc, ss, xt, ft, sq, t0, width, BT, M, BK, norm_eps)
            for t, j in T.Parallel(BT, M):
                pre[t, j] = _sigmoid(scale[0] * acc[t, j] + base[j]) + hc_eps
            _collapse(x, u, pre, t0, N, M, D, BT)

    return hc_head_kernel


@T.tunable(block_tokens=[1, 2, 4, 8], block_d=[64, 128, 256, 512, 1024], threads=[64, 128, 256])
def hc_post(hc_mult: int, dim: int, dtype: str = "float32", block_tokens: int = 1, block_d: int = 256,
            threads: int = 128):
    """``out [tokens, M*D]``: ``out_k = post_k y + sum_j comb[j, k] x_j`` from ``y [tokens, D]``,
    ``x [tokens, M*D]``, ``post [tokens, M]``, ``comb [tokens, M, M]`` (float32)."""
    _check("hc_post", hc_mult, dim, dtype, None)
    M, D, BT = hc_mult, dim, block_tokens
    BD = min(block_d, D)
    N = T.symbolic("tokens")

    @T.prim_func
    def hc_post_kernel(y: T.Tensor((N, D), dtype), x: T.Tensor((N, M * D), dtype),
                       post: T.Tensor((N, M), "float32"), comb: T.Tensor((N, M, M), "float32"),
                       out: T.Tensor((N, M * D), dtype)):
        with T.Kernel(T.ceildiv(D, BD), T.ceildiv(N, BT), threads=threads) as (db, tb):
            for t, k, d in T.Parallel(BT, M, BD):
                if (tb * BT + t < N) & (db * BD + d < D):
                    n, col = tb * BT + t, db * BD + d
                    acc = post[n, k] * y[n, col]
                    for j in range(M):
                        acc = acc + comb[n, j, k] * x[n, j * D + col]
                    out[n, k * D + col] = acc

    return hc_post_kernel
