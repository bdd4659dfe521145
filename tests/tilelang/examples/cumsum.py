# A TileLang program: row-wise inclusive prefix sums of a tiled matrix.
import torch
import tilelang
import tilelang.cuda  # noqa: F401  (imported by TileLang's CUDA examples; present on kernforge)
import tilelang.language as T


@tilelang.jit(out_idx=[1])
def cumsum(M, N, block_M=4, reverse=False, dtype="float32"):

    @T.prim_func
    def main(X: T.Tensor((M, N), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(M, block_M), threads=128) as bx:
            buf = T.alloc_buffer((block_M, N), dtype, scope="shared")
            T.copy(X[bx * block_M, 0], buf)
            T.cumsum(buf, dim=1, reverse=reverse)
            T.copy(buf, Y[bx * block_M, 0])

    return main


x = torch.randn(10, 48)
torch.testing.assert_close(cumsum(10, 48)(x), x.cumsum(1), rtol=1e-5, atol=1e-5)
torch.testing.assert_close(cumsum(10, 48, reverse=True)(x), x.flip(1).cumsum(1).flip(1), rtol=1e-5, atol=1e-5)
print("cumsum: ok")
