"""CPU backend vs torch on CPU: MLA decode and MoE grouped GEMM, same inputs, same run.

Each row times the kernforge ``cpu`` backend (through the FlashMLA / DeepGEMM style
ops, kernel already built) and torch doing the same math, reports the median of
``--repeat`` runs and the ratio torch/kernforge (> 1: kernforge is faster).  Results
are checked against each other before timing, so a fast wrong kernel cannot report.

    python benchmarks/bench_mla_gemm_cpu.py [--repeat 7] [--threads N]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from kernforge.kernels import grouped_gemm as G
from kernforge.kernels import mla_decode as M
from kernforge.ops import grouped_gemm as gg_ops
from kernforge.ops import mla as mla_ops


def medians_ms(fns: list, repeat: int, clock=time.perf_counter) -> list[float]:
    """Median time of each function (wall time, or ``clock``: ``time.process_time`` for CPU
    time on a loaded machine at one thread), run round-robin so that every contender sees
    the same background load (this machine is shared)."""
    for fn in fns:
        fn()  # warm-up (and build)
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeat):
        for fn, ts in zip(fns, times):
            t = clock()
            fn()
            ts.append((clock() - t) * 1e3)
    return [statistics.median(ts) for ts in times]


# ---------------------------------------------------------------- MLA decode


def torch_mla_fp32(q, kv, table, seqlen, scale, dim_v):
    """Gather the pages, then matmul / softmax / matmul in float32 (the kernel's math)."""
    b, s_q, h, d = q.shape
    k = kv[table.long()].reshape(b, -1, d)[:, :seqlen].float()          # [b, L, d]
    scores = torch.matmul(q.float().reshape(b, s_q * h, d), k.transpose(1, 2)) * scale
    lse = torch.logsumexp(scores, -1)
    out = torch.matmul(torch.softmax(scores, -1), k[..., :dim_v])
    return out.reshape(b, s_q, h, dim_v).bfloat16(), lse


def torch_mla_sdpa_bf16(q, kv, table, seqlen, scale, dim_v):
    """Gather the pages, then torch's fused SDPA in bf16 (values = first dim_v dims)."""
    b, s_q, h, d = q.shape
    k = kv[table.long()].reshape(b, -1, d)[:, :seqlen]
    return torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k[:, None], k[:, None, :, :dim_v], scale=scale)


def bench_mla(repeat: int) -> list[list[str]]:
    rows = []
    for label, b, h, d, seqlen, splits in (("V3 dims (d 576/512), h 128", 2, 128, 576, 1024, None),
                                           ("V4 dims (d 512/512), h 64", 2, 64, 512, 2048, None),
                                           ("V4 dims, one request", 1, 64, 512, 4096, None)):
        g = torch.Generator().manual_seed(0)
        kv, table = M.make_cache([seqlen] * b, 64, 1, d, g)
        q = torch.randn(b, 1, h, d, generator=g).bfloat16()
        lens = torch.full((b,), seqlen, dtype=torch.int32)
        scale = d ** -0.5
        run = lambda: mla_ops.flash_mla_with_kvcache(q, kv, table, lens, 512, backend="cpu",  # noqa: E731
                                                     num_kv_splits=splits)
        out, lse = run()
        ref, ref_lse = torch_mla_fp32(q, kv, table, seqlen, scale, 512)
        assert (out.float() - ref.float()).abs().max() < 0.05, "kernforge and torch disagree"
        assert (lse.reshape(b, h) - ref_lse.reshape(b, h)).abs().max() < 1e-3
        k32 = kv[table.long()].reshape(b, -1, d)[:, :seqlen].float()       # pre-gathered, fp32
        q32 = q.float().reshape(b, h, d)

        def torch_dense_fp32():
            scores = torch.matmul(q32, k32.transpose(1, 2)) * scale
            return torch.matmul(torch.softmax(scores, -1), k32[..., :512]), torch.logsumexp(scores, -1)

        t_kf, t_fp32, t_pre, t_sdpa = medians_ms(
            [run, lambda: torch_mla_fp32(q, kv, table, seqlen, scale, 512), torch_dense_fp32,
             lambda: torch_mla_sdpa_bf16(q, kv, table, seqlen, scale, 512)], repeat)
        flops = 2.0 * b * h * seqlen * (d + 512)
        used = splits or M.config.choose_splits("cpu", M.config.choose("cpu", h, 1, 1, d, 512, 64, False), b,
                                                table.shape[1], q.device)["num_splits"]
        rows.append([f"mla_decode {label}, b {b}, seqlen {seqlen}, splits {used}", f"{t_kf:.2f}",
                     f"{t_fp32:.2f} / {t_pre:.2f} / {t_sdpa:.2f}",
                     f"{t_fp32 / t_kf:.2f} / {t_pre / t_kf:.2f} / {t_sdpa / t_kf:.2f}",
                     f"{flops / t_kf / 1e6:.2f}"])
    return rows


# ---------------------------------------------------------------- grouped GEMM


def bench_grouped_gemm(repeat: int) -> list[list[str]]:
    rows = []
    for group_rows, n, k in (([128] * 8, 1024, 1024), ([300, 0, 57, 200], 2048, 512)):
        g = torch.Generator().manual_seed(0)
        m_indices = G.contiguous_layout(group_rows, 128)
        m = m_indices.numel()
        a = torch.randn(m, k, generator=g).bfloat16()
        a[m_indices < 0] = 0
        b = torch.randn(len(group_rows), n, k, generator=g).bfloat16()
        d = torch.empty(m, n, dtype=torch.bfloat16)
        run = lambda: gg_ops.m_grouped_bf16_gemm_nt_contiguous(a, b, d, m_indices, backend="cpu")  # noqa: E731
        starts = [sum(-(-r // 128) * 128 for r in group_rows[:i]) for i in range(len(group_rows))]

        def loop():
            out = torch.zeros(m, n, dtype=torch.bfloat16)
            for e, (s, r) in enumerate(zip(starts, group_rows)):
                out[s:s + r] = a[s:s + r] @ b[e].T
            return out

        offs = torch.tensor([s + -(-r // 128) * 128 for s, r in zip(starts, group_rows)], dtype=torch.int32)
        grouped = lambda: torch._grouped_mm(a, b.transpose(-2, -1), offs=offs)  # noqa: E731
        run()
        ref = loop()
        assert (d.float() - ref.float()).abs().max() <= 1e-2 * ref.float().abs().max(), "disagree"
        t_kf, t_loop, t_grouped = medians_ms([run, loop, grouped], repeat)
        flops = 2.0 * sum(group_rows) * n * k
        rows.append([f"grouped_gemm G {len(group_rows)}, rows {group_rows}, N {n}, K {k}",
                     f"{t_kf:.2f}", f"{t_loop:.2f} / {t_grouped:.2f} / -",
                     f"{t_loop / t_kf:.2f} / {t_grouped / t_kf:.2f} / -", f"{flops / t_kf / 1e6:.2f}"])
    return rows


def bench_split_kv(repeat: int) -> str:
    """One request, V4 dims: the same kernel without and with split-KV, round-robin."""
    g = torch.Generator().manual_seed(0)
    kv, table = M.make_cache([4096], 64, 1, 512, g)
    q = torch.randn(1, 1, 64, 512, generator=g).bfloat16()
    lens = torch.tensor([4096], dtype=torch.int32)
    auto = 2                                  # as many splits as this machine's 2 cores
    one, split = medians_ms([
        lambda: mla_ops.flash_mla_with_kvcache(q, kv, table, lens, 512, backend="cpu", num_kv_splits=1),
        lambda: mla_ops.flash_mla_with_kvcache(q, kv, table, lens, 512, backend="cpu",
                                               num_kv_splits=auto)], repeat)
    return (f"split-KV (forced), V4 dims, b 1, seqlen 4096: 1 split {one:.2f} ms, {auto} splits "
            f"{split:.2f} ms (speed-up {one / split:.2f}x)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    header = ["problem", "kernforge cpu ms", "torch ms (A / B / C)", "torch/kernforge (A / B / C)",
              "kernforge GFLOP/s"]
    rows = bench_mla(args.repeat) + bench_grouped_gemm(args.repeat)
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    print(f"torch threads: {torch.get_num_threads()}; MLA: A = page gather + fp32 matmul/softmax, "
          "B = same on a pre-gathered fp32 cache, C = page gather + bf16 SDPA; grouped GEMM: "
          "A = per-expert bf16 matmul loop, B = torch._grouped_mm")
    for r in [header] + rows:
        print("  ".join(x.ljust(w) for x, w in zip(r, widths)))
    print(bench_split_kv(args.repeat))


if __name__ == "__main__":
    main()
