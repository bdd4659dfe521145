"""Resource fit: whether a built configuration fits the GPU it was compiled for.

A configuration that compiles and even verifies can still be one the tuner must not
keep: ptxas capped its registers at the ``__launch_bounds__`` budget and spilled the rest
to local memory, or its shared memory exceeds what one block may opt into.  Such a
point is slow for a reason timing would only hide in noise (or, for shared memory,
fails to launch), so the sweep rejects it with the reason, read from the same ptxas
report ``kernforge build`` prints (:func:`kernforge.backends.cuda.backend.build_report`:
registers, static + dynamic shared memory, spill stores / loads).

Only the ``cuda`` backend has anything to fit; the CPU backends, the interpreter and
``cuda-emu`` get None.  ``misfit(kernel, "cuda", arch=...)`` on a kernel built for
another backend checks its IR against a real nvcc compile for ``arch`` (no GPU needed;
nvcc must be installed), so a ``cuda-emu`` sweep can be screened the same way.
"""
from __future__ import annotations

import re
from typing import Optional

from kernforge.codegen import ir

# Per-block limits that hold on every kernforge CUDA target (sm_80, sm_90a, sm_100a):
# a 64K-entry register file, allocated per warp in units of 256 registers.
REGISTER_FILE = 65536
_WARP_ALLOC_UNIT = 256
_SMEM_OVERFLOW = re.compile(r"needs (\d+) bytes of shared memory; (\S+) allows (\d+) per block")


def misfit(kernel, backend: str, arch: Optional[str] = None) -> Optional[str]:
    """Why ``kernel`` does not fit ``backend``'s device, as ``"fit: ..."``, or None when it
    fits or the backend has nothing to fit.

    ``kernel``: a :class:`kernforge.CompiledKernel` (its IR, arch, TMA variant and checked
    mode are used; for ``cuda`` this is a JIT-cache hit, not a second compile), a PrimFunc
    or an ``ir.Kernel``; a runnable of several (``launches``, as
    :class:`kernforge.kernels.mla_decode.split_kv.SplitKV`): the first of them that does
    not fit.  ``arch``: the CUDA arch to check against (default: the compiled
    kernel's, else sm_90a)."""
    if not isinstance(backend, str):
        raise TypeError(f"misfit: backend must be a backend name, got {type(backend).__name__}")
    if backend != "cuda":
        return None
    launches = getattr(kernel, "launches", None)
    if launches is not None:  # one configuration run as several kernels (the split-KV decode)
        return next(filter(None, (misfit(k, backend, arch) for k in launches)), None)
    kir, tma, checks = _unpack(kernel)
    if arch is None and getattr(kernel, "backend_name", None) == "cuda":
        arch = kernel.target.arch
    return cuda_misfit(kir, arch, tma=tma, checks=checks)


def cuda_misfit(kernel: ir.Kernel, arch: Optional[str] = None, tma: bool = True,
                checks: bool = False) -> Optional[str]:
    """The CUDA check: compile ``kernel`` for ``arch`` (cached; no GPU) and read ptxas' report."""
    from kernforge.backends.cuda.backend import build_report
    from kernforge.backends.cuda.arch import CudaRenderError, arch_info

    try:
        report = build_report(kernel, arch, tma=tma, checks=checks)
    except CudaRenderError as e:  # the renderer refuses a tile set larger than the opt-in limit
        found = _SMEM_OVERFLOW.search(str(e))
        if found is None:
            raise
        need, name, limit = int(found.group(1)), found.group(2), int(found.group(3))
        return _smem_reason(need, limit, name)
    return reason(report, arch_info(report["arch"]).max_smem, int(kernel.threads))


def reason(report: dict, max_smem: int, threads: int) -> Optional[str]:
    """The misfit in one ``build_report`` dict (``registers``, ``shared_bytes``,
    ``spill_stores``, ``spill_loads``, ``arch``) for a block of ``threads``, or None."""
    arch = report.get("arch", "?")
    if report["shared_bytes"] > max_smem:
        return _smem_reason(report["shared_bytes"], max_smem, arch)
    parts = []
    warps = -(-threads // 32)
    per_warp = -(-report["registers"] * 32 // _WARP_ALLOC_UNIT) * _WARP_ALLOC_UNIT
    if per_warp * warps > REGISTER_FILE:
        parts.append(f"{report['registers']} registers x {threads} threads need {per_warp * warps} "
                     f"> {REGISTER_FILE} in the register file on {arch}")
    if report["spill_stores"] or report["spill_loads"]:
        parts.append(f"{report['registers']} registers and {report['spill_stores']} bytes spill stores, "
                     f"{report['spill_loads']} bytes spill loads on {arch}")
    return "fit: " + "; ".join(parts) if parts else None


def _smem_reason(need: int, limit: int, arch: str) -> str:
    return f"fit: shared memory {need / 1024:.1f} KB > {limit / 1024:.0f} KB on {arch}"


def _unpack(kernel) -> tuple[ir.Kernel, bool, bool]:
    """(IR, TMA variant, checked mode) of a compiled kernel, PrimFunc or IR."""
    if isinstance(kernel, ir.Kernel):
        return kernel, True, False
    target = getattr(kernel, "target", None)
    kir = getattr(kernel, "ir", None)
    if not isinstance(kir, ir.Kernel):
        raise TypeError(f"misfit: kernel must be a CompiledKernel, PrimFunc or ir.Kernel, "
                        f"got {type(kernel).__name__}")
    if target is not None and target.backend == "cuda":
        return kir, target.variant != "cp.async", bool(target.checks)
    return kir, True, False
