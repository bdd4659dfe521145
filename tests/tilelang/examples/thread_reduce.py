# A TileLang program: thread-level code. Each block sums one row with its threads: strided
# per-thread partial sums in registers, then a tree in shared memory between barriers.
import torch
import tilelang
import tilelang.language as T


@tilelang.jit(out_idx=[1, 2])
def row_sum_threads(M, N, threads=32):

    @T.prim_func
    def main(X: T.Tensor((M, N), "float32"), S: T.Tensor((M,), "float32"), Cnt: T.Tensor((M,), "int32")):
        with T.Kernel(M, threads=threads) as row:
            red = T.alloc_shared((threads,), "float32")
            pos = T.alloc_shared((threads,), "int32")
            tx = T.get_thread_binding()
            acc = T.alloc_var("float32", init=0)
            npos = T.alloc_local((1,), "int32")
            npos[0] = 0
            for i in T.serial(T.ceildiv(N, threads)):
                col = i * threads + tx
                if col < N:
                    acc += X[row, col]
                    if X[row, col] > 0:
                        npos[0] += 1
            red[tx] = acc
            pos[tx] = npos[0]
            T.sync_threads()
            step = threads // 2
            while step > 0:
                if tx < step:
                    red[tx] += red[tx + step]
                    pos[tx] += pos[tx + step]
                T.sync_threads()
                step //= 2
            if tx == 0:
                S[row] = red[0]
                Cnt[row] = pos[0]

    return main


x = torch.randn(5, 77)
s, cnt = row_sum_threads(5, 77)(x)
torch.testing.assert_close(s.double(), x.double().sum(1), rtol=1e-5, atol=1e-5)
assert torch.equal(cnt.long(), (x > 0).sum(1)), (cnt, (x > 0).sum(1))
print("thread_reduce: ok")
