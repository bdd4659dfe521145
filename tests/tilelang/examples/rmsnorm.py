# A TileLang program: RMSNorm, prim_func factory under @tilelang.jit(out_idx=...).
import torch
import tilelang
import tilelang.language as T


@tilelang.jit(out_idx=[-1])
def rms_norm(M, N, blk_m):
    dtype = "float"

    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), B: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(M, blk_m), threads=128) as bx:
            A_shared = T.alloc_shared((blk_m, N), dtype)
            A_pow_local = T.alloc_fragment((blk_m, N), dtype)
            A_local = T.alloc_fragment((blk_m, N), dtype)
            A_powsum = T.alloc_fragment((blk_m,), dtype)

            T.copy(A[bx * blk_m:(bx + 1) * blk_m, :], A_shared)
            T.copy(A_shared, A_local)
            for i, j in T.Parallel(blk_m, N):
                A_pow_local[i, j] = A_local[i, j] * A_local[i, j]
            T.reduce_sum(A_pow_local, A_powsum, dim=1)
            for i in T.Parallel(blk_m):
                A_powsum[i] = T.rsqrt(A_powsum[i] / N + 1e-12)
            for k in T.Pipelined(1, num_stages=0):
                for i, j in T.Parallel(blk_m, N):
                    A_local[i, j] *= A_powsum[i]
            T.copy(A_local, B[bx * blk_m:(bx + 1) * blk_m, :])

    return main


def ref_program(x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-12)


M, N, blk_m = 20, 64, 8
kernel = rms_norm(M, N, blk_m)
x = torch.randn(M, N)
torch.testing.assert_close(kernel(x), ref_program(x), rtol=1e-4, atol=1e-4)
assert rms_norm(M, N, blk_m) is kernel  # the factory call is cached
profiler = kernel.get_profiler()
profiler.assert_allclose(ref_program, rtol=1e-4, atol=1e-4)
print("rmsnorm: ok")
