# A TileLang program: row softmax streaming over column tiles (online max and sum).
import math
import torch
import tilelang
import tilelang.language as T


@tilelang.jit(out_idx=[-1])
def softmax_kernel(M, N, block_M=4, block_N=32, dtype=T.float):
    scale = 1.44269504  # log2(e)

    @T.prim_func
    def main(X: T.Tensor((M, N), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(M, block_M), threads=128) as bx:
            x = T.alloc_fragment((block_M, block_N), dtype)
            m = T.alloc_fragment((block_M,), dtype)
            m_prev = T.alloc_fragment((block_M,), dtype)
            m_tile = T.alloc_fragment((block_M,), dtype)
            s = T.alloc_fragment((block_M,), dtype)
            s_tile = T.alloc_fragment((block_M,), dtype)
            T.fill(m, -T.infinity(dtype))
            T.clear(s)
            for k in T.serial(T.ceildiv(N, block_N)):
                T.copy(X[bx * block_M, k * block_N], x)
                T.reduce_max(x, m_tile, dim=1)
                for i in T.Parallel(block_M):
                    m_prev[i] = m[i]
                    m[i] = T.max(m[i], m_tile[i])
                for i, j in T.Parallel(block_M, block_N):
                    x[i, j] = T.exp2((x[i, j] - m[i]) * scale)
                T.reduce_sum(x, s_tile, dim=1)
                for i in T.Parallel(block_M):
                    s[i] = s[i] * T.exp2((m_prev[i] - m[i]) * scale) + s_tile[i]
            for k in T.serial(T.ceildiv(N, block_N)):
                T.copy(X[bx * block_M, k * block_N], x)
                for i, j in T.Parallel(block_M, block_N):
                    x[i, j] = T.exp2((x[i, j] - m[i]) * scale) / s[i]
                T.copy(x, Y[bx * block_M, k * block_N])

    return main


M, N = 12, 128
kernel = softmax_kernel(M, N)
x = torch.randn(M, N) * 3
torch.testing.assert_close(kernel(x), torch.softmax(x, dim=-1), rtol=1e-4, atol=1e-5)
assert abs(math.log2(math.e) - 1.44269504) < 1e-8
print("online_softmax: ok")
