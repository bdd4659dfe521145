# A TileLang program: per-row arg-max with a scalar variable and runtime branches.
import torch
import tilelang
import tilelang.language as T


@tilelang.jit
def row_argmax(X, block_N: int = 32):
    M, N = T.const("M, N")
    X: T.Tensor((M, N), T.float32)
    Idx = T.empty((M,), T.int32)
    Val = T.empty((M,), T.float32)
    with T.Kernel(M, threads=32) as row:
        tile = T.alloc_shared((block_N,), T.float32)
        best = T.alloc_var(T.float32, init=-T.infinity(T.float32))
        best_i = T.alloc_var(T.int32, init=0)
        for t in T.serial(T.ceildiv(N, block_N)):
            T.copy(X[row, t * block_N], tile)
            for j in T.serial(block_N):
                col = t * block_N + j
                if col < N:
                    if tile[j] > best:
                        best = tile[j]
                        best_i = col
        Idx[row] = best_i
        Val[row] = best
        # a consistency check the kernel can do itself: the block index of the winner
        Idx[row] = T.floordiv(best_i, block_N) * block_N + best_i % block_N
    return Idx, Val


x = torch.randn(6, 70)
idx, val = row_argmax(x)
ref_val, ref_idx = x.max(dim=1)
assert torch.equal(idx.long(), ref_idx), (idx, ref_idx)
torch.testing.assert_close(val, ref_val)
print("row_max_index: ok")
