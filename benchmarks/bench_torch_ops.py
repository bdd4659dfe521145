"""Per-call overhead of kernforge kernels as torch custom ops, eager and under torch.compile.

Variants, on inputs small enough that the kernel itself costs little:

* ``direct``: the ``CompiledKernel`` / plain ``kernforge.ops`` function;
* ``torch.ops eager``: the same call through ``torch.ops.<ns>.<name>`` (dispatcher,
  our Autograd kernel, ADInplaceOrView for mutating ops);
* ``compiled aot_eager`` / ``compiled inductor``: ``torch.compile(fullgraph=True)`` of a
  function that only calls the op (so the number is the compiled wrapper's cost + the op).

Rounds interleave the variants (each round times every variant once, ``--calls`` calls
each) and the table gives each variant's median per-call time over the rounds, and its
difference to ``direct``.

Reproduce:  python benchmarks/bench_torch_ops.py            (about a minute)
            python benchmarks/bench_torch_ops.py --rounds 5 --calls 200
"""
from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

import kernforge
import kernforge.dsl as T
import kernforge.ops as kops

M = T.symbolic("M")


@T.prim_func
def axpy(X: T.Tensor((M, 16), "float32"), a: T.float32, Y: T.Tensor((M, 16), "float32"),
         Z: T.Tensor((M, 16), "float32")):
    with T.Kernel(T.ceildiv(M, 4), threads=64) as bx:
        for i, j in T.Parallel(4, 16):
            if bx * 4 + i < M:
                Z[bx * 4 + i, j] = X[bx * 4 + i, j] * a + Y[bx * 4 + i, j]


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def variants():
    kernel = kernforge.compile(axpy, backend="cpu", out_idx=3)
    op = kernel.as_torch_op("kfbench::axpy")
    x, y = torch.randn(8, 16), torch.randn(8, 16)
    rows = torch.randn(4, 1024)

    def axpy_op(x, y):
        return op(x, 2.0, y)

    def topk_op(r):
        return torch.ops.kernforge.topk(r, 8)

    out = {
        "axpy [8,16] direct": lambda: kernel(x, 2.0, y),
        "axpy torch.ops eager": lambda: op(x, 2.0, y),
    }
    aot = torch.compile(axpy_op, fullgraph=True, backend="aot_eager")
    ind = torch.compile(axpy_op, fullgraph=True)
    out["axpy compiled aot_eager"] = lambda: aot(x, y)
    out["axpy compiled inductor"] = lambda: ind(x, y)
    out["topk [4,1024] k=8 direct"] = lambda: kops.topk(rows, 8)
    out["topk torch.ops eager"] = lambda: topk_op(rows)
    taot = torch.compile(topk_op, fullgraph=True, backend="aot_eager")
    tind = torch.compile(topk_op, fullgraph=True)
    out["topk compiled aot_eager"] = lambda: taot(rows)
    out["topk compiled inductor"] = lambda: tind(rows)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--calls", type=int, default=300, help="calls per variant per round")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    fns = variants()
    for fn in fns.values():  # compile, JIT-build and plan outside the timing
        for _ in range(3):
            fn()
    times = {name: [] for name in fns}
    with torch.inference_mode():
        for _ in range(args.rounds):
            for name, fn in fns.items():
                t0 = time.perf_counter()
                for _ in range(args.calls):
                    fn()
                times[name].append((time.perf_counter() - t0) / args.calls * 1e6)
    print(f"CPU: {cpu_model()}, torch {torch.__version__}, 1 torch thread, "
          f"{args.rounds} interleaved rounds x {args.calls} calls, median per call")
    print(f"{'variant':28s} {'us/call':>9s} {'vs direct':>10s}")
    base = None
    for name, ts in times.items():
        med = statistics.median(ts)
        if name.endswith("direct"):
            base = med
        print(f"{name:28s} {med:9.1f} {med - base:+9.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
