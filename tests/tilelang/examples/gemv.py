# A TileLang program: GEMV y = A x, eager style, K split into pipelined tiles.
import torch
import tilelang
import tilelang.language as T


@tilelang.jit
def gemv(A, x, BLOCK_N: int = 16, BLOCK_K: int = 32, dtype=T.float16, accum_dtype=T.float):
    N, K = T.const("N, K")
    A: T.Tensor((N, K), dtype)
    x: T.Tensor((K,), dtype)
    y = T.empty((N,), dtype)
    with T.Kernel(T.ceildiv(N, BLOCK_N), threads=128) as bn:
        a = T.alloc_fragment((BLOCK_N, BLOCK_K), dtype)
        xs = T.alloc_shared((BLOCK_K,), dtype)
        prod = T.alloc_fragment((BLOCK_N, BLOCK_K), accum_dtype)
        acc = T.alloc_fragment((BLOCK_N,), accum_dtype)
        T.clear(acc)
        for bk in T.Pipelined(T.ceildiv(K, BLOCK_K), num_stages=2):
            T.copy(A[bn * BLOCK_N, bk * BLOCK_K], a)
            T.copy(x[bk * BLOCK_K], xs)
            for i, j in T.Parallel(BLOCK_N, BLOCK_K):
                prod[i, j] = T.Cast(accum_dtype, a[i, j]) * T.Cast(accum_dtype, xs[j])
            T.reduce_sum(prod, acc, dim=1, clear=False)
        T.copy(acc, y[bn * BLOCK_N])
    return y


A = torch.randn(40, 100).half()
x = torch.randn(100).half()
torch.testing.assert_close(gemv(A, x).float(), A.float() @ x.float(), rtol=1e-2, atol=2e-2)
print("gemv: ok")
