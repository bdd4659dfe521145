"""What checked mode costs: library kernels built with ``checks=True`` against the same kernels
unchecked, on the CPU backend, at their "demo" problem.

    OMP_NUM_THREADS=1 python benchmarks/bench_checks.py [--repeat 21] [--problem demo] [--kernels topk_fp32,mla_decode]

Both builds of a kernel run on the same inputs, interleaved call by call (unchecked,
checked, unchecked, ...), so load from other jobs on a shared machine hits both alike;
the table gives the median of each and their ratio, in wall time and in process CPU
time (what a busy machine distorts least: run it with ``OMP_NUM_THREADS=1``, or the
OpenMP team's waiting is counted too).  Before timing, both builds' outputs are
compared bit for bit, which also shows that the checked build computes the same thing.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import time

import torch

import kernforge
from kernforge.kernels import registry

DEFAULT = ("topk_fp32", "topk_bf16", "mla_decode", "m_grouped_gemm_nt_contiguous", "m_grouped_gemm_nt_masked")


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or "unknown CPU"
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    return f"{fields.get('Model name', '?').strip()}, {fields.get('CPU(s)', '?').strip()} CPUs"


def bench(name: str, problem: str, repeat: int) -> dict:
    spec = registry.all_specs()[name]
    params = spec.problems[problem].params
    builds = {c: kernforge.compile(spec.factory, backend="cpu", checks=c, **params) for c in (False, True)}
    inputs = {c: spec.make_inputs(params, 0, "cpu") for c in (False, True)}
    for c in (False, True):
        builds[c](*inputs[c])
    for i in spec.outputs:  # the same computation, checked or not
        a, b = inputs[False][i], inputs[True][i]
        if not torch.equal(a.view(torch.uint8), b.view(torch.uint8)):
            raise AssertionError(f"{name}: output {i} differs between the checked and unchecked builds")
    wall, cpu = {False: [], True: []}, {False: [], True: []}
    for _ in range(repeat):
        for c in (False, True):
            t, p = time.perf_counter(), time.process_time()
            builds[c](*inputs[c])
            cpu[c].append((time.process_time() - p) * 1e3)
            wall[c].append((time.perf_counter() - t) * 1e3)
    med = {k: {c: statistics.median(v[c]) for c in (False, True)} for k, v in (("wall", wall), ("cpu", cpu))}
    return {"kernel": name, "checks": len(builds[True].launcher.program.checks), **{
        f"{k}_{tag}": med[k][c] for k in med for c, tag in ((False, "unchecked"), (True, "checked"))}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=15, help="timed calls of each build (interleaved)")
    p.add_argument("--problem", default="demo", help="registry problem label (default: demo)")
    p.add_argument("--kernels", default=",".join(DEFAULT), help="comma-separated registry kernel names")
    args = p.parse_args(argv)
    print(f"# checked vs unchecked, cpu backend, problem {args.problem!r}, median of {args.repeat} "
          f"interleaved calls; {cpu_model()}; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}")
    print("| kernel | checks in source | CPU ms unchecked | CPU ms checked | ratio (CPU time) | wall ms unchecked "
          "| wall ms checked | ratio (wall) |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.kernels.split(","):
        r = bench(name.strip(), args.problem, args.repeat)
        print(f"| {r['kernel']} | {r['checks']} | {r['cpu_unchecked']:.2f} | {r['cpu_checked']:.2f} | "
              f"{r['cpu_checked'] / r['cpu_unchecked']:.2f}x | {r['wall_unchecked']:.2f} | {r['wall_checked']:.2f} | "
              f"{r['wall_checked'] / r['wall_unchecked']:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
