"""Backend "cuda": render with :mod:`kernforge.codegen.render.cuda`, compile with nvcc through
:mod:`kernforge.runtime`, launch with ``cuLaunchKernelEx`` on torch CUDA tensors.

Also the hooks the CLI wires: :func:`emit_source` (``kernforge emit``) and
:func:`build_report` (``kernforge build``: registers, shared memory, spills,
without a GPU), plus :func:`disassemble` (SASS through ``cuobjdump``) for the
tests that check which instructions a kernel really uses.
"""
from __future__ import annotations

import ctypes
import glob
import os
import shutil
import subprocess
import sys
from typing import Optional, Sequence

from kernforge.codegen import ir
from kernforge.codegen.render.cuda import (ARCHS, INCLUDE_DIR, TENSOR_MAP_CTYPE, CudaProgram, arch_info,
                                           render_cuda)
from kernforge.codegen.render.cuda_tma import TensorMapArgs, TensorMapLaunch
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

    # the variant is part of the artifact name: "<kernel>_sm_90a_tma" holds the TMA pipelines
    tag = f"{kernel.name}_{program.arch}" + ("_tma" if program.tensor_maps else "")
    fn = runtime.compile if load else runtime.compile_without_load
    return fn(tag, program.source, backend="cuda", options=compile_options(program.arch),
              include_dirs=(INCLUDE_DIR,), dependency_signature=DEPENDENCY_SIGNATURE)


def emit_source(kernel: ir.Kernel, arch: Optional[str] = None) -> str:
    """The CUDA C++ source of ``kernel`` for ``arch`` (default sm_90a)."""
    return render_cuda(kernel, arch).source


def build_report(kernel: ir.Kernel, arch: Optional[str] = None, tma: bool = True) -> dict:
    """Compile without a GPU and report the cache entry and ptxas' resource usage
    (``tma=False``: the sm_90a cp.async variant)."""
    program = render_cuda(kernel, arch, tma=tma)
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


_DATA_TYPE = {1: "CU_TENSOR_MAP_DATA_TYPE_UINT8", 2: "CU_TENSOR_MAP_DATA_TYPE_UINT16",
              4: "CU_TENSOR_MAP_DATA_TYPE_UINT32", 8: "CU_TENSOR_MAP_DATA_TYPE_UINT64"}


def _driver():
    """cuda-bindings' driver module, imported on first use (rendering and compiling need no GPU)."""
    from cuda.bindings import driver

    return driver


def _ok(result, what: str):
    """The values of a cuda-bindings result tuple; BackendError on a failure code."""
    driver = _driver()
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise BackendError(f"{what} failed: {err}")
    return values[0] if len(values) == 1 else values


def encode_tensor_map(args: TensorMapArgs):
    """``cuTensorMapEncodeTiled`` for one map: tiles, no interleave, no swizzle, out-of-bounds
    elements read as zero (``FLOAT_OOB_FILL_NONE``); the data type only sets the element size
    (the copy moves bits)."""
    d = _driver()
    u64, u32 = d.cuuint64_t, d.cuuint32_t  # cuda-bindings takes its own integer wrappers in these lists
    return _ok(d.cuTensorMapEncodeTiled(
        getattr(d.CUtensorMapDataType, _DATA_TYPE[args.elem_bytes]), args.rank, args.address,
        [u64(x) for x in args.dims], [u64(x) for x in args.strides_bytes], [u32(x) for x in args.box],
        [u32(1)] * args.rank,
        d.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, d.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE,
        d.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        d.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE), "cuTensorMapEncodeTiled")


def launch_with_tensor_maps(function, values: Sequence, tensor_maps: Sequence, *, grid, block, smem_bytes: int):
    """``cuLaunchKernelEx`` with 128-byte ``CUtensorMap`` parameters after the plain ones
    (the runtime's ``CudaFunction.launch`` passes only pointers and scalars)."""
    from kernforge.runtime.args import convert

    d = _driver()
    plain = convert(function.argtypes, tuple(values), "cuda", function.name)
    if smem_bytes > 48 * 1024:
        _ok(d.cuFuncSetAttribute(function.handle,
                                 d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem_bytes),
            "cuFuncSetAttribute")
    config = d.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = (tuple(grid) + (1, 1))[:3]
    config.blockDimX, config.blockDimY, config.blockDimZ = (tuple(block) + (1, 1))[:3]
    config.sharedMemBytes = smem_bytes
    config.hStream = d.CUstream(0)
    addresses = [ctypes.addressof(v) for v in plain] + [int(t.getPtr()) for t in tensor_maps]
    pointers = (ctypes.c_void_p * len(addresses))(*addresses)
    _ok(d.cuLaunchKernelEx(config, function.handle, ctypes.addressof(pointers), 0), f"launch {function.name}")


class CudaLauncher(TensorMapLaunch):
    """Launches one compiled kernel: pointers and scalars by value, then the symbol values,
    then (TMA variant) the tensor maps encoded from this call's tensors.

    When a tensor breaks TMA's rules (``cuda_tma.encode_args`` gives the reason: a data
    address or row stride not a multiple of 16 bytes, a non-unit inner stride) the call runs
    the cp.async variant from ``fallback()`` (rendered with ``tma=False``, compiled on first
    need); ``last_variant`` / ``last_fallback_reason`` say what ran and why."""

    def __init__(self, kernel: ir.Kernel, program: CudaProgram, function, fallback=None):
        self.kernel = kernel
        self.program = program
        self.function = function
        self._fallback = fallback
        self._fallback_launcher: Optional[CudaLauncher] = None
        self.last_variant = ""
        self.last_fallback_reason = ""

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
        grid, block = tuple(int(g) for g in grid), (self.program.threads,)
        if not self.program.tensor_maps:
            self.function.launch(values, grid=grid, block=block, smem_bytes=self.program.dynamic_smem)
            self.last_variant = "cp.async"
            return
        maps = self.maps_or_fallback(self.program.tensor_maps, args, dims, grid)
        if maps is None:
            return
        launch_with_tensor_maps(self.function, values, [encode_tensor_map(m) for m in maps], grid=grid, block=block,
                                smem_bytes=self.program.dynamic_smem)
        self.last_variant = "tma"


class CudaBackend:
    name = "cuda"
    device = "cuda"

    def source(self, kernel: ir.Kernel, arch: Optional[str] = None) -> str:
        return emit_source(kernel, arch)

    def build(self, kernel: ir.Kernel, arch: Optional[str] = None, tma: bool = True) -> CudaLauncher:
        """Compile the kernel; with TMA pipelines (sm_90a) the cp.async variant is compiled
        only when a launch's tensors need it (see :class:`CudaLauncher`)."""
        arch = arch or device_arch()
        program = render_cuda(kernel, arch, tma=tma)
        module = _compile(program, kernel, load=True)
        kinds = tuple("ptr" if t.endswith("*") else _ARG_KIND[t] for _, t in program.params if t != TENSOR_MAP_CTYPE)
        fallback = (lambda: self.build(kernel, arch, tma=False)) if program.tensor_maps else None
        return CudaLauncher(kernel, program, module.get_function(program.entry, argtypes=kinds, restype="void"),
                            fallback)


register("cuda", CudaBackend)
