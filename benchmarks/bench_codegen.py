"""How long DSL -> CPU C++ source takes, per kernel, split into trace / passes / render;
and, in the same run, TileLang's ``tilelang.lower`` on an equivalent GEMM.

    python benchmarks/bench_codegen.py [--repeat 5] [--run]

Every registered library kernel (``kernforge.kernels.registry``, its "bench"
problem) plus a 1024^3 GEMM written in the DSL is timed: *trace* re-runs the
Python function under the tracer (the factory's memo is bypassed), *passes* is
the CPU pipeline (simplify, edge masks, simplify) with verification after each
pass, *render* is the CPU renderer filling its template.  Compilation by g++
is not included.  TileLang (pip ``tilelang==0.1.15``) lowers the same GEMM to
CUDA source under ``tvm.target.Target("cuda")``; if it cannot be imported the
script says why and reports ours only.  Medians of ``--repeat`` runs, in process
CPU time (all threads), which a busy shared machine distorts far less than wall time.

``--run`` also compiles the DSL GEMM for the CPU and times the generated code
against ``torch.matmul`` on one thread (process CPU time per call, so a busy
machine does not distort the ratio; run it with ``OMP_NUM_THREADS=1``).
"""
from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
import traceback

import kernforge.dsl as T
from kernforge.backends.cpu.renderer import CpuRenderer

GEMM = dict(M=1024, N=1024, K=1024, block_M=128, block_N=128, block_K=32, dtype="float16")


def kf_gemm(M, N, K, block_M, block_N, block_K, dtype):
    @T.prim_func
    def gemm(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
            A_s = T.alloc_shared((block_M, block_K), dtype)
            B_s = T.alloc_shared((block_K, block_N), dtype)
            C_l = T.alloc_fragment((block_M, block_N), "float32")
            T.clear(C_l)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=3):
                T.copy(A[by * block_M, k * block_K], A_s)
                T.copy(B[k * block_K, bx * block_N], B_s)
                T.gemm(A_s, B_s, C_l)
            T.copy(C_l, C[by * block_M, bx * block_N])
    return gemm


def tl_gemm(M, N, K, block_M, block_N, block_K, dtype):
    import tilelang.language as TL

    @TL.prim_func
    def gemm(A: TL.Tensor((M, K), dtype), B: TL.Tensor((K, N), dtype), C: TL.Tensor((M, N), dtype)):
        with TL.Kernel(TL.ceildiv(N, block_N), TL.ceildiv(M, block_M), threads=128) as (bx, by):
            A_s = TL.alloc_shared((block_M, block_K), dtype)
            B_s = TL.alloc_shared((block_K, block_N), dtype)
            C_l = TL.alloc_fragment((block_M, block_N), "float")
            TL.clear(C_l)
            for k in TL.Pipelined(TL.ceildiv(K, block_K), num_stages=3):
                TL.copy(A[by * block_M, k * block_K], A_s)
                TL.copy(B[k * block_K, bx * block_N], B_s)
                TL.gemm(A_s, B_s, C_l)
            TL.copy(C_l, C[by * block_M, bx * block_N])
    return gemm


def median_time(fn, repeat: int):
    """Median process CPU time of ``fn()`` (a shared, busy machine inflates wall time)."""
    times, out = [], None
    for _ in range(repeat):
        t = time.process_time()
        out = fn()
        times.append(time.process_time() - t)
    return statistics.median(times), out


def time_ours(trace, repeat: int) -> dict:
    """``trace()`` returns a fresh ``ir.Kernel`` each call."""
    t_trace, kernel = median_time(trace, repeat)
    r = CpuRenderer()
    t_pass, lowered = median_time(lambda: r.lower(kernel), repeat)
    t_render, src = median_time(lambda: CpuRenderer().render_lowered(lowered), repeat)
    return {"trace": t_trace, "passes": t_pass, "render": t_render, "lines": src.count("\n")}


def library_kernels():
    """(name, fresh-trace callable) for every registered kernel's bench problem."""
    from kernforge.kernels import registry

    out = []
    for name, spec in sorted(registry.all_specs().items()):
        params = spec.problems["bench"].params if "bench" in spec.problems else next(iter(spec.problems.values())).params

        def trace(spec=spec, params=params):
            _forget_specialisations(spec.factory)
            return spec.factory(**params).ir
        out.append((name, trace))
    return out


def _forget_specialisations(factory) -> None:
    """KernelFactory memoises traced kernels; empty the memos of the factories in the
    spec's module so that every timed call traces afresh."""
    module = sys.modules[getattr(factory, "__module__", None) or factory.fn.__module__]
    for obj in list(vars(module).values()) + [factory]:
        if isinstance(obj, T.KernelFactory):
            obj._memo.clear()


def time_tilelang(repeat: int):
    """(trace seconds, lower seconds) for TileLang's GEMM, or (None, reason)."""
    try:
        import tilelang
        import tvm
    except Exception as e:  # report, do not hide: the table says TileLang was unavailable and why
        return None, f"tilelang unavailable: {type(e).__name__}: {e}"
    try:
        t_trace, func = median_time(lambda: tl_gemm(**GEMM), repeat)

        def lower():
            with tvm.target.Target("cuda"):
                return tilelang.lower(tl_gemm(**GEMM))
        lower()  # first call loads TVM's pass registry
        t_lower, _ = median_time(lower, repeat)
        return (t_trace, t_lower - t_trace), f"tilelang {tilelang.__version__}"
    except Exception:
        return None, "tilelang.lower failed:\n" + traceback.format_exc(limit=3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--run", action="store_true", help="also time the generated CPU GEMM against torch.matmul")
    args = ap.parse_args()

    rows = [("gemm_1024_fp16 (DSL)", time_ours(lambda: kf_gemm(**GEMM).ir, args.repeat))]
    for name, trace in library_kernels():
        rows.append((name, time_ours(trace, args.repeat)))
    tl, note = time_tilelang(args.repeat)

    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.processor() or platform.machine()}, "
          f"median of {args.repeat}")
    head = "| kernel | trace ms | passes ms | render ms | total ms | C++ lines |"
    print(head)
    print("|---|---:|---:|---:|---:|---:|")
    for name, r in rows:
        total = r["trace"] + r["passes"] + r["render"]
        print(f"| {name} | {r['trace'] * 1e3:.2f} | {r['passes'] * 1e3:.2f} | {r['render'] * 1e3:.2f} | "
              f"{total * 1e3:.2f} | {r['lines']} |")
    ours = rows[0][1]
    if tl is None:
        print(f"\nTileLang comparison skipped: {note}")
    else:
        print_tilelang(ours, tl, note)
    if args.run:
        run_generated(args.repeat)


def print_tilelang(ours: dict, tl: tuple, note: str) -> None:
    ours_total = ours["trace"] + ours["passes"] + ours["render"]
    tl_trace, tl_lower = tl
    print(f"\n| GEMM 1024^3 fp16, 128x128x32 | trace ms | lower/passes+render ms | total ms |")
    print("|---|---:|---:|---:|")
    print(f"| kernforge (CPU C++) | {ours['trace'] * 1e3:.2f} | {(ours['passes'] + ours['render']) * 1e3:.2f} | "
          f"{ours_total * 1e3:.2f} |")
    print(f"| {note} (CUDA, tilelang.lower) | {tl_trace * 1e3:.2f} | {tl_lower * 1e3:.2f} | "
          f"{(tl_trace + tl_lower) * 1e3:.2f} |")
    print(f"\nratio TileLang / kernforge (total DSL -> source): {(tl_trace + tl_lower) / ours_total:.1f}x")


def cpu_seconds(fn, repeat: int) -> float:
    fn()
    start = time.process_time()
    for _ in range(repeat):
        fn()
    return (time.process_time() - start) / repeat


def run_generated(repeat: int) -> None:
    """The generated CPU GEMM against torch.matmul, one thread, CPU time per call."""
    import torch

    import kernforge

    torch.set_num_threads(1)
    print("\n| generated CPU GEMM (1 thread) | ours ms | torch.matmul ms | ours GFLOP/s | torch / ours time |")
    print("|---|---:|---:|---:|---:|")
    for dt, (bm, bn, bk) in (("float32", (64, 64, 64)), ("bfloat16", (64, 64, 64)), ("bfloat16", (128, 128, 64))):
        m = n = k = 512
        kern = kernforge.compile(kf_gemm(m, n, k, bm, bn, bk, dt), backend="cpu")
        tdt = getattr(torch, dt)
        a, b = torch.randn(m, k).to(tdt), torch.randn(k, n).to(tdt)
        c = torch.full((m, n), float("nan"), dtype=tdt)
        kern(a, b, c)
        ref = a.float() @ b.float()
        err = (c.float() - ref).abs().max().item() / ref.abs().max().item()
        assert err < (1e-5 if dt == "float32" else 1e-2), f"generated GEMM is wrong: relative error {err}"
        ours = cpu_seconds(lambda: kern(a, b, c), repeat)
        theirs = cpu_seconds(lambda: a @ b, repeat)
        print(f"| {dt} 512^3, tile {bm}x{bn}x{bk} | {ours * 1e3:.2f} | {theirs * 1e3:.2f} | "
              f"{2 * m * n * k / ours / 1e9:.0f} | {theirs / ours:.2f} |")


if __name__ == "__main__":
    main()
