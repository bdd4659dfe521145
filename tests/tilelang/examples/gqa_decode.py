# A TileLang program: grouped-query attention decode, split over the KV length, then combined.
import torch
import tilelang
import tilelang.language as T


@tilelang.jit
def gqa_decode(Q, K, V, num_split: int = 2, block_N: int = 16):
    batch, heads, kv_heads, seqlen, dim = T.const("batch, heads, kv_heads, seqlen, dim")
    groups = heads // kv_heads
    Q: T.Tensor((batch, heads, dim), T.float16)
    K: T.Tensor((batch, seqlen, kv_heads, dim), T.float16)
    V: T.Tensor((batch, seqlen, kv_heads, dim), T.float16)
    Out = T.empty((batch, heads, dim), T.float16)
    o_partial = T.alloc_global((batch, heads, num_split, dim), T.float)
    lse_partial = T.alloc_global((batch, heads, num_split), T.float)
    per_split = seqlen // num_split
    scale = (1.0 / dim) ** 0.5 * 1.44269504

    with T.Kernel(batch, kv_heads, num_split, threads=128) as (bid, hid, sid):
        Q_shared = T.alloc_shared((groups, dim), T.float16)
        K_shared = T.alloc_shared((block_N, dim), T.float16)
        V_shared = T.alloc_shared((block_N, dim), T.float16)
        acc_s = T.alloc_fragment((groups, block_N), T.float)
        acc_s_cast = T.alloc_fragment((groups, block_N), T.float16)
        acc_o = T.alloc_fragment((groups, dim), T.float)
        m = T.alloc_fragment((groups,), T.float)
        m_prev = T.alloc_fragment((groups,), T.float)
        r = T.alloc_fragment((groups,), T.float)
        l = T.alloc_fragment((groups,), T.float)
        T.copy(Q[bid, hid * groups:(hid + 1) * groups, :], Q_shared)
        T.fill(acc_o, 0)
        T.fill(l, 0)
        T.fill(m, -T.infinity(T.float))
        for k in T.Pipelined(per_split // block_N, num_stages=2):
            start = sid * per_split + k * block_N
            T.copy(K[bid, start:start + block_N, hid, :], K_shared)
            T.copy(V[bid, start:start + block_N, hid, :], V_shared)
            T.clear(acc_s)
            T.gemm(Q_shared, K_shared, acc_s, transpose_B=True)
            T.copy(m, m_prev)
            T.reduce_max(acc_s, m, dim=1, clear=False)
            for i in T.Parallel(groups):
                r[i] = T.exp2(m_prev[i] * scale - m[i] * scale)
            for i, j in T.Parallel(groups, block_N):
                acc_s[i, j] = T.exp2(acc_s[i, j] * scale - m[i] * scale)
            for i in T.Parallel(groups):
                l[i] *= r[i]
            for i, j in T.Parallel(groups, dim):
                acc_o[i, j] *= r[i]
            T.reduce_sum(acc_s, m_prev, dim=1)
            for i in T.Parallel(groups):
                l[i] += m_prev[i]
            T.copy(acc_s, acc_s_cast)
            T.gemm(acc_s_cast, V_shared, acc_o)
        for i, j in T.Parallel(groups, dim):
            acc_o[i, j] /= l[i]
        for i in T.Parallel(groups):
            l[i] = T.log2(l[i]) + m[i] * scale
        for i, j in T.Parallel(groups, dim):
            o_partial[bid, hid * groups + i, sid, j] = acc_o[i, j]
        for i in T.Parallel(groups):
            lse_partial[bid, hid * groups + i, sid] = l[i]

    with T.Kernel(heads, batch, threads=128) as (hid, bid):
        lse = T.alloc_fragment((num_split,), T.float)
        lse_max = T.alloc_fragment((1,), T.float)
        w = T.alloc_fragment((num_split,), T.float)
        w_sum = T.alloc_fragment((1,), T.float)
        o = T.alloc_fragment((num_split, dim), T.float)
        o_acc = T.alloc_fragment((dim,), T.float)
        T.copy(lse_partial[bid, hid, 0], lse)
        T.copy(o_partial[bid, hid, 0, 0], o)
        T.reduce_max(lse, lse_max, dim=0)
        for s in T.Parallel(num_split):
            w[s] = T.exp2(lse[s] - lse_max[0])
        T.reduce_sum(w, w_sum, dim=0)
        for s, j in T.Parallel(num_split, dim):
            o[s, j] = o[s, j] * w[s] / w_sum[0]
        T.reduce_sum(o, o_acc, dim=0)
        T.copy(o_acc, Out[bid, hid, 0])

    return Out


def ref_program(q, k, v):
    b, h, d = q.shape
    g = h // k.shape[2]
    kk = k.float().repeat_interleave(g, dim=2)
    vv = v.float().repeat_interleave(g, dim=2)
    s = torch.einsum("bhd,bshd->bhs", q.float(), kk) / d ** 0.5
    return torch.einsum("bhs,bshd->bhd", torch.softmax(s, dim=-1), vv).half()


B, H, HKV, S, D = 2, 4, 2, 64, 16
q = torch.randn(B, H, D).half()
k = torch.randn(B, S, HKV, D).half()
v = torch.randn(B, S, HKV, D).half()
torch.testing.assert_close(gqa_decode(q, k, v), ref_program(q, k, v), rtol=1e-2, atol=1e-2)
print("gqa_decode: ok")
