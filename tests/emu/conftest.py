"""Helpers for the host-emulation tests: build a hand-written CUDA kernel with
the cuda-emu toolchain and call it with numpy arrays."""
from __future__ import annotations

import numpy as np
import pytest

from kernforge.codegen.render.cuda_emu_backend import EmulatedKernel, HostParam, emu_source


def build_emu(src: str, params: list[tuple[str, str]], *, threads: int, name: str, grid_rank: int = 1,
              dynamic_smem: int = 0, timeout_ms: int = 20_000, arch: str = "sm_80") -> EmulatedKernel:
    """``params``: (C type, kind) per parameter of ``extern "C" __global__ void k(...)``."""
    hp = [HostParam(ctype, kind) for ctype, kind in params]
    source = emu_source(src, name=name, entry="k", params=hp, threads=threads, grid_rank=grid_rank)
    return EmulatedKernel(name, source, dynamic_smem=dynamic_smem, timeout_ms=timeout_ms, arch=arch)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
