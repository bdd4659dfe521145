# A TileLang program: LayerNorm (eager style) with mean and variance reductions.
import torch
import tilelang
import tilelang.language as T


@tilelang.jit
def layer_norm(X, W, Bias, blk_m: int = 4, eps: float = 1e-5):
    M, N = T.const("M, N")
    X: T.Tensor((M, N), T.bfloat16)
    W: T.Tensor((N,), T.float32)
    Bias: T.Tensor((N,), T.float32)
    Y = T.empty((M, N), T.bfloat16)
    with T.Kernel(T.ceildiv(M, blk_m), threads=128) as bx:
        x = T.alloc_fragment((blk_m, N), T.float32)
        sq = T.alloc_fragment((blk_m, N), T.float32)
        w = T.alloc_fragment((N,), T.float32)
        bias = T.alloc_fragment((N,), T.float32)
        mean = T.alloc_fragment((blk_m,), T.float32)
        var = T.alloc_fragment((blk_m,), T.float32)
        T.copy(X[bx * blk_m, 0], x)
        T.copy(W, w)
        T.copy(Bias, bias)
        T.reduce_sum(x, mean, dim=1)
        for i in T.Parallel(blk_m):
            mean[i] = mean[i] / N
        for i, j in T.Parallel(blk_m, N):
            sq[i, j] = (x[i, j] - mean[i]) * (x[i, j] - mean[i])
        T.reduce_sum(sq, var, dim=1)
        for i, j in T.Parallel(blk_m, N):
            x[i, j] = ((x[i, j] - mean[i]) * T.rsqrt(var[i] / N + eps) * w[j] + bias[j]).astype(T.bfloat16)
        T.copy(x, Y[bx * blk_m, 0])
    return Y


x = torch.randn(10, 96).bfloat16()
w, b = torch.randn(96), torch.randn(96)
y = layer_norm(x, w, b)
ref = torch.nn.functional.layer_norm(x.float(), (96,), w, b, eps=1e-5).bfloat16()
torch.testing.assert_close(y.float(), ref.float(), rtol=2e-2, atol=2e-2)
print("layernorm: ok")
