# A TileLang program: per-token (per 1 x group) cast to FP8 E4M3 with an amax scale.
import torch
import tilelang
import tilelang.language as T

fp8_max = 448.0


@tilelang.jit(out_idx=[1, 2])
def per_token_cast_to_fp8(M, N, blk_m, group_size=32):
    dtype = T.float
    fp8 = T.float8_e4m3fn

    @T.prim_func
    def main(X: T.Tensor((M, N), dtype), X_fp8: T.Tensor((M, N), fp8),
             X_amax: T.Tensor((M, T.ceildiv(N, group_size)), dtype)):
        with T.Kernel(T.ceildiv(M, blk_m), T.ceildiv(N, group_size), threads=128) as (bx, by):
            y_local = T.alloc_fragment((blk_m, group_size), dtype)
            y_amax_local = T.alloc_fragment((blk_m,), dtype)
            y_s_local = T.alloc_fragment((blk_m,), dtype)
            y_q_local = T.alloc_fragment((blk_m, group_size), fp8)
            T.copy(X[bx * blk_m, by * group_size], y_local)
            T.reduce_absmax(y_local, y_amax_local, dim=1)
            for i in T.Parallel(blk_m):
                y_amax_local[i] = T.max(y_amax_local[i], 1e-4)
                y_s_local[i] = y_amax_local[i] / fp8_max
            for i, j in T.Parallel(blk_m, group_size):
                y_q_local[i, j] = T.clamp(y_local[i, j] / y_s_local[i], -fp8_max, fp8_max)
            T.copy(y_q_local, X_fp8[bx * blk_m, by * group_size])
            for i in T.Parallel(blk_m):
                X_amax[bx * blk_m + i, by] = y_s_local[i]

    return main


def ref_program(x, group_size=32):
    m, n = x.shape
    xv = x.view(m, n // group_size, group_size)
    amax = xv.abs().amax(dim=2).clamp(min=1e-4)
    q = (xv / (amax / fp8_max).unsqueeze(2)).clamp(-fp8_max, fp8_max).to(torch.float8_e4m3fn)
    return q.view(m, n), amax / fp8_max


M, N = 16, 128
kernel = per_token_cast_to_fp8(M, N, 8)
x = torch.randn(M, N) * 10
x_fp8, x_s = kernel(x)
ref_fp8, ref_s = ref_program(x)
torch.testing.assert_close(x_s, ref_s, rtol=1e-6, atol=1e-7)
torch.testing.assert_close(x_fp8.float(), ref_fp8.float(), rtol=0, atol=0)
print("fp8_cast: ok")
