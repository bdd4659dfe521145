# A TileLang program: GEMM in the eager @tilelang.jit style.
import torch
import tilelang
import tilelang.language as T


@tilelang.jit
def matmul(A, B, block_M: int = 32, block_N: int = 32, block_K: int = 16,
           dtype: T.dtype = T.float16, accum_dtype: T.dtype = T.float32):
    M, N, K = T.const("M, N, K")
    A: T.Tensor((M, K), dtype)
    B: T.Tensor((K, N), dtype)
    C = T.empty((M, N), dtype)

    with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
        A_shared = T.alloc_shared((block_M, block_K), dtype)
        B_shared = T.alloc_shared((block_K, block_N), dtype)
        C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
        T.clear(C_local)
        for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=2):
            T.copy(A[by * block_M, k * block_K], A_shared)
            T.copy(B[k * block_K, bx * block_N], B_shared)
            T.gemm(A_shared, B_shared, C_local)
        for i, j in T.Parallel(block_M, block_N):
            C_local[i, j] = T.max(C_local[i, j], 0)
        T.copy(C_local, C[by * block_M, bx * block_N])

    return C


a = torch.randn(70, 40, dtype=torch.float16)
b = torch.randn(40, 50, dtype=torch.float16)
c = matmul(a, b)
ref = torch.relu(a.float() @ b.float()).half()
torch.testing.assert_close(c, ref, rtol=1e-2, atol=1e-2)

# a second shape specialises again; the same shape hits the cache
a2, b2 = torch.randn(32, 16, dtype=torch.float16), torch.randn(16, 32, dtype=torch.float16)
torch.testing.assert_close(matmul(a2, b2), torch.relu(a2.float() @ b2.float()).half(), rtol=1e-2, atol=1e-2)

kernel = matmul.compile(M=70, N=50, K=40, block_M=64, block_N=64, block_K=32)
torch.testing.assert_close(kernel(a, b), ref, rtol=1e-2, atol=1e-2)
print("gemm_eager: ok")
