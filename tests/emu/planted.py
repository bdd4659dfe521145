"""Planting bugs in a library kernel's generated CUDA and running every mutant in one emulated
module (one compile): the harness the release-ring and tcgen05 tests share.

A mutant must either stop the emulated run with an `EmulationError` (carrying the expected
text, when one is given) or disagree with the interpreter; the unmutated copy, built in the
same module, must agree, so a harness fault cannot pass for a caught bug."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import re

import numpy as np

import kernforge
from kernforge.backends.cuda.renderer import render_cuda
from kernforge.backends.cuda_emu.backend import CudaEmuBackend, EmulatedModule, EmulationError, cluster_smem_bytes

# bug name -> (mutation of the generated source, text the emulator's error must contain; None: a
# wrong result or any emulation error)
Bugs = dict[str, tuple[Callable[[str], str], Optional[str]]]


@dataclass
class Planted:
    spec: object
    params: dict
    module: EmulatedModule
    emu: object  # the cuda-emu kernel whose launcher is pointed at a mutant
    ref: object  # the interpreter's kernel
    timeout_ms: int


def renamed(src: str, tag: str, kernel: str) -> str:
    """One copy of ``kernel``'s generated source with symbols of its own (tagged ``tag``), so that
    several copies (clean and mutants) share one emulated module."""
    return src.replace(f"kf_emu_{kernel}(", f"kf_emu_{tag}(").replace(f"kf_{kernel}(", f"kf_{kernel}_{tag}(")


def mutants(clean: str, bugs: dict[str, Callable[[str], str]]) -> dict[str, str]:
    """Each bug's mutation of ``clean``, by bug name; a mutation that changes nothing means the
    generated code moved under the test, which must fail rather than pass for a caught bug."""
    out = {}
    for bug, mutate in bugs.items():
        out[bug] = mutate(clean)
        assert out[bug] != clean, f"planting {bug} changed nothing: the generated code moved"
    return out


def copies_module(name: str, kernel: str, copies: dict[str, str], arch: str, dynamic_smem: int) -> EmulatedModule:
    """One emulated module (one compile) holding every source of ``copies`` (copies of
    ``kernel``'s generated source: clean, mutated, perturbed) under its tag."""
    return EmulatedModule(name, "\n".join(renamed(src, tag, kernel) for tag, src in copies.items()),
                          dynamic_smem=dynamic_smem, arch=arch)


def plant(spec, params: dict, arch: str, bugs: Bugs, name: str, timeout_ms: int) -> Planted:
    """One module holding the clean source (tag "clean") and every mutation (tagged by bug)."""
    ir = spec.factory(**params).ir
    clean = CudaEmuBackend().source(ir, arch)
    copies = {"clean": clean, **mutants(clean, {bug: mutate for bug, (mutate, _) in bugs.items()})}
    module = copies_module(name, ir.name, copies, arch, render_cuda(ir, arch).dynamic_smem)
    emu = kernforge.compile(spec.factory, backend="cuda-emu", arch=arch, **params)
    ref = kernforge.compile(spec.factory, backend="interp", **params)
    return Planted(spec, params, module, emu, ref, timeout_ms)


def run(p: Planted, tag: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """(emulated, interpreter) output pairs of the copy tagged ``tag`` on the same inputs."""
    p.emu.launcher.emulated = p.module.kernel(tag, timeout_ms=p.timeout_ms)
    inputs = p.spec.make_inputs(p.params, 0, "cpu")
    oracle = [t.clone() if hasattr(t, "clone") else t for t in inputs]
    p.emu(*inputs)
    p.ref(*oracle)
    return [(inputs[i].float().numpy(), oracle[i].float().numpy()) for i in p.spec.outputs]


def agree(pairs) -> bool:
    return all(np.allclose(g, w, rtol=2.0 ** -7, atol=1e-3) for g, w in pairs)


def assert_caught(p: Planted, bug: str, bugs: Bugs) -> None:
    message = bugs[bug][1]
    try:
        pairs = run(p, bug)
    except EmulationError as e:
        assert message is None or message in str(e), str(e)
        return
    assert message is None, f"planted bug {bug} ran to completion"
    assert not agree(pairs), f"planted bug {bug} went unnoticed"


# ---------------------------------------------------------------- 2-CTA cluster GEMMs (TMA multicast)

# A cluster GEMM's protocol bugs are races, so each runs under the one schedule that decides its
# race (a schedule that exposes one bug hides another): "consumer_late": CTA 0's consumers read
# each stage 50 ms late, so a refill released by CTA 1 alone overwrites it first; "producer_late":
# CTA 1's producer issues 50 ms late, so a full barrier that does not wait for the peer's half
# completes before it lands.  50 ms dwarfs thread-scheduling jitter on a loaded host (equal 3 ms
# delays on both sides let a bug through about one run in four).
CLUSTER_SCHEDULES = {
    "consumer_late": (re.compile(r"(\n(\s*)kf::mbarrier_wait_parity\(kf_bars0 \+ kf_j\d+ % 2, [^\n]*\n)"),
                      r"\1\2if (kf_cta_rank == 0) usleep(50000);\n"),
    "producer_late": (re.compile(r"(\n(\s*))(kf::mbarrier_arrive_expect_tx\()"),
                      r"\1if (kf_cta_rank == 1) usleep(50000);\2\3"),
}


def cluster_perturbed(src: str, schedule: str) -> str:
    """``src`` under one of :data:`CLUSTER_SCHEDULES` (host emulation only: ``usleep``)."""
    pattern, repl = CLUSTER_SCHEDULES[schedule]
    out, n = pattern.subn(repl, "#include <unistd.h>\n" + src)
    assert n == 1, f"perturbation {pattern.pattern!r} matched {n} times: the generated code moved"
    return out


def cluster_planted(name: str, ir, arch: str, bugs: dict[str, tuple[str, Callable[[str], str]]]) -> EmulatedModule:
    """One module with the clean cluster GEMM under every schedule (tags ``clean_<schedule>``) and
    each bug (``bugs``: name -> (schedule, mutation)) under its own schedule."""
    source = CudaEmuBackend().source(ir, arch)
    copies = {f"clean_{sched}": cluster_perturbed(source, sched) for sched in CLUSTER_SCHEDULES}
    for bug, (sched, mutate) in bugs.items():
        copies.update(mutants(copies[f"clean_{sched}"], {bug: mutate}))
    return copies_module(name, ir.name, copies, arch, cluster_smem_bytes(render_cuda(ir, arch).dynamic_smem, 2))
