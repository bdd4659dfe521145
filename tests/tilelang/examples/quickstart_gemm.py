# A TileLang program: the quickstart GEMM in the prim_func factory style.
import torch
import tilelang
import tilelang.language as T


def matmul(M, N, K, block_M, block_N, block_K, dtype="float16", accum_dtype="float"):

    @T.prim_func
    def main(
            A: T.Tensor((M, K), dtype),
            B: T.Tensor((K, N), dtype),
            C: T.Tensor((M, N), dtype),
    ):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), dtype)
            B_shared = T.alloc_shared((block_K, block_N), dtype)
            C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
            T.clear(C_local)
            for ko in T.Pipelined(T.ceildiv(K, block_K), num_stages=3):
                T.copy(A[by * block_M, ko * block_K], A_shared)
                T.copy(B[ko * block_K, bx * block_N], B_shared)
                T.gemm(A_shared, B_shared, C_local)
            T.copy(C_local, C[by * block_M, bx * block_N])

    return main


M, N, K = 64, 48, 80
func = matmul(M, N, K, 32, 32, 16)
jit_kernel = tilelang.compile(func, out_idx=[2], target="auto")

a = torch.randn(M, K, dtype=torch.float16)
b = torch.randn(K, N, dtype=torch.float16)
c = jit_kernel(a, b)
ref_c = (a.float() @ b.float()).half()
torch.testing.assert_close(c, ref_c, rtol=1e-2, atol=1e-2)
print("Kernel output matches PyTorch reference.")

assert "matmul" in jit_kernel.get_kernel_source() or len(jit_kernel.get_kernel_source()) > 0
profiler = jit_kernel.get_profiler(tensor_supply_type=tilelang.TensorSupplyType.Normal)
profiler.assert_allclose(lambda A, B: A @ B, rtol=1e-2, atol=1e-2)
latency = profiler.do_bench(warmup=1, rep=5)
print(f"Latency: {latency} ms")
