"""Small DSL kernels whose generated CUDA exercises one emulated mechanism each.

They belong to these tests (not the kernel library) so the emulation tests do
not move when a library kernel is retuned.
"""
import kernforge.dsl as T


def gemm(M, N, K, BM=64, BN=64, BK=32, stages=2):
    """C = relu(A @ B) in bf16 through the tensor cores (mma.sync on sm_80, wgmma on
    sm_90a), a cp.async pipeline, and masked edge tiles (sizes not multiples of the tiles)."""

    @T.prim_func
    def main(A: T.Tensor((M, K), "bfloat16"), B: T.Tensor((K, N), "bfloat16"), C: T.Tensor((M, N), "bfloat16")):
        with T.Kernel(T.ceildiv(N, BN), T.ceildiv(M, BM), threads=128) as (bx, by):
            A_s = T.alloc_shared((BM, BK), "bfloat16")
            B_s = T.alloc_shared((BK, BN), "bfloat16")
            C_l = T.alloc_fragment((BM, BN), "float32")
            T.clear(C_l)
            for k in T.Pipelined(T.ceildiv(K, BK), num_stages=stages):
                T.copy(A[by * BM, k * BK], A_s)
                T.copy(B[k * BK, bx * BN], B_s)
                T.gemm(A_s, B_s, C_l)
            for i, j in T.Parallel(BM, BN):
                C_l[i, j] = T.max(C_l[i, j], 0.0)
            T.copy(C_l, C[by * BM, bx * BN])

    return main


def row_stats(M, K, N=64, BM=64, BK=32):
    """rmax[i] = max_j (A @ B)[i, j] and rsum[i] = sum_j (A @ B)[i, j]: a reduction of a
    tensor-core accumulator, whose rows are spread over the lanes of a quad and over
    warps (per-thread, then warp shuffles, then shared memory)."""

    @T.prim_func
    def main(A: T.Tensor((M, K), "bfloat16"), B: T.Tensor((K, N), "bfloat16"),
             rmax: T.Tensor((M,), "float32"), rsum: T.Tensor((M,), "float32")):
        with T.Kernel(T.ceildiv(M, BM), threads=128) as bx:
            A_s = T.alloc_shared((BM, BK), "bfloat16")
            B_s = T.alloc_shared((BK, N), "bfloat16")
            C_l = T.alloc_fragment((BM, N), "float32")
            m = T.alloc_fragment((BM,), "float32")
            s = T.alloc_fragment((BM,), "float32")
            T.clear(C_l)
            for k in T.serial(T.ceildiv(K, BK)):
                T.copy(A[bx * BM, k * BK], A_s)
                T.copy(B[k * BK, 0], B_s)
                T.gemm(A_s, B_s, C_l)
            T.reduce_max(C_l, m, dim=1)
            T.reduce_sum(C_l, s, dim=1)
            T.copy(m, rmax[bx * BM])
            T.copy(s, rsum[bx * BM])

    return main


def masked_copy(BM=16, BN=32):
    """B = int32(A) + 1 through shared memory, with symbolic shapes: the edge tiles
    are masked on load and store."""
    M, N = T.symbolic("M"), T.symbolic("N")

    @T.prim_func
    def main(A: T.Tensor((M, N), "int32"), B: T.Tensor((M, N), "int32")):
        with T.Kernel(T.ceildiv(N, BN), T.ceildiv(M, BM), threads=64) as (bx, by):
            S = T.alloc_shared((BM, BN), "int32")
            F = T.alloc_fragment((BM, BN), "int32")
            T.copy(A[by * BM, bx * BN], S)
            T.copy(S, F)
            for i, j in T.Parallel(BM, BN):
                F[i, j] = F[i, j] + 1
            T.copy(F, B[by * BM, bx * BN])

    return main


def scaled_shift(n=200, block=64):
    """y = bf16(x * alpha) + shift, with scalar parameters narrower than 32 bits
    (the CUDA ABI widens them; the host entry must pass them the same way)."""

    @T.prim_func
    def main(x: T.Tensor((n,), "bfloat16"), y: T.Tensor((n,), "float32"), alpha: T.bfloat16, shift: T.int16):
        with T.Kernel(T.ceildiv(n, block), threads=64) as bx:
            for i in T.Parallel(block):
                if bx * block + i < n:
                    y[bx * block + i] = T.cast(T.cast(x[bx * block + i] * alpha, "bfloat16"), "float32") + T.cast(shift, "float32")

    return main


def gated_ring_gemm(gate: str, N: int, K: int = 128, multicast: str = "a"):
    """A 2-CTA cluster GEMM (``multicast`` "a": a cluster along x, "b": along y) whose TMA ring sits
    behind ``if bx < 2`` or ``if by < 2`` (``gate``): the CTAs of a cluster would not run the same
    ring iterations, so the renderer must refuse the cluster and say why."""

    @T.tunable()
    def gated(N: int = N, K: int = K, cluster: int = 2, multicast: str = multicast):
        M = T.symbolic("M")

        @T.prim_func(name=f"gated_gemm_{gate}")
        def main(A: T.Tensor((M, K), "bfloat16"), B: T.Tensor((N, K), "bfloat16"), D: T.Tensor((M, N), "bfloat16")):
            with T.Kernel(N // 64, T.ceildiv(M, 64), threads=128) as (bx, by):
                A_s = T.alloc_shared((64, 64), "bfloat16")
                B_s = T.alloc_shared((64, 64), "bfloat16")
                C = T.alloc_fragment((64, 64), "float32")
                T.clear(C)
                if (bx if gate == "bx" else by) < 2:
                    for k in T.Pipelined(K // 64, num_stages=2):
                        T.copy(A[by * 64, k * 64], A_s)
                        T.copy(B[bx * 64, k * 64], B_s)
                        T.gemm(A_s, B_s, C, transpose_B=True)
                T.copy(C, D[by * 64, bx * 64])

        return main

    return gated()
