"""Backend "cuda": render with :mod:`kernforge.codegen.render.cuda`, compile with nvcc through
:mod:`kernforge.runtime`, launch with ``cuLaunchKernelEx`` on torch CUDA tensors.

Also the hooks the CLI wires: :func:`emit_source` (``kernforge emit``) and
:func:`build_report` (``kernforge build``: registers, shared memory, spills,
without a GPU), plus :func:`disassemble` (SASS through ``cuobjdump``) for the
tests that check which instructions a kernel really uses.
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from typing import Optional, Sequence

from kernforge.codegen import ir
from kernforge.codegen.render.cuda import ARCHS, INCLUDE_DIR, CudaProgram, arch_info, render_cuda
from kernforge.jit.backend import BackendError, register

# Part of every cache key: bump when the device library's semantics change without its text changing
# (the headers themselves are keyed by content through the compiler's dependency list).
DEPENDENCY_SIGNATURE = "kernforge-cuda-device-library/1"

_ARG_KIND = {"int32_t": "i32", "uint32_t": "u32", "int64_t": "i64", "uint64_t": "u64", "float": "f32",
             "double": "f64"}


def compile_options(arch: str) -> tuple[str, ...]:
    return (arch_info(arch).gencode,)


def _compile(program: CudaProgram, kernel: ir.Kernel, load: bool):
    from kernforge import runtime

    tag = f"{kernel.name}_{program.arch}"
    fn = runtime.compile if load else runtime.compile_without_load
    return fn(tag, program.source, backend="cuda", options=compile_options(program.arch),
              include_dirs=(INCLUDE_DIR,), dependency_signature=DEPENDENCY_SIGNATURE)


def emit_source(kernel: ir.Kernel, arch: Optional[str] = None) -> str:
    """The CUDA C++ source of ``kernel`` for ``arch`` (default sm_90a)."""
    return render_cuda(kernel, arch).source


def build_report(kernel: ir.Kernel, arch: Optional[str] = None) -> dict:
    """Compile without a GPU and report the cache entry and ptxas' resource usage."""
    program = render_cuda(kernel, arch)
    result = _compile(program, kernel, load=False)
    usage = result.resource_usage.get(program.entry)
    if usage is None:
        raise BackendError(f"nvcc reported no resource usage for {program.entry} (ptxas -v output missing)")
    return {"path": result.binary_path, "arch": program.arch, "registers": usage.get("registers", 0),
            "shared_bytes": usage.get("shared_bytes", 0) + program.dynamic_smem,
            "spill_stores": usage.get("spill_store_bytes", 0), "spill_loads": usage.get("spill_load_bytes", 0),
            "local_bytes": usage.get("stack_bytes", 0)}


def cuobjdump() -> str:
    """Path of ``cuobjdump`` (PATH, else the nvidia-cuda-cuobjdump wheel); it needs ``nvdisasm`` beside it."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    for site in sys.path:
        for cand in glob.glob(os.path.join(site, "nvidia", "cu*", "bin", "cuobjdump")):
            return cand
    raise BackendError("cuobjdump not found: pip install nvidia-cuda-cuobjdump==13.4.92 nvidia-cuda-nvdisasm")


def disassemble(binary_path: str) -> str:
    """SASS of a cubin/fatbin."""
    tool = cuobjdump()
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(tool) + os.pathsep + env.get("PATH", "")
    proc = subprocess.run([tool, "-sass", binary_path], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, env=env)
    if proc.returncode != 0:
        raise BackendError(f"cuobjdump -sass {binary_path} failed: {proc.stderr.strip()}")
    return proc.stdout


def sass(kernel: ir.Kernel, arch: Optional[str] = None) -> str:
    """Compile (cached) and disassemble ``kernel``."""
    program = render_cuda(kernel, arch)
    return disassemble(_compile(program, kernel, load=False).binary_path)


def device_arch() -> str:
    """The arch of CUDA device 0 as kernforge names it."""
    import torch

    if not torch.cuda.is_available():
        raise BackendError("backend 'cuda' needs an NVIDIA GPU (torch.cuda.is_available() is False)")
    major, minor = torch.cuda.get_device_capability(0)
    name = {8: "sm_80", 9: "sm_90a", 10: "sm_100a"}.get(major)
    if name is None:
        raise BackendError(f"compute capability {major}.{minor} is not a kernforge CUDA target ({', '.join(ARCHS)})")
    return name


class CudaLauncher:
    """Launches one compiled kernel: pointers and scalars by value, then the symbol values."""

    def __init__(self, kernel: ir.Kernel, program: CudaProgram, function):
        self.kernel = kernel
        self.program = program
        self.function = function

    def __call__(self, args: Sequence, dims: Sequence[int], grid: Sequence[int]) -> None:
        values = []
        for p, a in zip(self.kernel.params, args):
            if isinstance(p, ir.Buffer):
                values.append(a.data_ptr())
            else:
                values.append(int(a) if not p.dtype.is_float else float(a))
        values += [int(d) for d in dims]
        if any(g <= 0 for g in grid):
            return  # an empty grid launches nothing (cuLaunch rejects 0-sized grids)
        self.function.launch(values, grid=tuple(int(g) for g in grid), block=(self.program.threads,),
                             smem_bytes=self.program.dynamic_smem)


class CudaBackend:
    name = "cuda"
    device = "cuda"

    def source(self, kernel: ir.Kernel, arch: Optional[str] = None) -> str:
        return emit_source(kernel, arch)

    def build(self, kernel: ir.Kernel, arch: Optional[str] = None) -> CudaLauncher:
        program = render_cuda(kernel, arch or device_arch())
        module = _compile(program, kernel, load=True)
        kinds = tuple("ptr" if t.endswith("*") else _ARG_KIND[t] for _, t in program.params)
        return CudaLauncher(kernel, program, module.get_function(program.entry, argtypes=kinds, restype="void"))


register("cuda", CudaBackend)
