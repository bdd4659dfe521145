"""Who measured a tuning result: the device and the compiler, as strings for the database key.

A configuration that is fastest on one CPU (or GPU), built by one compiler, need not be
fastest on another, so both are part of every key.  Both are computed once per process:
the compiler identity runs the toolchain (``g++ --version``), which must not happen on an
op's hot path.
"""
from __future__ import annotations

import functools
import platform

from kernforge import backends

# the ISA extensions the CPU backend's generated code (through the compiler's -march=native)
# can exploit; listed in the key in this order
_ISA = ("avx2", "avx512f", "avx512bf16", "amx_tile", "amx_bf16", "asimd", "sve")


@functools.lru_cache(maxsize=None)
def cpu_name() -> str:
    """``model name`` from /proc/cpuinfo plus the ISA flags present (``... [avx2 avx512f]``)."""
    model, flags = "", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and not model:
                    model = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    model = model or platform.processor() or platform.machine() or "unknown cpu"
    isa = [f for f in _ISA if f in flags]
    return f"{model} [{' '.join(isa)}]" if isa else model


@functools.lru_cache(maxsize=None)
def device(backend: str) -> str:
    """The device ``backend`` runs on: the GPU's name and SM for CUDA, the host CPU otherwise
    (the interpreter and the CUDA emulator run on the host too)."""
    if backends.device(backend) == "cuda":
        import torch

        major, minor = torch.cuda.get_device_capability()
        return f"{torch.cuda.get_device_name()} sm_{major}{minor}"
    return cpu_name()


@functools.lru_cache(maxsize=None)
def compiler(backend: str) -> str:
    """The first line of the toolchain's ``--version`` (the runtime's own compiler identity:
    ``KERNFORGE_JIT_CXX``/``KERNFORGE_JIT_NVCC`` are honoured), or ``none`` for the interpreter."""
    if backends.lang(backend) == "ir":
        return "none"
    from kernforge.runtime.compilers import make_compiler
    from kernforge.runtime.config import Config

    toolchain = "cuda" if backends.device(backend) == "cuda" else "cpu"
    ident = make_compiler(toolchain, Config.from_env()).identity(())
    text = ident.get("version") or ident.get("driver_version") or ident.get("name") or "unknown"
    return str(text).splitlines()[0].strip()
