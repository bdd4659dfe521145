"""Shared test configuration: temporary JIT cache, backend discovery, hypothesis profile."""
from __future__ import annotations

import os
import shutil

import pytest
from hypothesis import settings

# CI runs a fixed (derandomized) set of examples so that a landing never depends on the
# draw; local runs explore new examples each time.
settings.register_profile("kernforge", deadline=None, max_examples=20,
                          derandomize=bool(os.environ.get("CI")), print_blob=True)
settings.load_profile("kernforge")


@pytest.fixture(scope="session", autouse=True)
def _session_cache_dir(tmp_path_factory):
    """All tests share one throwaway JIT cache, never the user's."""
    if "KERNFORGE_CACHE_DIR" not in os.environ or os.environ.get("CI"):
        os.environ["KERNFORGE_CACHE_DIR"] = str(tmp_path_factory.mktemp("kf_cache"))
    yield


def host_backends() -> list[str]:
    """Backends that run on this machine's CPU (interp always; cpu/cuda-emu when built)."""
    from kernforge.jit import backend as backends

    out = []
    for name in ("interp", "cpu", "cuda-emu"):
        try:
            backends.get(name)
        except backends.BackendError:
            continue
        if name in ("cpu", "cuda-emu") and shutil.which("g++") is None:
            continue
        out.append(name)
    return out
