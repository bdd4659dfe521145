# A TileLang program: GEMM whose tile configuration is chosen by @tilelang.autotune.
import itertools
import torch
import tilelang
import tilelang.language as T


def get_configs():
    return [{"block_M": m, "block_N": n} for m, n in itertools.product([16, 32], [32])]


def ref_program(A, B):
    return A.float() @ B.float()


@tilelang.autotune(configs=get_configs(), warmup=1, rep=5, ref_prog=ref_program)
@tilelang.jit(out_idx=[-1])
def matmul(M, N, K, block_M=None, block_N=None, block_K=16):

    @T.prim_func
    def main(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"), C: T.Tensor((M, N), "float")):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), "float16")
            B_shared = T.alloc_shared((block_K, block_N), "float16")
            C_local = T.alloc_fragment((block_M, block_N), "float")
            T.clear(C_local)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=2):
                T.copy(A[by * block_M, k * block_K], A_shared)
                T.copy(B[k * block_K, bx * block_N], B_shared)
                T.gemm(A_shared, B_shared, C_local)
            T.copy(C_local, C[by * block_M, bx * block_N])

    return main


kernel = matmul(32, 32, 32)
assert kernel.config["block_M"] in (16, 32) and kernel.latency > 0
a, b = torch.randn(32, 32).half(), torch.randn(32, 32).half()
torch.testing.assert_close(kernel(a, b), ref_program(a, b), rtol=1e-3, atol=1e-3)
print("autotune_gemm: ok, best", kernel.config)
