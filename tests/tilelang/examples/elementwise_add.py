# A TileLang program: element-wise add, eager style with the T.Tensor[...] subscript.
import torch
import tilelang
import tilelang.language as T


@tilelang.jit
def elementwise_add(A, B, block_M: int = 16, block_N: int = 32, in_dtype=T.float32, out_dtype=T.float32):
    M, N = T.const("M, N")
    A: T.Tensor[(M, N), in_dtype]
    B: T.Tensor[(M, N), in_dtype]
    C = T.empty((M, N), out_dtype)
    with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
        A_local = T.alloc_fragment((block_M, block_N), in_dtype)
        B_local = T.alloc_fragment((block_M, block_N), in_dtype)
        C_local = T.alloc_fragment((block_M, block_N), out_dtype)
        T.copy(A[by * block_M, bx * block_N], A_local)
        T.copy(B[by * block_M, bx * block_N], B_local)
        for i, j in T.Parallel(block_M, block_N):
            C_local[i, j] = A_local[i, j] + B_local[i, j]
        T.copy(C_local, C[by * block_M, bx * block_N])
    return C


def ref_program(x, y):
    return x + y


a = torch.randn(40, 70)
b = torch.randn(40, 70)
c = elementwise_add(a, b)
torch.testing.assert_close(c, ref_program(a, b), rtol=1e-5, atol=1e-5)
print("elementwise_add: ok")
