# A TileLang program: batched (grouped, equal-size) GEMM on a 3-D grid, with hints.
import torch
import tilelang
import tilelang.language as T


@tilelang.jit(out_idx=[2])
def grouped_matmul(G, M, N, K, block_M=16, block_N=16, block_K=16, dtype="bfloat16"):

    @T.prim_func
    def main(A: T.Tensor((G, M, K), dtype), B: T.Tensor((G, N, K), dtype), C: T.Tensor((G, M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), G, threads=128) as (bx, by, bg):
            A_shared = T.alloc_shared((block_M, block_K), dtype)
            B_shared = T.alloc_shared((block_N, block_K), dtype)
            C_local = T.alloc_fragment((block_M, block_N), T.float32)
            T.annotate_layout({A_shared: None, B_shared: None})
            T.use_swizzle(panel_size=10, enable=True)
            T.clear(C_local)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=2):
                T.copy(A[bg, by * block_M, k * block_K], A_shared)
                T.copy(B[bg, bx * block_N, k * block_K], B_shared)
                T.gemm(A_shared, B_shared, C_local, transpose_B=True, policy=T.GemmWarpPolicy.Square)
            T.copy(C_local, C[bg, by * block_M, bx * block_N])

    return main


G, M, N, K = 3, 20, 24, 40
kernel = grouped_matmul(G, M, N, K)
a = torch.randn(G, M, K).bfloat16()
b = torch.randn(G, N, K).bfloat16()
ref = torch.bmm(a.float(), b.float().transpose(1, 2))
torch.testing.assert_close(kernel(a, b).float(), ref, rtol=2e-2, atol=5e-2)
print("grouped_gemm: ok")
