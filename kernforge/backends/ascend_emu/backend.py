"""Backend "ascend-emu": the Ascend backend's generated source, run on the CPU shim.

Why it exists: no NPU and no bisheng exist where kernforge is built, yet the Ascend C path
(UB plans, DataCopyPad parameters, pipe flags, queue protocols) is where the bugs live.  This
backend compiles the *unchanged* output of :class:`kernforge.backends.ascend.renderer.AscendRenderer`
with g++ against ``backends/ascend_emu/include`` (``kernel_operator.h``: the public Ascend C
signatures of the subset, each call checking the hardware's rules) and runs every block as a
host thread.  A rule violation raises :class:`AscendEmuError` naming the rule.  Results are
"verified on the Ascend C CPU shim", never "NPU verified"; docs/backends/ascend.md says what
the shim cannot catch.

Launch ABI of the generated host entry (``templates/emu_launch.cpp.j2``)::

    extern "C" int kf_ascend_emu_<name>(void** args, const int64_t* dims, const int64_t* sizes,
                                         int64_t num_blocks)

``args[i]`` points at kernel parameter i (buffers: their data; scalars: one value of the
scalar's C type), ``dims`` holds ``kernel.symbols``, ``sizes[i]`` buffer i's byte extent (what
the shim bounds-checks GM accesses against).  A nonzero return carries
``kf_ascend_emu_last_error()``: ``rule \\x1f message``.
"""
from __future__ import annotations

import ctypes
import dataclasses
import re
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from kernforge.backends.ascend.renderer import INCLUDE_DIR as ASCEND_INCLUDE_DIR
from kernforge.backends.ascend.renderer import MAX_BLOCKS, AscendProgram, AscendRenderer, arch_info, unsupported
from kernforge.backends.base import Backend
from kernforge.backends.templates import environment as template_environment
from kernforge.codegen import ir
from kernforge.codegen.renderer import Target
from kernforge.dtypes import is_torch, torch_dtype

HERE = Path(__file__).resolve().parent
SHIM_INCLUDE_DIR = str(HERE / "include")
INCLUDE_DIRS = (ASCEND_INCLUDE_DIR, SHIM_INCLUDE_DIR)
# -O0: emulated kernels are built often and the generated kernel is one large function (the
# TopK bitonic network: 1000 lines) that g++ -O1 takes 3x longer to compile than the shim runs it
BASE_OPTIONS = ("-O0", "-std=c++17", "-pthread", "-fno-strict-aliasing", "-Wno-attributes")

_ENV = template_environment(HERE / "templates", trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)


class AscendEmuError(RuntimeError):
    """The shim stopped a launch: ``rule`` names the hardware rule that was broken
    ("DataCopy 32-byte rule", "missing SetFlag/WaitFlag", "UB capacity", "queue: DeQue on an
    empty queue", "GM out of bounds", ...)."""

    def __init__(self, kernel: str, rule: str, message: str):
        self.kernel, self.rule = kernel, rule
        super().__init__(f"ascend-emu kernel {kernel}: {message}")


def build_options(npu_arch: int) -> tuple[str, ...]:
    return BASE_OPTIONS + (f"-D__NPU_ARCH__={npu_arch}",)


def call_args(params: Sequence[tuple[str, str, str]]) -> str:
    """The C argument list that unpacks ``args``/``dims`` into the kernel's parameters."""
    out, arg, dim = [], 0, 0
    for _, ctype, kind in params:
        if kind == "gm":
            out.append(f"static_cast<GM_ADDR>(args[{arg}])")
            arg += 1
        elif kind == "workspace":
            out.append("kf_workspace.data()")
        elif kind == "scalar":
            out.append(f"*static_cast<{ctype}*>(args[{arg}])")
            arg += 1
        else:
            out.append(f"static_cast<int64_t>(dims[{dim}])")
            dim += 1
    return ", ".join(out)


def emu_source(program: AscendProgram, kernel: ir.Kernel) -> str:
    """The kernel's Ascend C source, unchanged, followed by its generated host entry."""
    gm = [(i, p.name) for i, p in enumerate(kernel.params) if isinstance(p, ir.Buffer)]
    entry = _ENV.get_template("emu_launch.cpp.j2").render(name=kernel.name, entry=program.entry, gm=gm,
                                                          call_args=call_args(program.params),
                                                          group_bytes=program.workspace_group_bytes)
    return program.source.rstrip() + "\n" + entry


def raise_from_status(kernel: str, message: str) -> None:
    rule, _, text = message.partition("\x1f")
    raise AscendEmuError(kernel, rule, text or rule)


class ShimModule:
    """A compiled translation unit against the shim: the generated kernel plus its host entry."""

    def __init__(self, tag: str, source: str, npu_arch: int, include_dirs: Sequence[str] = INCLUDE_DIRS):
        from kernforge import runtime

        self.source = source
        self.module = runtime.compile(re.sub(r"[^A-Za-z0-9_]", "_", tag), source, backend="cpu",
                                      options=build_options(npu_arch), include_dirs=tuple(include_dirs))
        lib = ctypes.CDLL(self.module.binary_path, mode=ctypes.RTLD_LOCAL)
        self.last_error = lib.kf_ascend_emu_last_error
        self.last_error.restype = ctypes.c_char_p

    def entry(self, name: str):
        f = self.module.get_function(f"kf_ascend_emu_{name}").cfunc
        f.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong)
        f.restype = ctypes.c_int
        return f


_SCALAR_NP = {"int32_t": np.int32, "uint32_t": np.uint32, "int64_t": np.int64, "uint64_t": np.uint64,
              "float": np.float32, "double": np.float64, "int8_t": np.int8, "uint8_t": np.uint8,
              "int16_t": np.int16, "uint16_t": np.uint16, "bool": np.bool_}


def _extent_bytes(shape, strides, itemsize: int) -> int:
    """Bytes from a buffer's first element to the end of its last (0 when empty)."""
    if any(int(n) == 0 for n in shape):
        return 0
    return (sum((int(n) - 1) * int(s) for n, s in zip(shape, strides)) + 1) * itemsize


class EmuLauncher:
    """The Launcher contract (kernforge.backends) over one shim entry."""

    takes_torch = True

    def __init__(self, kernel: ir.Kernel, module: ShimModule, program: AscendProgram):
        self.kernel = kernel
        self.module = module
        self.program = program
        self._entry = module.entry(kernel.name)
        self.scalar_np = {}
        scalars = [(n, t) for n, t, kind in program.params if kind == "scalar"]
        for p, (_, ctype) in zip([p for p in kernel.params if not isinstance(p, ir.Buffer)], scalars):
            np_type = _SCALAR_NP.get(ctype)
            if np_type is None:
                raise ValueError(f"ascend-emu: no host storage for scalar {p.name} of C type {ctype}")
            self.scalar_np[p.name] = np_type

    def __call__(self, args: Sequence, dims: Sequence[int], grid: Sequence[int]) -> None:
        keep, pointers, sizes = [], [], []
        for p, a in zip(self.kernel.params, args):
            if isinstance(p, ir.Buffer):
                if is_torch(a):
                    if a.device.type != "cpu" or torch_dtype(a.dtype) != p.dtype:
                        raise TypeError(f"{self.kernel.name}: parameter {p.name} is {p.dtype} on the CPU, got a "
                                        f"{a.dtype} tensor on {a.device}")
                    pointers.append(a.data_ptr())
                    sizes.append(_extent_bytes(a.shape, a.stride(), a.element_size()))
                else:
                    a = np.asarray(a)
                    pointers.append(a.ctypes.data)
                    sizes.append(_extent_bytes(a.shape, [s // a.itemsize for s in a.strides], a.itemsize))
            else:
                box = np.array([a], dtype=self.scalar_np[p.name])
                keep.append(box)
                pointers.append(box.ctypes.data)
                sizes.append(0)
        total = 1
        for g in grid:
            total *= int(g)
        if total == 0:
            return
        ptr_arr = (ctypes.c_void_p * max(1, len(pointers)))(*pointers)
        dims_arr = np.ascontiguousarray(np.asarray([int(d) for d in dims] or [0], dtype=np.int64))
        size_arr = np.ascontiguousarray(np.asarray(sizes or [0], dtype=np.int64))
        status = self._entry(ptr_arr, dims_arr.ctypes.data, size_arr.ctypes.data, min(total, MAX_BLOCKS))
        if status != 0:
            raise_from_status(self.kernel.name, self.module.last_error().decode(errors="replace"))


class AscendEmuRenderer(AscendRenderer):
    """The Ascend renderer's pipeline and output, unchanged, followed by the generated host entry."""

    name = "ascend-emu"

    def emit_program(self, kernel: ir.Kernel, facts: dict, target: Target) -> AscendProgram:
        program = super().emit_program(kernel, facts, target)
        return dataclasses.replace(program, source=emu_source(program, kernel))


class AscendEmuBackend(Backend):
    renderer = AscendEmuRenderer()
    verified_label = "verified on the Ascend C CPU shim"
    speed_path = False

    def target(self, arch: Optional[str] = None, launch: bool = False) -> Target:
        return Target(self.name, arch_info(arch).name)

    @staticmethod
    def unsupported(kernel: ir.Kernel) -> Optional[str]:
        return unsupported(kernel)

    def build(self, kernel: ir.Kernel, target: Optional[Target] = None) -> EmuLauncher:
        target = target or self.target()
        program = self.render(kernel, target)
        module = ShimModule(f"ascend_emu_{kernel.artifact_name}_{program.arch}", program.source, program.npu_arch)
        return EmuLauncher(kernel, module, program)

