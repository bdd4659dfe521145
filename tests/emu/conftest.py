"""Helpers for the host-emulation tests: build hand-written CUDA kernels with the
cuda-emu toolchain (several per module: each compile costs seconds) and call
them with numpy arrays."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from kernforge.backends.cuda_emu.backend import EmulatedModule, HostParam, emu_source


@dataclass(frozen=True)
class CudaTestKernel:
    """``src`` defines ``extern "C" __global__ void <name>(...)``; ``params`` are (C type, kind)."""

    name: str
    src: str
    params: list
    threads: int
    grid_rank: int = 1


def build_emu_module(tag: str, kernels: list[CudaTestKernel], *, dynamic_smem: int = 0, arch: str = "sm_90a",
                     timeout_ms: int = 20_000) -> dict:
    """One emulation module holding every kernel; returns name -> EmulatedKernel."""
    parts = [emu_source(k.src, name=k.name, entry=k.name, params=[HostParam(c, kind) for c, kind in k.params],
                        threads=k.threads, grid_rank=k.grid_rank) for k in kernels]
    module = EmulatedModule(tag, "\n".join(parts), dynamic_smem=dynamic_smem, arch=arch)
    return {k.name: module.kernel(k.name, timeout_ms) for k in kernels}


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
