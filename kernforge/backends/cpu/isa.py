"""Which instruction-set path the CPU backend generates for: the target's ``arch``.

Developer machines differ (AVX2-only VMs, Zen 4 with AVX-512 and BF16, Xeons
with AMX), so the path is picked from what the compiler targets under
``-march=native`` (the resolved ``-m`` flags of the compiler probe, the same
ones the cache key holds), never from a guess.  ``KERNFORGE_CPU_ISA`` forces a
lower path, so that every path a machine can run is testable on it; asking for
a higher one than the compiler targets is an :class:`IsaError`, not a SIGILL.

The path reaches the generated source as ``#define KF_ISA <level>`` (kf/gemm.h
chooses its micro-kernels from it) and the CPU pipeline's layout pass (whether
low-precision GEMM operands are widened to float at their copy, see
``codegen/passes/gemm_layout.py``), so each path is its own source and its own
cache entry.
"""
from __future__ import annotations

import functools
import os
from typing import Optional

# the CPU backend's compile options (and the identity compiler_paths asks about): g++ contracts
# a * b + c into an FMA by default in C++ mode; kernforge's element-wise semantics round every
# operation (as numpy does), so contraction is off.  The GEMM micro-kernel asks for its FMAs
# explicitly.
COMPILE_OPTIONS = ("-ffp-contract=off",)

ENV = "KERNFORGE_CPU_ISA"

# lowest first; the level is the KF_ISA value in kf/gemm.h
PATHS = ("generic", "avx2", "avx512", "avx512bf16", "amx")
_REQUIRES = {
    "generic": (),
    "avx2": ("-mavx2", "-mfma"),
    "avx512": ("-mavx2", "-mfma", "-mavx512f"),
    "avx512bf16": ("-mavx2", "-mfma", "-mavx512f", "-mavx512bf16"),
    # AMX-BF16 tiles for bf16 x bf16 (kf::gemm_amx_bf16), the avx512bf16 kernels for the rest
    "amx": ("-mavx2", "-mfma", "-mavx512f", "-mavx512bf16", "-mamx-tile", "-mamx-bf16"),
}
# paths whose GEMM multiplies bf16 (and fp8 widened to bf16) natively: their operand
# tiles stay in the narrow type; the others widen them to float once, at the copy
NATIVE_BF16 = frozenset({"avx512bf16", "amx"})


class IsaError(ValueError):
    """An unknown CPU path, or one the compiler does not target on this machine."""


def level(path: str) -> int:
    """``KF_ISA`` for ``path``."""
    check(path)
    return PATHS.index(path)


def check(path: str) -> str:
    if path not in PATHS:
        raise IsaError(f"unknown CPU instruction-set path {path!r}; the paths are {', '.join(PATHS)}")
    return path


def supported_paths(machine_flags) -> tuple[str, ...]:
    """The paths a compiler with these resolved ``-m`` flags can build, lowest first."""
    flags = set(machine_flags)
    return tuple(p for p in PATHS if all(f in flags for f in _REQUIRES[p]))


@functools.lru_cache(maxsize=1)
def compiler_paths() -> tuple[str, ...]:
    """What this machine's C++ compiler targets under ``-march=native``; without a compiler only
    ``generic`` (sources still render; building them reports the missing toolchain)."""
    from kernforge.runtime import ToolchainNotFoundError, get_runtime

    try:
        identity = get_runtime().compiler("cpu").identity(COMPILE_OPTIONS)
    except ToolchainNotFoundError:
        return ("generic",)
    return supported_paths(identity.get("machine", ()))


def best_path() -> str:
    return compiler_paths()[-1]


def default_path(requested: Optional[str] = None) -> str:
    """``requested``, else ``$KERNFORGE_CPU_ISA``, else the best path the compiler targets;
    a path above what the compiler targets raises :class:`IsaError` naming where it came from."""
    source = "arch" if requested else ENV
    path = requested or os.environ.get(ENV) or best_path()
    check(path)
    available = compiler_paths()
    if path not in available:
        raise IsaError(f"{source}={path!r}: the C++ compiler does not target it on this machine "
                       f"(it targets {', '.join(available)}); choose a lower path")
    return path
