"""Backend "cuda-emu": the CUDA backend's generated source, run on the host.

Why it exists: most machines that build kernforge have no GPU, yet the CUDA
code path (fragment layouts of mma.sync/wgmma, ldmatrix, cp.async pipelines,
TMA + mbarrier, warp shuffles, barriers) is where the subtle bugs live.  This
backend compiles the *unchanged* output of :func:`kernforge.backends.cuda.renderer.render_cuda`
with g++ under ``-DKF_HOST_EMULATION``: the device library then includes its
host implementations from ``backends/cuda_emu/templates/include/kf/emu/`` and the force-
included ``kf/emu/cuda_emu.h`` maps the CUDA language onto host threads.
Results are "CUDA semantics verified on host emulation", never "GPU verified";
see ``docs/backends/cuda-emu.md`` for what emulation cannot catch.

Launch ABI of the generated host entry (``backends/cuda_emu/templates/emu_launch.cpp.j2``)::

    extern "C" int kf_emu_<name>(void** args, const int64_t* dims, const int64_t* grid)

``args[i]`` points at kernel parameter i (buffers: their data; scalars: one
value of the scalar's dtype), ``dims`` holds ``kernel.symbols`` in order and
``grid`` the launch grid.  A TMA kernel (sm_90a pipelines) takes one more
``args`` entry per tensor map after the kernel parameters: an int64 vector
(:meth:`cuda_tma.TensorMapArgs.packed`) that the entry encodes with
``kf_emu::encode_tensor_map``, the arguments the GPU launcher gives
``cuTensorMapEncodeTiled``.  A checked build (``Target.checks``) takes its violation
record (``passes.checks.RECORD_LEN`` int64s) as the ``args`` entry before the tensor
maps, as the GPU kernel takes it as the parameter before them.  A nonzero return
carries ``kf_emu_last_error()``.
"""
from __future__ import annotations

import ctypes
import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from kernforge.backends.base import Backend
from kernforge.backends.cuda.renderer import INCLUDE_DIR as CUDA_INCLUDE_DIR
from kernforge.backends.cuda.arch import arch_info
from kernforge.backends.cuda.renderer import CudaProgram, CudaRenderer
from kernforge.backends.cuda import cluster, persistent
from kernforge.backends.cuda.tma import TensorMapLaunch
from kernforge.backends.templates import environment as template_environment
from kernforge.codegen import ir
from kernforge.codegen.passes import checks
from kernforge.codegen.renderer import CRenderer, Target

TEMPLATES = Path(__file__).resolve().parent / "templates"
# the emulator's headers (kf/emu/*) layered beside the CUDA device library they implement
INCLUDE_DIRS = (str(CUDA_INCLUDE_DIR), str(TEMPLATES / "include"))
SHIM_DIR = TEMPLATES / "include" / "kf" / "emu" / "sys"  # stands in for the CUDA toolkit's headers
DEFAULT_ARCH = "sm_90a"  # as kernforge.backends.cuda.renderer: the wgmma path; pass arch="sm_80" for mma.sync
# Barrier/mbarrier waits longer than this abort the launch as a deadlock.
DEFAULT_TIMEOUT_MS = 20_000

# -O0: emulated kernels are small and built often; compile time dominates (the
# emulated run is bound by thread hand-offs at barriers, not by arithmetic).
BASE_OPTIONS = ("-O0", "-std=c++17", "-pthread", "-fno-strict-aliasing", "-DKF_HOST_EMULATION",
                "-include", "kf/emu/cuda_emu.h", "-Wno-attributes", "-Wno-unused-result")

_ENV = template_environment(TEMPLATES, keep_trailing_newline=True)


class EmulationError(RuntimeError):
    """The emulated launch failed: a deadlock, a bad shared-memory access, a trap."""


def arch_number(arch: str) -> int:
    """``sm_90a`` -> 900 (the value of ``__CUDA_ARCH__`` on that target)."""
    m = re.fullmatch(r"sm_(\d+)(a?)", arch)
    if not m:
        raise ValueError(f"cuda-emu: arch must look like 'sm_80' or 'sm_90a', got {arch!r}")
    return int(m.group(1)) * 10


@dataclass(frozen=True)
class HostParam:
    """How the host entry passes one kernel parameter: ``kind`` is buffer, scalar, symbol, check
    (checked mode's violation record) or tensormap."""

    ctype: str
    kind: str


def call_args(params: Sequence[HostParam]) -> str:
    """The C argument list that unpacks ``args``/``dims`` into by-value parameters."""
    out, arg, dim = [], 0, 0
    maps = 0
    for p in params:
        if p.kind in ("buffer", "check"):
            out.append(f"static_cast<{p.ctype}>(args[{arg}])")
            arg += 1
        elif p.kind == "scalar":
            out.append(f"*static_cast<{p.ctype}*>(args[{arg}])")
            arg += 1
        elif p.kind == "symbol":
            out.append(f"static_cast<{p.ctype}>(dims[{dim}])")
            dim += 1
        elif p.kind == "tensormap":
            out.append(f"kf_tmaps[{maps}]")
            maps += 1
        else:
            raise ValueError(f"unknown parameter kind {p.kind!r}")
    return ", ".join(out)


def emu_source(kernel_source: str, *, name: str, entry: str, params: Sequence[HostParam], threads: int,
               grid_rank: int, cluster: int = 1, cluster_axis: int = 0) -> str:
    """The kernel's CUDA source followed by its generated host entry (``cluster``: CTAs per
    cluster along launch axis ``cluster_axis``, 0 x or 1 y, run together; the build must then size
    the arena for the whole cluster, :func:`cluster_smem_bytes`)."""
    from_args = [p for p in params if p.kind != "symbol"]  # in args[] order
    maps = [i for i, p in enumerate(from_args) if p.kind == "tensormap"]
    wrapper = _ENV.get_template("emu_launch.cpp.j2").render(
        name=name, entry=entry, threads=threads, grid_rank=grid_rank, call_args=call_args(params), tmap_args=maps,
        cluster=int(cluster), cluster_axis=int(cluster_axis))
    return kernel_source.rstrip() + "\n\n" + wrapper


def cluster_smem_bytes(dynamic_smem: int, cluster: int) -> int:
    """The emulated shared arena of a cluster launch: one 1024-byte-aligned slice of
    ``dynamic_smem`` per CTA (kf/emu/cluster.h cuts it back into slices)."""
    if cluster <= 1:
        return int(dynamic_smem)
    return int(cluster) * max(1024, -(-int(dynamic_smem) // 1024) * 1024)


def build_options(dynamic_smem: int, arch: str) -> tuple[str, ...]:
    """g++ options of an emulation build: the force-included CUDA emulation, the
    toolkit shims, the target's __CUDA_ARCH__ and the size of the dynamic arena."""
    return BASE_OPTIONS + (f"-D__CUDA_ARCH__={arch_number(arch)}",
                           f"-DKF_EMU_DYNAMIC_SMEM_BYTES={max(16, -(-int(dynamic_smem) // 16) * 16)}",
                           f"-I{SHIM_DIR}")


class EmulatedModule:
    """One compiled emulation module; it may hold several kernels' host entries."""

    def __init__(self, tag: str, source: str, *, dynamic_smem: int = 0, arch: str = DEFAULT_ARCH):
        from kernforge import runtime

        self.source = source
        tag = re.sub(r"[^A-Za-z0-9_]", "_", tag)
        self.module = runtime.compile(tag, source, backend="cpu", options=build_options(dynamic_smem, arch),
                                      include_dirs=INCLUDE_DIRS)
        lib = ctypes.CDLL(self.module.binary_path, mode=ctypes.RTLD_LOCAL)  # same handle the runtime holds
        self._last_error = lib.kf_emu_last_error
        self._last_error.restype = ctypes.c_char_p
        self._set_timeout = lib.kf_emu_set_timeout_ms
        self._set_timeout.argtypes = (ctypes.c_longlong,)

    def kernel(self, name: str, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> "EmulatedKernel":
        return EmulatedKernel(self, name, timeout_ms)


class EmulatedKernel:
    """The host entry ``kf_emu_<name>`` of an :class:`EmulatedModule`, called with host arrays."""

    def __init__(self, module: EmulatedModule, name: str, timeout_ms: int = DEFAULT_TIMEOUT_MS):
        self.module = module
        self.name = name
        self.timeout_ms = timeout_ms
        self._entry = module.module.get_function(f"kf_emu_{name}").cfunc
        self._entry.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
        self._entry.restype = ctypes.c_int

    def __call__(self, args: Sequence[np.ndarray], dims: Sequence[int], grid: Sequence[int]) -> None:
        """``args``: numpy arrays (buffers) and 0-d numpy arrays (scalars, already in their dtype),
        then the packed tensor maps of a TMA kernel."""
        if not 1 <= len(grid) <= 3:
            raise ValueError(f"cuda-emu: grid must have 1 to 3 extents, got {tuple(grid)}")
        pointers = (ctypes.c_void_p * max(1, len(args)))(*[a.ctypes.data for a in args])
        dims_arr = np.ascontiguousarray(np.asarray(list(dims) or [0], dtype=np.int64))
        grid_arr = np.ascontiguousarray(np.asarray(list(grid), dtype=np.int64))
        self.module._set_timeout(int(self.timeout_ms))
        status = self._entry(pointers, dims_arr.ctypes.data, grid_arr.ctypes.data)
        if status != 0:
            raise EmulationError(f"cuda-emu kernel {self.name}: {self.module._last_error().decode(errors='replace')}")


def host_params(kernel: ir.Kernel, program) -> list[HostParam]:
    """Classify the rendered kernel's parameters (kernel params, then symbols)."""
    n = len(kernel.params)
    maps = len(program.tensor_maps)
    record = int(any(name == "kf_check" for name, _ in program.params))  # author names never start kf_
    if len(program.params) != n + len(kernel.symbols) + record + maps:
        raise ValueError(f"cuda-emu: rendered kernel has {len(program.params)} parameters, expected "
                         f"{n} + {len(kernel.symbols)} symbols + {record} record + {maps} tensor maps")
    out = []
    for i, (_, ctype) in enumerate(program.params):
        if record and i == n + len(kernel.symbols):
            out.append(HostParam(ctype, "check"))
        elif i >= n + len(kernel.symbols):
            out.append(HostParam(ctype, "tensormap"))
        elif i >= n:
            out.append(HostParam(ctype, "symbol"))
        elif isinstance(kernel.params[i], ir.Buffer):
            out.append(HostParam(ctype, "buffer"))
        else:
            out.append(HostParam(ctype, "scalar"))
    return out


# numpy storage of a scalar parameter by the C type the renderer gave it (narrow
# scalars travel widened, e.g. bf16 as float, int16 as int32: the kernel converts).
_SCALAR_NP = {"int32_t": np.int32, "uint32_t": np.uint32, "int64_t": np.int64, "uint64_t": np.uint64,
              "float": np.float32, "double": np.float64, "int8_t": np.int8, "uint8_t": np.uint8,
              "int16_t": np.int16, "uint16_t": np.uint16, "bool": np.bool_}


class EmuLauncher(TensorMapLaunch):
    """The Launcher contract (kernforge.backends) over an :class:`EmulatedKernel`.

    A TMA kernel (``tensor_maps``) gets its tensor maps encoded from the actual arrays on
    every call; when an array breaks TMA's rules (``cuda_tma.encode_args`` says why) the
    call runs the cp.async variant from ``fallback()`` instead, built on first need, and
    ``last_variant`` records which variant ran, as the GPU launcher does."""

    def __init__(self, kernel: ir.Kernel, emulated: EmulatedKernel, params: Sequence[HostParam],
                 program: CudaProgram, fallback: Optional[Callable[[], "EmuLauncher"]] = None):
        self.kernel = kernel
        self.emulated = emulated
        self.program = program
        self.tensor_maps = tuple(program.tensor_maps)
        self._fallback = fallback
        self._fallback_launcher: Optional[EmuLauncher] = None
        self.last_variant = ""
        self.last_fallback_reason = ""
        # a persistent kernel's CTAs (cuda.persistent): the arch's default device, or what a test sets
        self.sm_count = persistent.DEFAULT_SM_COUNT.get(program.arch, 132)
        self.last_grid: tuple = ()
        self.scalar_np = {}
        for p, hp in zip(kernel.params, params):
            if not isinstance(p, ir.Buffer):
                np_type = _SCALAR_NP.get(hp.ctype)
                if np_type is None and hp.ctype == CRenderer.type_map.get(p.dtype):
                    np_type = p.dtype.np_dtype  # passed in its own type (kf_bf16, kf_half, ...)
                if np_type is None:
                    raise ValueError(f"cuda-emu: no host storage for scalar {p.name} of C type {hp.ctype}")
                self.scalar_np[p.name] = np_type

    def __call__(self, args: Sequence, dims: Sequence[int], grid: Sequence[int]) -> None:
        packed = []
        for p, a in zip(self.kernel.params, args):
            packed.append(a if isinstance(p, ir.Buffer) else np.array(a, dtype=self.scalar_np[p.name]))
        maps = self.maps_or_fallback(self.tensor_maps, args, dims, grid)
        if maps is None:
            return
        record = [] if self.program.checks is None else [np.zeros(checks.RECORD_LEN, dtype=np.int64)]
        if self.program.persistent:
            grid = persistent.launch_grid(grid, self.sm_count, self.program.cluster, self.program.cluster_axis)
        else:  # whole clusters (cuda.cluster)
            grid = cluster.launch_grid(grid, self.program.cluster, self.program.cluster_axis)
        self.last_grid = tuple(grid)
        self.emulated(packed + record + [m.packed() for m in maps], dims, grid)
        self.last_variant = "tma" if maps else "cp.async"
        if record and record[0][0]:
            raise checks.violation(record[0], self.program.checks)


class EmuRenderer(CudaRenderer):
    """The CUDA renderer's pipeline and output, unchanged, followed by the generated host entry."""

    name = "cuda-emu"

    def emit_program(self, kernel: ir.Kernel, facts: dict, target: Target) -> CudaProgram:
        program = super().emit_program(kernel, facts, target)
        source = emu_source(program.source, name=kernel.name, entry=program.entry,
                            params=host_params(kernel, program), threads=program.threads,
                            grid_rank=1 if program.persistent else len(kernel.grid), cluster=program.cluster,
                            # a persistent launch is 1-D: its clusters span x whichever blocks they pair
                            cluster_axis=0 if program.persistent else program.cluster_axis)
        return dataclasses.replace(program, source=source)


class CudaEmuBackend(Backend):
    renderer = EmuRenderer()
    # How tools must label a passing check on this backend: never "GPU verified".
    verified_label = "CUDA semantics verified on host emulation"
    speed_path = False
    supports_checks = True

    def build(self, kernel: ir.Kernel, target: Optional[Target] = None) -> EmuLauncher:
        """Build the kernel; on sm_90a with TMA pipelines, the cp.async variant is built
        only when a launch needs it (module tag ``..._cpasync``)."""
        target = target or self.target()
        program = self.render(kernel, target)
        tag = f"emu_{kernel.artifact_name}_{program.arch}" + (
            "_cpasync" if target.variant == "cp.async" and arch_info(program.arch).tma else "") + (
            "_checked" if target.checks else "")
        module = EmulatedModule(tag, program.source, dynamic_smem=cluster_smem_bytes(program.dynamic_smem, program.cluster),
                                arch=program.arch)
        fallback = ((lambda: self.build(kernel, dataclasses.replace(target, variant="cp.async")))
                    if program.tensor_maps else None)
        return EmuLauncher(kernel, module.kernel(kernel.name), host_params(kernel, program), program,
                           fallback)
