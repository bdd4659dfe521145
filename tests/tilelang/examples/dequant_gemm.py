# A TileLang program: GEMM with 4-bit weights packed two per uint8, dequantised in the kernel.
import torch
import tilelang
import tilelang.language as T
from tvm import tir


def _to_float(dtype, nibble, scale):
    # (code - 8) * scale, with the constants spelled as TVM expressions
    return (T.Cast(dtype, nibble) - tir.const(8, dtype)) * scale


@tilelang.jit(out_idx=[-1])
def matmul_int4(M, N, K, block_M=16, block_N=16, block_K=32):
    in_dtype, accum = "float16", "float32"

    @T.prim_func
    def main(A: T.Tensor((M, K), in_dtype), B: T.Tensor((N, K // 2), "uint8"),
             Scale: T.Tensor((N,), "float32"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), in_dtype)
            B_packed = T.alloc_fragment((block_N, block_K // 2), "uint8")
            B_deq = T.alloc_shared((block_N, block_K), in_dtype)
            scale = T.alloc_fragment((block_N,), "float32")
            C_local = T.alloc_fragment((block_M, block_N), accum)
            T.copy(Scale[bx * block_N], scale)
            T.clear(C_local)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=2):
                T.copy(A[by * block_M, k * block_K], A_shared)
                T.copy(B[bx * block_N, k * block_K // 2], B_packed)
                for i, j in T.Parallel(block_N, block_K):
                    byte = B_packed[i, j // 2]
                    nibble = (byte >> T.Cast("uint8", 4 * (j % 2))) & tir.const(15, "uint8")
                    B_deq[i, j] = _to_float("float32", nibble, scale[i])
                T.gemm(A_shared, B_deq, C_local, transpose_B=True)
            T.copy(C_local, C[by * block_M, bx * block_N])

    return main


def ref_program(A, B, Scale):
    lo, hi = (B & 15).float(), (B >> 4).float()
    W = torch.stack([lo, hi], dim=-1).reshape(B.shape[0], -1)
    W = (W - 8) * Scale[:, None]
    return A.float() @ W.half().float().T


M, N, K = 32, 32, 64
kernel = matmul_int4(M, N, K)
A = torch.randn(M, K).half()
B = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8)
S = torch.rand(N) * 0.1
torch.testing.assert_close(kernel(A, B, S), ref_program(A, B, S), rtol=1e-2, atol=1e-2)
print("dequant_gemm: ok")
