"""What one CPU GEMM call costs at decode sizes, layer by layer, against ``F.linear``.

The engine's decode step makes ~70 GEMM calls at M = 1-8 (docs/performance.md), so the
fixed cost of a call matters as much as the kernel.  For each shape this times, interleaved
(medians of ``--rounds`` rounds of ``--calls`` calls each, one thread):

* ``raw``: the compiled function alone, through ctypes, with a prebuilt pointer array;
* ``launcher``: ``CpuLauncher.__call__`` (pointer array, symbol array, status check);
* ``kernel``: ``CompiledKernel.__call__`` (argument plan lookup, then the launcher);
* ``op nt`` / ``op nn``: ``ops.fp32_gemm_nt`` with a ``[N, K]`` weight and ``ops.fp32_gemm_nn``
  with the ``[K, N]`` one the engine stores (checks, chooser, kernel);
* ``F.linear``: torch's own, for scale.

    python benchmarks/bench_launch_overhead.py [--rounds 9] [--calls 500] [--json]

The machine is shared: read the differences between columns of one row (the per-layer
cost), not absolute numbers from different runs.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F

from kernforge import ops
from kernforge.kernels import gemm as kernels
from kernforge.kernels.gemm import config
from kernforge.ops import gemm as gemm_op

SHAPES = [(1, 128, 128), (1, 512, 128), (8, 384, 128)]  # (M, N, K): tiny()'s decode GEMMs


def _per_call_us(fn, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e6


def row(m: int, n: int, k: int, rounds: int, calls: int) -> dict:
    g = torch.Generator().manual_seed(0)
    a, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    wt, d = w.t().contiguous(), torch.empty(m, n)
    params = config.choose_dense("cpu", n, k, m, a_major="k", b_major="mn", accumulate=False, dtype="float32",
                                 out_dtype="float32")
    kernel = gemm_op._kernel(kernels.dense_gemm, "cpu", **params)
    dims = kernel._plan((a, wt, d))[0]
    pointers = (ctypes.c_void_p * 3)(a.data_ptr(), wt.data_ptr(), d.data_ptr())
    sym = np.array(dims, dtype=np.int64)
    cfunc, ptr, sym_ptr = kernel.launcher.cfunc, ctypes.cast(pointers, ctypes.c_void_p), sym.ctypes.data
    fns = {
        "raw": lambda: cfunc(ptr, sym_ptr),
        "launcher": lambda: kernel.launcher([a, wt, d], dims),
        "kernel": lambda: kernel(a, wt, d),
        "op nn": lambda: ops.fp32_gemm_nn(a, wt, d, backend="cpu"),
        "op nt": lambda: ops.fp32_gemm_nt(a, w, d, backend="cpu"),
        "F.linear": lambda: F.linear(a, w),
    }
    for f in fns.values():
        f()
    ops.fp32_gemm_nn(a, wt, d, backend="cpu")
    torch.testing.assert_close(d, F.linear(a, w), rtol=1e-5, atol=1e-4)
    samples = {name: [] for name in fns}
    for _ in range(rounds):
        for name, f in fns.items():
            samples[name].append(_per_call_us(f, calls))
    return dict(shape=(m, n, k), block_M=params["block_M"], **{n_: statistics.median(v) for n_, v in samples.items()})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = [row(*s, args.rounds, args.calls) for s in SHAPES]
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    cols = ["raw", "launcher", "kernel", "op nn", "op nt", "F.linear"]
    print(f"us per call, 1 thread, medians of {args.rounds} x {args.calls} interleaved calls")
    print(f"{'M x N x K':<14}{'block_M':>8}" + "".join(f"{c:>10}" for c in cols))
    for r in rows:
        print(f"{'x'.join(map(str, r['shape'])):<14}{r['block_M']:>8}" + "".join(f"{r[c]:>10.1f}" for c in cols))


if __name__ == "__main__":
    main()
