"""Backend "cuda": render with :mod:`kernforge.backends.cuda.renderer`, compile with nvcc through
:mod:`kernforge.runtime`, launch on torch CUDA tensors through :mod:`kernforge.runtime.cuda_module`
(the one owner of driver calls; launches go to torch's current stream).

Also the hook the CLI wires, :func:`build_report` (``kernforge build``: registers, shared memory, spills,
ptxas' wgmma advisories, and with ``--report`` SASS counts and a cycle model, without a GPU), plus :func:`disassemble` (SASS through ``cuobjdump``) for the
tests that check which instructions a kernel really uses.
"""
from __future__ import annotations

import dataclasses
import functools
import glob
import os
import shutil
import subprocess
import sys
from typing import Optional, Sequence

from kernforge.backends.base import Backend, BackendError
from kernforge.backends.cuda.arch import ARCHS, DEFAULT_ARCH, arch_info
from kernforge.backends.cuda.renderer import INCLUDE_DIR, TENSOR_MAP_CTYPE, CudaProgram, CudaRenderer, render_cuda
from kernforge.backends.cuda import cluster, persistent, sass_report
from kernforge.backends.cuda.tma import TensorMapLaunch
from kernforge.codegen import ir
from kernforge.codegen.passes import checks
from kernforge.codegen.renderer import Target
from kernforge.runtime import cuda_module
from kernforge.runtime.compilers.nvcc import parse_ptxas_advisories

# Part of every cache key: bump when the device library's semantics change without its text changing
# (the headers themselves are keyed by content through the compiler's dependency list).
DEPENDENCY_SIGNATURE = "kernforge-cuda-device-library/1"

_ARG_KIND = {"int32_t": "i32", "uint32_t": "u32", "int64_t": "i64", "uint64_t": "u64", "float": "f32",
             "double": "f64"}


def compile_options(arch: str) -> tuple[str, ...]:
    return (arch_info(arch).gencode,)


def _compile(program: CudaProgram, kernel: ir.Kernel, load: bool):
    from kernforge import runtime

    # the variant is part of the artifact name: "<kernel>_sm_90a_tma" holds the TMA pipelines,
    # "..._checked" a checked-mode build
    tag = f"{kernel.artifact_name}_{program.arch}" + ("_tma" if program.tensor_maps else "") + (
        "_checked" if program.checks is not None else "")
    fn = runtime.compile if load else runtime.compile_without_load
    return fn(tag, program.source, backend="cuda", options=compile_options(program.arch),
              include_dirs=(INCLUDE_DIR,), dependency_signature=DEPENDENCY_SIGNATURE)


def _tcgen05_flops(kernel: ir.Kernel, arch: str, tma: bool, checks: bool) -> float:
    """Tensor flops of one pass over the kernel's tcgen05 gemms (``2 m n k`` each, from the layout
    plan): the cycle model's MMA time on sm_100a, where SASS does not print an UTCHMMA's shape."""
    if not arch_info(arch).tcgen05:
        return 0.0
    target = Target("cuda", arch, "" if tma else "cp.async", checks)
    plan = CudaRenderer().lower(kernel, target)[1]["layouts"]
    return float(sum(2 * g.c.buffer.static_shape()[0] * g.c.buffer.static_shape()[1] *
                     (g.a.buffer.static_shape()[0] if g.trans_a else g.a.buffer.static_shape()[1])
                     for g, kind in plan.gemm_kind.items() if kind == "tcgen05"))


def build_report(kernel: ir.Kernel, arch: Optional[str] = None, tma: bool = True, checks: bool = False,
                 report: bool = False, flops: Optional[float] = None, nbytes: Optional[float] = None) -> dict:
    """Compile without a GPU and report the cache entry, ptxas' resource usage and its wgmma
    advisories (``advisories``: C7520 / C7519 lines, empty when every wgmma runs unserialized)
    (``tma=False``: the sm_90a cp.async variant; ``checks``: the checked-mode build).
    ``report``: also the SASS instruction counts and the cycle model of
    :mod:`~kernforge.backends.cuda.sass_report` (``sass``, ``model``), for a problem of
    ``flops`` / ``nbytes`` when given; needs ``cuobjdump``."""
    program = render_cuda(kernel, arch, tma=tma, checks=checks)
    result = _compile(program, kernel, load=False)
    usage = result.resource_usage.get(program.entry)
    if usage is None:
        raise BackendError(f"nvcc reported no resource usage for {program.entry} (ptxas -v output missing)")
    out = {"path": result.binary_path, "arch": program.arch, "registers": usage.get("registers", 0),
           "shared_bytes": usage.get("shared_bytes", 0) + program.dynamic_smem,
           "spill_stores": usage.get("spill_store_bytes", 0), "spill_loads": usage.get("spill_load_bytes", 0),
           "local_bytes": usage.get("stack_bytes", 0), "advisories": _advisories(result).get(program.entry, [])}
    if report:
        kernels = {k.name: k for k in sass_report.parse(disassemble(result.binary_path))}
        if program.entry not in kernels:
            raise BackendError(f"cuobjdump listed no function {program.entry} in {result.binary_path}")
        sk = kernels[program.entry]
        operands = "fp8" if any(isinstance(p, ir.Buffer) and p.dtype.name.startswith("float8")
                                for p in kernel.params) else "bf16"
        out["sass"] = sass_report.counts(sk.instrs)
        out["model"] = sass_report.model(sk, program.arch, program.main_loop_threads, flops, nbytes, operands,
                                         utc_flops=_tcgen05_flops(kernel, program.arch, tma, checks))
    return out


def _advisories(result) -> dict:
    """ptxas' wgmma advisories of a compiled entry, per kernel: from the manifest, or (an entry
    built before the manifest recorded them) parsed again from the entry's build.log."""
    recorded = result.manifest.get("extra", {}).get("advisories")
    if recorded is not None:
        return recorded
    log = os.path.join(result.path, "build.log")
    return parse_ptxas_advisories(open(log).read()) if os.path.exists(log) else {}


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


# Without a GPU the CUDA backend still compiles and emulates; only running needs the device,
# and no package can provide one, so the message points at what works instead of an install.
NO_GPU = ("backend 'cuda' needs an NVIDIA GPU to run kernels and this machine has none "
          "(torch.cuda.is_available() is False); it can still compile them (kernforge build, "
          "kernforge.runtime.compile_without_load) and emulate them (backend 'cuda-emu')")


@functools.lru_cache(maxsize=1)
def device_arch() -> str:
    """The arch of CUDA device 0 as kernforge names it (asked once: the ops resolve their target
    arch on every call, and device 0 does not change in a process; a failure is not cached)."""
    import torch

    if not torch.cuda.is_available():
        raise BackendError(NO_GPU)
    major, minor = torch.cuda.get_device_capability(0)
    name = {8: "sm_80", 9: "sm_90a", 10: "sm_100a"}.get(major)
    if name is None:
        raise BackendError(f"compute capability {major}.{minor} is not a kernforge CUDA target ({', '.join(ARCHS)})")
    return name


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
        self._sm_count: Optional[int] = None

    @property
    def sm_count(self) -> int:
        """The CTAs of a persistent kernel's launch (``cuda.persistent``): the device's SMs."""
        if self._sm_count is None:
            import torch

            self._sm_count = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
        return self._sm_count

    @sm_count.setter
    def sm_count(self, value: int) -> None:
        self._sm_count = int(value)

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
        if self.program.checks is not None:
            self._checked_launch(values, args, dims, grid)
            return
        self._launch(values, args, dims, grid)

    def _checked_launch(self, values: list, args: Sequence, dims: Sequence[int], grid: Sequence[int]) -> None:
        """Checked mode: a zeroed violation record on the device after the symbols; reading it
        back synchronises with the stream, which is what a debugging mode may cost."""
        import torch

        device = next((a.device for p, a in zip(self.kernel.params, args) if isinstance(p, ir.Buffer)), "cuda")
        record = torch.zeros(checks.RECORD_LEN, dtype=torch.int64, device=device)
        self._launch(values + [record.data_ptr()], args, dims, grid)
        host = record.cpu().tolist()
        if host[0]:
            raise checks.violation(host, self.program.checks)

    def _launch(self, values: list, args: Sequence, dims: Sequence[int], grid: Sequence[int]) -> None:
        grid, block = tuple(int(g) for g in grid), (self.program.threads,)
        axis = self.program.cluster_axis
        launch = (persistent.launch_grid(grid, self.sm_count, self.program.cluster, axis) if self.program.persistent
                  else cluster.launch_grid(grid, self.program.cluster, axis))
        if not self.program.tensor_maps:
            self.function.launch(values, grid=launch, block=block, smem_bytes=self.program.dynamic_smem)
            self.last_variant = "cp.async"
            return
        maps = self.maps_or_fallback(self.program.tensor_maps, args, dims, grid)
        if maps is None:
            return
        encoded = [cuda_module.encode_tensor_map(rank=m.rank, elem_bytes=m.elem_bytes, address=m.address, dims=m.dims,
                                                 strides_bytes=m.strides_bytes, box=m.box, swizzle=m.swizzle)
                   for m in maps]
        self.function.launch(values, grid=launch, block=block, smem_bytes=self.program.dynamic_smem,
                             tensor_maps=encoded)
        self.last_variant = "tma"


class CudaBackend(Backend):
    renderer = CudaRenderer()
    supports_checks = True

    def target(self, arch: Optional[str] = None, launch: bool = False) -> Target:
        """``launch``: render for the GPU this process will run on (its arch unless one is named);
        otherwise the emission default, sm_90a.  A launch target with a named arch still needs
        the GPU, so a machine without one fails here, before minutes of compiling for nothing."""
        if launch and arch:
            import torch

            if not torch.cuda.is_available():
                raise BackendError(NO_GPU)
        return Target(self.name, arch or (device_arch() if launch else DEFAULT_ARCH))

    def build_report(self, kernel: ir.Kernel, arch: Optional[str] = None, report: bool = False,
                     flops: Optional[float] = None, nbytes: Optional[float] = None) -> dict:
        """``kernforge build [--report]``: compile without a GPU and report resources, wgmma
        advisories and (``report``) SASS counts with the cycle model (see :func:`build_report`)."""
        return build_report(kernel, arch, report=report, flops=flops, nbytes=nbytes)

    def build(self, kernel: ir.Kernel, target: Optional[Target] = None) -> CudaLauncher:
        """Compile the kernel; with TMA pipelines (sm_90a) the cp.async variant is compiled
        only when a launch's tensors need it (see :class:`CudaLauncher`)."""
        target = target or self.target(launch=True)
        program = self.render(kernel, target)
        module = _compile(program, kernel, load=True)
        kinds = tuple("ptr" if t.endswith("*") else _ARG_KIND[t] for _, t in program.params if t != TENSOR_MAP_CTYPE)
        fallback = ((lambda: self.build(kernel, dataclasses.replace(target, variant="cp.async")))
                    if program.tensor_maps else None)
        return CudaLauncher(kernel, program, module.get_function(program.entry, argtypes=kinds, restype="void"),
                            fallback)
