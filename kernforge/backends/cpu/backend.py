"""Backend "cpu": render with :class:`CpuRenderer`, compile through kernforge.runtime, launch via ctypes.

The launch ABI is ``extern "C" int kf_<name>(void** args, const int64_t* dims)``:
``args[i]`` points at parameter ``i`` (a buffer's data, or a scalar's value in
the scalar's dtype) and ``dims`` holds ``kernel.symbols``.  The generated
function evaluates the grid itself from ``dims`` and the scalars, runs the
blocks under OpenMP and returns 0 or an error code, which the launcher turns
into :class:`CpuKernelError`.  A checked build (``Target.checks``) takes one more
``args`` entry, the launch's violation record (``passes.checks.RECORD_LEN`` int64s,
zeroed per call), and returns ``ERR_CHECK`` when a check failed; the launcher raises
:class:`kernforge.CheckError` from the record.
"""
from __future__ import annotations

import ctypes
from typing import Callable, Optional, Sequence

import numpy as np

from kernforge import runtime
from kernforge.backends.base import Backend
from kernforge.backends.cpu import isa, threads
from kernforge.backends.cpu import renderer as cpu
from kernforge.codegen import ir
from kernforge.codegen.passes import checks
from kernforge.codegen.renderer import Program, Target
from kernforge.dtypes import is_torch, torch_dtype


class CpuKernelError(RuntimeError):
    """A compiled CPU kernel returned a nonzero status."""

    MESSAGES = {
        cpu.ERR_GRID: "a grid dimension evaluated to a negative value or one above 2**31 - 1",
        cpu.ERR_ALLOC: "a worker thread could not allocate its on-chip buffer arena",
    }

    def __init__(self, kernel: str, code: int):
        self.code = code
        super().__init__(f"CPU kernel {kernel} failed with status {code}: "
                         f"{self.MESSAGES.get(code, 'unknown error code')}")


def _dependency_signature() -> str:
    """The renderer's own version of its ABI, so a cache entry never outlives a change to it."""
    return "kernforge-cpu-abi-1"


class CpuLauncher:
    """Calls one compiled kernel: packs buffers and scalars into ``void*[]`` and checks the status.

    Buffers may be numpy arrays or CPU torch tensors; a tensor's pointer is read directly
    (``takes_torch``), which saves building a numpy view per argument per call."""

    takes_torch = True

    def __init__(self, kernel: ir.Kernel, function, program: Program):
        self.kernel = kernel
        self.program = program
        self.cfunc = function.cfunc
        self.cfunc.argtypes = (ctypes.c_void_p, ctypes.c_void_p)
        self.cfunc.restype = ctypes.c_int
        self.params = kernel.params
        self.n_symbols = len(kernel.symbols)
        self.checks = program.checks

    def __call__(self, args: Sequence, dims: Sequence[int], grid: Optional[Sequence[int]] = None) -> None:
        if len(args) != len(self.params):
            raise TypeError(f"{self.kernel.name} takes {len(self.params)} arguments, got {len(args)}")
        if len(dims) != self.n_symbols:
            raise TypeError(f"{self.kernel.name} needs {self.n_symbols} symbol values, got {len(dims)}")
        keep = []  # scalar boxes must stay alive for the call
        record = None if self.checks is None else np.zeros(checks.RECORD_LEN, dtype=np.int64)
        pointers = (ctypes.c_void_p * max(1, len(args) + (record is not None)))()
        for i, (p, a) in enumerate(zip(self.params, args)):
            if isinstance(p, ir.Buffer):
                pointers[i] = self._buffer_pointer(p, a)
            else:
                box = self._scalar_box(p, a)
                keep.append(box)
                pointers[i] = box.ctypes.data
        if record is not None:
            pointers[len(args)] = record.ctypes.data
        sym = np.array([int(d) for d in dims] or [0], dtype=np.int64)
        status = self.cfunc(ctypes.cast(pointers, ctypes.c_void_p), sym.ctypes.data)
        if status == cpu.ERR_CHECK and record is not None:
            raise checks.violation(record, self.checks)
        if status != 0:
            raise CpuKernelError(self.kernel.name, status)

    def bind(self, dims: Sequence[int], scalars: dict) -> Optional[Callable[[Sequence], None]]:
        """A launch with ``dims`` and the scalar arguments (``{param index: value}``) fixed once:
        the returned ``run(args)`` reads only the buffers' pointers (``args[i].data_ptr()``,
        CPU torch tensors), so a repeated call skips re-checking and re-boxing what did not
        change.  Why: at decode a kernel call is a few microseconds of work, and rebuilding the
        scalar boxes and symbol array per call cost more than that.  For callers that have
        already checked every argument against the kernel (``CompiledKernel``'s memoised plan:
        dtypes, shapes, strides, device); the values here are checked as ``__call__`` checks
        them.  Checked builds (a fresh violation record per call) get None: use ``__call__``."""
        if self.checks is not None:
            return None
        if len(dims) != self.n_symbols:
            raise TypeError(f"{self.kernel.name} needs {self.n_symbols} symbol values, got {len(dims)}")
        template: list = [None] * len(self.params)
        keep = []  # the boxes and the symbol array live as long as the bound launch
        for i, p in enumerate(self.params):
            if not isinstance(p, ir.Buffer):
                box = self._scalar_box(p, scalars[i])
                keep.append(box)
                template[i] = box.ctypes.data
        buffers = [i for i, p in enumerate(self.params) if isinstance(p, ir.Buffer)]
        sym = np.array([int(d) for d in dims] or [0], dtype=np.int64)
        keep.append(sym)
        array, cfunc, sym_ptr, name = ctypes.c_void_p * max(1, len(template)), self.cfunc, sym.ctypes.data, \
            self.kernel.name

        def run(args: Sequence, keep=keep) -> None:
            values = template.copy()
            for i in buffers:
                values[i] = args[i].data_ptr()
            status = cfunc(array(*values), sym_ptr)
            if status != 0:
                raise CpuKernelError(name, status)

        return run

    def _buffer_pointer(self, p: ir.Buffer, a) -> int:
        if is_torch(a):
            if a.device.type != "cpu" or torch_dtype(a.dtype) != p.dtype:
                raise TypeError(f"{self.kernel.name}: parameter {p.name} is {p.dtype} on the CPU, got a "
                                f"{a.dtype} tensor on {a.device}")
            return a.data_ptr()
        if not isinstance(a, np.ndarray):
            raise TypeError(f"{self.kernel.name}: parameter {p.name} needs a numpy array or a CPU torch "
                            f"tensor, got {type(a).__name__}")
        if a.dtype.itemsize != p.dtype.itemsize or a.dtype != p.dtype.np_dtype:
            raise TypeError(f"{self.kernel.name}: parameter {p.name} is {p.dtype}, got an array of {a.dtype}")
        return a.ctypes.data

    def _scalar_box(self, p: ir.Var, a) -> np.ndarray:
        is_bool = isinstance(a, (bool, np.bool_))
        ok = is_bool if p.dtype.is_bool else (not is_bool and isinstance(a, (int, np.integer) if p.dtype.is_int
                                                                  else (int, float, np.integer, np.floating)))
        if not ok:
            raise TypeError(f"{self.kernel.name}: scalar {p.name} is {p.dtype}, got {a!r}")
        try:
            return np.array([a], dtype=p.dtype.np_dtype)
        except OverflowError as e:
            raise ValueError(f"{self.kernel.name}: scalar {p.name}={a!r} does not fit {p.dtype}") from e


class CpuBackend(Backend):
    renderer = cpu.CpuRenderer()
    include_dir = cpu.INCLUDE_DIR
    options = isa.COMPILE_OPTIONS

    supports_checks = True

    def workers(self) -> int:
        return threads.num_threads()

    def target(self, arch: Optional[str] = None, launch: bool = False) -> Target:
        """``arch`` is the instruction-set path (``isa.PATHS``); None: ``$KERNFORGE_CPU_ISA``, else the
        best one the compiler targets.  Any path renders (``kernforge emit --arch avx512bf16`` on an
        AVX2 machine); for a launch (``launch=True``, and every build) a path the compiler does not
        target is an ``IsaError`` here, before anything is compiled."""
        if arch is not None and not launch:
            return Target(self.name, isa.check(arch))
        return Target(self.name, isa.default_path(arch))

    def build(self, kernel: ir.Kernel, target: Optional[Target] = None) -> CpuLauncher:
        target = target or self.target(launch=True)
        if target.arch is not None:
            isa.default_path(target.arch)  # building a path the compiler does not target: IsaError
        program = self.render(kernel, target)
        tag = f"{self.name}_{kernel.artifact_name}" + ("_checked" if target.checks else "")
        module = runtime.compile(tag, program.source, backend="cpu",
                                 options=self.options, include_dirs=(self.include_dir,),
                                 dependency_signature=_dependency_signature())
        return CpuLauncher(kernel, module.get_function(program.entry), program)
