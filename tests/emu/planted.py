"""Planting bugs in a library kernel's generated CUDA and running every mutant in one emulated
module (one compile): the harness the release-ring and tcgen05 tests share.

A mutant must either stop the emulated run with an `EmulationError` (carrying the expected
text, when one is given) or disagree with the interpreter; the unmutated copy, built in the
same module, must agree, so a harness fault cannot pass for a caught bug."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

import kernforge
from kernforge.backends.cuda.renderer import render_cuda
from kernforge.backends.cuda_emu.backend import CudaEmuBackend, EmulatedModule, EmulationError

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


def plant(spec, params: dict, arch: str, bugs: Bugs, name: str, timeout_ms: int) -> Planted:
    """One module holding the clean source (tag "clean") and every mutation (tagged by bug)."""
    ir = spec.factory(**params).ir
    clean = CudaEmuBackend().source(ir, arch)
    parts = [renamed(clean, "clean", ir.name)]
    for bug, (mutate, _) in bugs.items():
        mutated = mutate(clean)
        assert mutated != clean, f"planting {bug} changed nothing: the generated code moved"
        parts.append(renamed(mutated, bug, ir.name))
    module = EmulatedModule(name, "\n".join(parts), dynamic_smem=render_cuda(ir, arch).dynamic_smem, arch=arch)
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
