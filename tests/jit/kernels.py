"""A small kernel for the tests of this folder: it reads ``X``, reads and writes ``Y`` and
writes ``Z`` (so it has an input, an in-place argument and, with ``out_idx=3``, an output)."""
import kernforge.dsl as T

M = T.symbolic("M")


@T.prim_func
def axpy(X: T.Tensor((M, 16), "float32"), a: T.float32, Y: T.Tensor((M, 16), "float32"),
         Z: T.Tensor((M, 16), "float32")):
    with T.Kernel(T.ceildiv(M, 4), threads=64) as bx:
        for i, j in T.Parallel(4, 16):
            if bx * 4 + i < M:
                Z[bx * 4 + i, j] = X[bx * 4 + i, j] * a + Y[bx * 4 + i, j]
                Y[bx * 4 + i, j] = Y[bx * 4 + i, j] + 1.0
