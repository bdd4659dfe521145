"""Run a library kernel on one backend: build, verify against its torch reference, time.

Shared by ``kernforge run``, ``kernforge demo``, the tests and the benchmarks so
that every tool checks kernels the same way (random non-zero inputs, poisoned
outputs, the spec's own tolerance).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Optional

import kernforge
from kernforge import backends
from kernforge.kernels.registry import KernelSpec


@dataclass
class RunResult:
    kernel: str
    backend: str
    problem: str
    verified: bool
    build_s: float
    median_ms: Optional[float]
    error: str = ""
    label: str = "verified"  # the backend's own wording, e.g. "CUDA semantics verified on host emulation"

    def row(self) -> list[str]:
        status = self.label if self.verified else f"FAILED: {self.error}"
        t = f"{self.median_ms:.3f}" if self.median_ms is not None else "-"
        return [self.kernel, self.backend, self.problem, status, f"{self.build_s:.2f}", t]


def run_spec(spec: KernelSpec, backend: str, problem: str = "demo", repeat: int = 5,
             seed: int = 0, arch: Optional[str] = None) -> RunResult:
    """Build ``spec`` for ``backend`` at ``problem`` size, check it, and time ``repeat`` runs."""
    prob = spec.problems[problem]
    t0 = time.perf_counter()
    try:
        kernel = kernforge.compile(spec.factory, backend=backend, arch=arch, **prob.params)
    except Exception as e:  # reported in the table, never swallowed: the row says FAILED
        return RunResult(spec.name, backend, problem, False, time.perf_counter() - t0, None,
                         f"build: {type(e).__name__}: {e}")
    build_s = time.perf_counter() - t0
    device = backends.device(backend)  # the torch device type the backend's buffers live on
    inputs = spec.make_inputs(prob.params, seed, device)
    try:
        kernel(*inputs)
        expected = spec.reference(inputs, prob.params)
        spec.check([inputs[i] for i in spec.outputs], expected, inputs, prob.params)
    except AssertionError as e:
        return RunResult(spec.name, backend, problem, False, build_s, None, f"mismatch: {e}")
    except Exception as e:
        return RunResult(spec.name, backend, problem, False, build_s, None,
                         f"run: {type(e).__name__}: {e}")
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        kernel(*inputs)
        if device == "cuda":
            import torch

            torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    return RunResult(spec.name, backend, problem, True, build_s,
                     statistics.median(times) if times else None,
                     label=getattr(kernel.backend, "verified_label", "verified"))


def format_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = lambda r: "  ".join(str(x).ljust(w) for x, w in zip(r, widths))  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])
