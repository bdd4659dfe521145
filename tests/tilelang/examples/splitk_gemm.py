# A TileLang program: split-K GEMM as two kernels, partial products then their sum.
import torch
import tilelang
import tilelang.language as T


@tilelang.jit
def matmul_splitk(A, B, block_M: int = 16, block_N: int = 16, block_K: int = 16, split_k: int = 4):
    M, N, K = T.const("M, N, K")
    A: T.Tensor((M, K), T.float16)
    B: T.Tensor((K, N), T.float16)
    C = T.empty((M, N), T.float32)
    partial = T.empty((split_k, M, N), T.float32)  # not returned: scratch shared by the kernels
    k_per_split = T.ceildiv(K, split_k)

    with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), split_k, threads=128) as (bx, by, bz):
        A_shared = T.alloc_shared((block_M, block_K), T.float16)
        B_shared = T.alloc_shared((block_K, block_N), T.float16)
        C_local = T.alloc_fragment((block_M, block_N), T.float32)
        T.clear(C_local)
        for ko in T.Pipelined(T.ceildiv(k_per_split, block_K), num_stages=2):
            T.copy(A[by * block_M, bz * k_per_split + ko * block_K], A_shared)
            T.copy(B[bz * k_per_split + ko * block_K, bx * block_N], B_shared)
            T.gemm(A_shared, B_shared, C_local)
        T.copy(C_local, partial[bz, by * block_M, bx * block_N])

    with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
        acc = T.alloc_fragment((block_M, block_N), T.float32)
        part = T.alloc_fragment((block_M, block_N), T.float32)
        T.clear(acc)
        for s in T.serial(split_k):
            T.copy(partial[s, by * block_M, bx * block_N], part)
            for i, j in T.Parallel(block_M, block_N):
                acc[i, j] += part[i, j]
        T.copy(acc, C[by * block_M, bx * block_N])

    return C


a = torch.randn(32, 64).half()
b = torch.randn(64, 48).half()
c = matmul_splitk(a, b)
torch.testing.assert_close(c, a.float() @ b.float(), rtol=1e-3, atol=1e-3)
print("splitk_gemm: ok")
