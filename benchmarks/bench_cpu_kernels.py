"""kernforge's generated CPU kernels against torch on the same inputs, in the same run.

    python benchmarks/bench_cpu_kernels.py [--repeat 5] [--threads 1 2] [--only gemm,grouped,mla]
                                           [--quick] [--markdown]

Rows (each checked against the peer before it is timed, so a fast wrong kernel cannot report):

* ``gemm``: the DSL tile GEMM of ``bench_codegen.py`` (``C = A @ B``, row-major, float32 accumulation) in float32 and
  bfloat16 against ``torch.matmul``: cubes 256-2048 and the decode shapes M in {1, 8, 64} x
  N = K = 4096; plus, when ``kernforge.ops.fp8_gemm_nt`` exists, the e4m3 GEMM with 1x128 /
  128x128 block scales against torch's dequantise + matmul.
* ``grouped``: ``m_grouped_bf16_gemm_nt_contiguous`` / ``_masked`` against a per-expert
  ``torch`` matmul loop and ``torch._grouped_mm``, ragged row counts including empty experts.
* ``mla``: ``flash_mla_with_kvcache`` (dense and sparse) against the same math in torch (page
  gather + float32 matmul/softmax), with the KV bytes it reads per second next to the
  machine's streaming read bandwidth measured in the same run.

Times are wall-clock medians of ``--repeat`` interleaved runs (every contender sees the same
background load; ``--cpu-time``: process CPU time for the 1-thread rows); the ratio is
torch's time over kernforge's (> 1: kernforge is faster).
Generated kernels run under the system OpenMP runtime, torch under its own: both are set to
the row's thread count.  The CPU model and the instruction-set path are printed first.
"""
from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time

import torch

import kernforge
from bench_codegen import kf_gemm  # the DSL tile GEMM (row-major C = A @ B, float32 accumulation)
import bench_mla_gemm_cpu
from kernforge.backends.cpu import isa, threads

GEMM_CUBES = (256, 512, 1024, 2048)
GEMM_DECODE = (1, 8, 64)


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        name = next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except Exception:  # noqa: BLE001 - lscpu missing: say what platform knows
        name = platform.processor() or platform.machine()
    return f"{name}, {os.cpu_count()} logical CPUs"


CLOCK = {"clock": time.perf_counter}  # main() switches it to CPU time for --cpu-time at 1 thread


def medians_ms(fns: list, repeat: int) -> list[float]:
    """Round-robin medians (every contender sees the same background load) on the current clock."""
    return bench_mla_gemm_cpu.medians_ms(fns, repeat, CLOCK["clock"])


def set_threads(n: int, cpu_time: bool = False) -> None:
    torch.set_num_threads(n)
    threads.set_num_threads(n)
    CLOCK["clock"] = time.process_time if cpu_time and n == 1 else time.perf_counter


# ---------------------------------------------------------------- dense GEMM


def cpu_tiles(M: int, N: int, K: int, dtype: str = "float32") -> tuple[int, int, int]:
    """Tiles for the host (this row-major ``C = A @ B`` kernel is the script's own; the library's
    nt GEMM takes its tiles from ``kernels/gemm/config.choose_dense``).

    * cubes: 128 x 128 x 128 in float32 (A read in place by the GEMM, see ``passes.gemm_layout``;
      the B tile (64 KB) and C (64 KB) stay in a 512 KB L2); bf16 on AVX512-BF16 256 x 128 x 256:
      half the float32 C tile reads and writes per FLOP of the 128-deep step, and half the B
      tile copies per row (Zen 4, one thread, CPU time against torch: 1.09 / 1.10 / 0.97 / 1.01x
      at 256-2048^3 against 1.04 / 1.03 / 0.94 / 0.95x with 128^3); up to 512 rows since the GEMM
      packs B from its source once per row tile (``kf::gemm_bf16_nn``): at 512^3 one pack per B
      tile instead of two (1.01 / 1.05x against 1.00 / 0.98x with 256 rows; 1024^3 and 2048^3
      unchanged);
    * decode rows (M <= 16): the whole M, 2048 columns and 8-deep K steps: B is read in place
      as 8 contiguous 8 KB row segments per step, which the prefetcher streams, and two column
      blocks keep two threads busy;
    * M <= 64: the whole M, 128 x 128."""
    if M <= 16:
        return M, min(N, 2048), 8
    if M <= 64:
        return M, 128, 128
    if dtype == "bfloat16" and isa.default_path() in isa.NATIVE_BF16:
        return min(M, 512), 128, 256
    return 128, 128, 128


def gemm_shapes(quick: bool):
    cubes = GEMM_CUBES[:3] if quick else GEMM_CUBES
    return [(s, s, s) for s in cubes] + [(m, 4096, 4096) for m in GEMM_DECODE]


def bench_gemm(repeat: int, n_threads: int, quick: bool) -> list[list[str]]:
    rows = []
    for dt in ("float32", "bfloat16"):
        tdt = getattr(torch, dt)
        for M, N, K in gemm_shapes(quick):
            g = torch.Generator().manual_seed(M + N + K)
            a, b = torch.randn(M, K, generator=g).to(tdt), torch.randn(K, N, generator=g).to(tdt)
            c = torch.full((M, N), float("nan"), dtype=tdt)
            tiles = cpu_tiles(M, N, K, dt)
            kern = kernforge.compile(kf_gemm(M, N, K, *tiles, dt), backend="cpu")
            kern(a, b, c)
            ref = a.double() @ b.double()
            err = float((c.double() - ref).abs().max() / ref.abs().max())
            assert err < (1e-5 if dt == "float32" else 1e-2), f"gemm {dt} {M}x{N}x{K} is wrong: {err}"
            # torch's bf16 matmul takes minutes at 2048^3 without AVX512-BF16 / AMX: one run there
            slow_peer = dt == "bfloat16" and M * N * K >= 1024 ** 3 and "avx512bf16" not in isa.compiler_paths()
            ours, theirs = medians_ms([lambda: kern(a, b, c), lambda: torch.matmul(a, b)], 1 if slow_peer else repeat)
            flop = 2.0 * M * N * K
            rows.append([f"gemm {dt} {M}x{N}x{K} (tiles {tiles[0]}x{tiles[1]}x{tiles[2]}, {isa.default_path()})", n_threads,
                         f"{ours:.2f}", f"{theirs:.2f}", f"{theirs / ours:.2f}",
                         f"{flop / ours / 1e6:.1f} GFLOP/s"])
    rows += bench_fp8_gemm(repeat, n_threads, quick)
    return rows


def bench_fp8_gemm(repeat: int, n_threads: int, quick: bool) -> list[list[str]]:
    from kernforge import ops
    if not hasattr(ops, "fp8_gemm_nt"):
        return [["gemm fp8 e4m3 (block scales)", n_threads, "-", "-", "-", "kernforge.ops.fp8_gemm_nt: not built yet"]]
    from kernforge.kernels.grouped_gemm.reference import per_block_cast_to_fp8, per_token_cast_to_fp8
    rows = []
    for M, N, K in ((256, 1024, 1024), (64, 4096, 4096)) if quick else ((512, 2048, 2048), (64, 4096, 4096)):
        g = torch.Generator().manual_seed(M)
        x, w = torch.randn(M, K, generator=g), torch.randn(N, K, generator=g)
        a, b = per_token_cast_to_fp8(x), per_block_cast_to_fp8(w)
        d = torch.empty(M, N, dtype=torch.bfloat16)
        run = lambda: ops.fp8_gemm_nt(a, b, d, backend="cpu")  # noqa: E731

        def torch_path():
            xa = a[0].float().view(M, K // 128, 128) * a[1].view(M, K // 128, 1)
            wb = (b[0].float().view(N // 128, 128, K // 128, 128) * b[1].view(N // 128, 1, K // 128, 1))
            return (xa.view(M, K) @ wb.view(N, K).T).bfloat16()

        run()
        ref = torch_path().float()
        assert (d.float() - ref).abs().max() <= 2e-2 * ref.abs().max(), "fp8 gemm disagrees with torch"
        ours, theirs = medians_ms([run, torch_path], repeat)
        rows.append([f"gemm fp8 e4m3 {M}x{N}x{K}, 128x128 scales (vs dequantise + matmul)", n_threads,
                     f"{ours:.2f}", f"{theirs:.2f}", f"{theirs / ours:.2f}", f"{2.0 * M * N * K / ours / 1e6:.1f} GFLOP/s"])
    return rows


# ---------------------------------------------------------------- grouped GEMM


def bench_grouped(repeat: int, n_threads: int, quick: bool) -> list[list[str]]:
    from kernforge.kernels import grouped_gemm as G
    from kernforge.ops import grouped_gemm as gg

    cases = [([128] * 8, 1024, 1024), ([512, 0, 77, 300], 2048, 2048),
             ([16, 64, 0, 33, 48, 16, 130, 0] * 4, 1024, 1024)]
    if not quick:
        cases.append(([256] * 4, 4096, 4096))
    rows = []
    for group_rows, n, k in cases:
        g = torch.Generator().manual_seed(len(group_rows) + n)
        m_indices = G.contiguous_layout(group_rows, 128)
        m = m_indices.numel()
        a = torch.randn(m, k, generator=g).bfloat16()
        a[m_indices < 0] = 0
        b = torch.randn(len(group_rows), n, k, generator=g).bfloat16()
        d = torch.empty(m, n, dtype=torch.bfloat16)
        run = lambda: gg.m_grouped_bf16_gemm_nt_contiguous(a, b, d, m_indices, backend="cpu")  # noqa: E731
        starts = [sum(-(-r // 128) * 128 for r in group_rows[:i]) for i in range(len(group_rows))]

        def loop():
            out = torch.zeros(m, n, dtype=torch.bfloat16)
            for e, (s, r) in enumerate(zip(starts, group_rows)):
                if r:
                    out[s:s + r] = a[s:s + r] @ b[e].T
            return out

        offs = torch.tensor([s + -(-r // 128) * 128 for s, r in zip(starts, group_rows)], dtype=torch.int32)
        grouped = lambda: torch._grouped_mm(a, b.transpose(-2, -1), offs=offs)  # noqa: E731
        run()
        ref = loop().float()
        assert (d.float() - ref).abs().max() <= 1e-2 * ref.abs().max(), "grouped GEMM disagrees with torch"
        ours, t_loop, t_grouped = medians_ms([run, loop, grouped], repeat)
        flop = 2.0 * sum(group_rows) * n * k
        label = f"G {len(group_rows)}, rows {sum(group_rows)} ({min(group_rows)}-{max(group_rows)})"
        rows.append([f"grouped contiguous bf16 {label}, N {n}, K {k}", n_threads, f"{ours:.2f}",
                     f"{t_loop:.2f} / {t_grouped:.2f}", f"{t_loop / ours:.2f} / {t_grouped / ours:.2f}",
                     f"{flop / ours / 1e6:.1f} GFLOP/s"])
    # masked (decode): rows past masked_m are never read
    for masked, n, k in (([64, 3, 0, 17, 64, 40, 1, 64], 1024, 1024), ([200, 9, 128, 0], 2048, 2048)):
        groups, max_m = len(masked), 256
        g = torch.Generator().manual_seed(n + len(masked))
        a = torch.randn(groups, max_m, k, generator=g).bfloat16()
        b = torch.randn(groups, n, k, generator=g).bfloat16()
        d = torch.empty(groups, max_m, n, dtype=torch.bfloat16)
        masked_m = torch.tensor(masked, dtype=torch.int32)
        expected = max(1, sum(masked) // groups)
        run = lambda: gg.m_grouped_bf16_gemm_nt_masked(a, b, d, masked_m, expected, backend="cpu")  # noqa: E731

        def loop():
            out = torch.zeros(groups, max_m, n, dtype=torch.bfloat16)
            for e, r in enumerate(masked):
                if r:
                    out[e, :r] = a[e, :r] @ b[e].T
            return out

        run()
        ref = loop()
        for e, r in enumerate(masked):
            err = (d[e, :r].float() - ref[e, :r].float()).abs().max() if r else 0
            assert err <= 1e-2 * max(1.0, float(ref[e, :r].float().abs().max()) if r else 1.0), "masked disagrees"
        ours, t_loop = medians_ms([run, loop], repeat)
        flop = 2.0 * sum(masked) * n * k
        rows.append([f"grouped masked bf16 G {groups}, masked_m {sum(masked)} ({min(masked)}-{max(masked)}), "
                     f"N {n}, K {k}", n_threads, f"{ours:.2f}", f"{t_loop:.2f} / -", f"{t_loop / ours:.2f} / -",
                     f"{flop / ours / 1e6:.1f} GFLOP/s"])
    return rows


# ---------------------------------------------------------------- MLA decode


def read_bandwidth_gbs(repeat: int) -> float:
    """Streaming read bandwidth: a sum over 512 MiB of float32 (far past every cache)."""
    x = torch.ones(128 * 1024 * 1024)
    (t,) = bench_mla_gemm_cpu.medians_ms([lambda: x.sum()], repeat)  # wall time, whatever the clock
    return x.numel() * 4 / t / 1e6


def torch_mla(q, kv, table, seqlen, scale, dim_v, indices=None):
    """Page gather + float32 matmul / softmax / matmul: the kernel's math in torch."""
    b, s_q, h, d = q.shape
    if indices is None:
        k = kv[table.long()].reshape(b, -1, d)[:, :seqlen].float()
    else:
        flat = kv.reshape(-1, d)
        k = flat[indices.reshape(b, -1).long().clamp(min=0)].float()
    scores = torch.matmul(q.float().reshape(b, s_q * h, d), k.transpose(1, 2)) * scale
    out = torch.matmul(torch.softmax(scores, -1), k[..., :dim_v])
    return out.reshape(b, s_q, h, dim_v).bfloat16(), torch.logsumexp(scores, -1)


def bench_mla(repeat: int, n_threads: int, quick: bool) -> list[list[str]]:
    from kernforge.kernels import mla_decode as M
    from kernforge.ops import mla

    bw = read_bandwidth_gbs(repeat)
    rows = [["streaming read bandwidth (torch sum over 512 MiB fp32)", n_threads, "-", "-", "-", f"{bw:.1f} GB/s"]]
    dense = [(1, 64, 4096), (4, 128, 2048), (16, 64, 1024)] + ([] if quick else [(1, 64, 32768), (32, 64, 1024)])
    for b, h, seqlen in dense:
        g = torch.Generator().manual_seed(b * h)
        kv, table = M.make_cache([seqlen] * b, 64, 1, 512, g)
        q = torch.randn(b, 1, h, 512, generator=g).bfloat16()
        lens = torch.full((b,), seqlen, dtype=torch.int32)
        run = lambda: mla.flash_mla_with_kvcache(q, kv, table, lens, 512, backend="cpu")  # noqa: E731
        out, _ = run()
        ref, _ = torch_mla(q, kv, table, seqlen, 512 ** -0.5, 512)
        assert (out.float() - ref.float()).abs().max() < 0.05, "MLA disagrees with torch"
        ours, theirs = medians_ms([run, lambda: torch_mla(q, kv, table, seqlen, 512 ** -0.5, 512)], repeat)
        kv_bytes = b * seqlen * 512 * 2
        gbs = kv_bytes / ours / 1e6
        rows.append([f"mla dense h {h}, d 512, b {b}, seqlen {seqlen}", n_threads, f"{ours:.2f}", f"{theirs:.2f}",
                     f"{theirs / ours:.2f}", f"{gbs:.1f} GB/s KV ({100 * gbs / bw:.0f}% of stream)"])
    for b, h, topk, seqlen in ((4, 64, 512, 8192), (4, 128, 2048, 8192)):
        g = torch.Generator().manual_seed(topk)
        kv, table = M.make_cache([seqlen] * b, 64, 1, 512, g)
        q = torch.randn(b, 1, h, 512, generator=g).bfloat16()
        lens = torch.full((b,), seqlen, dtype=torch.int32)
        pages = table.shape[1]
        # sparse: each query attends to topk token slots of its own pages (flat slot ids)
        idx = torch.stack([torch.randperm(seqlen, generator=g)[:topk] for _ in range(b)])
        flat = (table.long().gather(1, idx // 64) * 64 + idx % 64).to(torch.int32).reshape(b, 1, topk)
        run = lambda: mla.flash_mla_with_kvcache(q, kv, None, None, 512, indices=flat, backend="cpu")  # noqa: E731
        try:
            out, _ = run()
        except Exception as e:  # noqa: BLE001 - an API mismatch is reported, not hidden
            rows.append([f"mla sparse h {h}, topk {topk}, b {b}", n_threads, "-", "-", "-", f"not run: {e}"[:90]])
            continue
        ref, _ = torch_mla(q, kv, table, seqlen, 512 ** -0.5, 512, indices=flat)
        assert (out.float() - ref.float()).abs().max() < 0.05, "sparse MLA disagrees with torch"
        ours, theirs = medians_ms([run, lambda: torch_mla(q, kv, table, seqlen, 512 ** -0.5, 512, flat)], repeat)
        gbs = b * topk * 512 * 2 / ours / 1e6
        rows.append([f"mla sparse h {h}, d 512, b {b}, topk {topk} (of {pages * 64})", n_threads, f"{ours:.2f}",
                     f"{theirs:.2f}", f"{theirs / ours:.2f}", f"{gbs:.1f} GB/s KV ({100 * gbs / bw:.0f}% of stream)"])
    return rows


SECTIONS = {"gemm": bench_gemm, "grouped": bench_grouped, "mla": bench_mla}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=5, help="interleaved runs per row (median)")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="thread counts to run each row at")
    p.add_argument("--only", default="gemm,grouped,mla", help="comma-separated sections: gemm, grouped, mla")
    p.add_argument("--quick", action="store_true", help="skip the largest shapes")
    p.add_argument("--markdown", action="store_true", help="print a markdown table")
    p.add_argument("--cpu-time", action="store_true",
                   help="time 1-thread rows in process CPU time (a loaded shared machine); 2+ threads stay wall")
    args = p.parse_args()
    sections = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        p.error(f"--only: unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {cpu_model()}; CPU path "
          f"{isa.default_path()} (compiler targets {', '.join(isa.compiler_paths())}); torch {torch.__version__}; "
          f"load average {os.getloadavg()[0]:.1f}; 1-thread rows in {'CPU' if args.cpu_time else 'wall'} time")
    header = ["case", "threads", "kernforge ms", "torch ms", "torch / kernforge", "kernforge rate"]
    rows = []
    for n in args.threads:
        set_threads(n, args.cpu_time)
        for s in sections:
            print(f"... {s} at {n} thread(s)", file=sys.stderr, flush=True)
            rows += [[str(x) for x in r] for r in SECTIONS[s](args.repeat, n, args.quick)]
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for r in rows:
            print("| " + " | ".join(r) + " |")
    else:
        widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
        for r in [header] + rows:
            print("  ".join(x.ljust(w) for x, w in zip(r, widths)))


if __name__ == "__main__":
    main()
