"""NVRTC (through cuda-bindings) -> cubin, in process; opt-in with
``KERNFORGE_JIT_USE_NVRTC=1``.

NVRTC writes no dependency file, so the exact set of headers it read is not
available.  To stay sound the closure is a superset: every regular file under
every include directory, by content.  NVRTC is run with
``--no-source-include`` and without ``-I``/``-include`` in ``options``, so the
only files it can read are those, its own bundled headers (keyed through its
version and library), and absolute-path includes, which are refused up
front.  Use the nvcc compiler (the default) when include dirs are large.
"""

from __future__ import annotations

import os
import re
import threading

from ..errors import CompileError, ConfigError, ToolchainNotFoundError
from .base import CompileOutput, Compiler
from .nvcc import parse_ptxas_report

DEFAULT_OPTIONS = ("-std=c++17", "--no-source-include", "-Xptxas", "-v")
_FORBIDDEN = ("-I", "--include-path", "-include", "--pre-include")
_ABSOLUTE_INCLUDE = re.compile(rb'^\s*#\s*include\s*[<"]/', re.MULTILINE)


def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError as exc:
        raise ToolchainNotFoundError(
            "toolchain not found: KERNFORGE_JIT_USE_NVRTC needs cuda-bindings and nvidia-cuda-nvrtc"
        ) from exc
    return nvrtc


def _loaded_library(fragment: str) -> str:
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if fragment in os.path.basename(path):
                return path
    return ""


class NvrtcCompiler(Compiler):
    backend = "cuda"
    source_name = "kernel.cu"

    def __init__(self):
        nvrtc = _nvrtc()
        err, major, minor = nvrtc.nvrtcVersion()
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise ToolchainNotFoundError(f"toolchain not found: nvrtcVersion failed ({err})")
        self._version = f"{major}.{minor}"
        library = _loaded_library("libnvrtc.so") or _loaded_library("libnvrtc")
        self._library = library
        self._library_id = f"{os.path.basename(library)}:{os.path.getsize(library)}" if library else "unknown"
        self._lock = threading.Lock()

    @property
    def binary(self) -> str:
        return self._library or "libnvrtc"

    def _full_options(self, options) -> list[str]:
        for option in options:
            if option.split("=")[0] in _FORBIDDEN or option.startswith(("-I", "-include")):
                raise ConfigError(f"the NVRTC compiler takes include directories only via include_dirs, not {option!r}")
        if not any(o.startswith(("-arch", "--gpu-architecture")) for o in options):
            raise ConfigError("the cuda backend needs a target architecture option, e.g. options=('-arch=sm_90a',)")
        return list(DEFAULT_OPTIONS) + list(options)

    def identity(self, options) -> dict:
        return {"kind": "nvrtc", "version": self._version, "library": self._library_id}

    def effective_options(self, options, num_include_dirs) -> list[str]:
        return self._full_options(options) + [f"-I<inc{i}>" for i in range(num_include_dirs)]

    def system_dirs(self, options) -> tuple[str, ...]:
        return ()

    def compile(self, build_dir, options, include_dirs) -> CompileOutput:
        nvrtc = _nvrtc()
        full = self._full_options(options) + [f"-I{os.path.abspath(d)}" for d in include_dirs]
        with open(os.path.join(build_dir, self.source_name), "rb") as f:
            source = f.read()
        deps = _files_under(include_dirs)
        for path in [os.path.join(build_dir, self.source_name)] + deps:
            with open(path, "rb") as f:
                if _ABSOLUTE_INCLUDE.search(f.read()):
                    raise ConfigError(f"{path} includes a header by absolute path, which NVRTC cannot track; "
                                      "use the nvcc compiler (unset KERNFORGE_JIT_USE_NVRTC)")
        err, program = nvrtc.nvrtcCreateProgram(source, self.source_name.encode(), 0, [], [])
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise CompileError(f"nvrtcCreateProgram failed: {err}")
        try:
            encoded = [o.encode() for o in full]
            (result,) = nvrtc.nvrtcCompileProgram(program, len(encoded), encoded)
            _, size = nvrtc.nvrtcGetProgramLogSize(program)
            log_buffer = b" " * size
            nvrtc.nvrtcGetProgramLog(program, log_buffer)
            log = log_buffer.rstrip(b"\0 ").decode(errors="replace")
            if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
                raise CompileError(f"command failed with exit code {int(result)}: nvrtc {' '.join(full)}\n{log}")
            _, size = nvrtc.nvrtcGetCUBINSize(program)
            cubin = b" " * size
            nvrtc.nvrtcGetCUBIN(program, cubin)
        finally:
            nvrtc.nvrtcDestroyProgram(program)
        with open(os.path.join(build_dir, "kernel.cubin"), "wb") as f:
            f.write(cubin)
        return CompileOutput(command=["nvrtc", *full], log=log, deps=deps, binary="kernel.cubin",
                             extra={"resource_usage": parse_ptxas_report(log)})


def _files_under(include_dirs) -> list[str]:
    """Every file NVRTC could reach through the include dirs, first dir winning."""
    files, seen = [], set()
    for directory in include_dirs:
        for dirpath, dirnames, filenames in os.walk(directory):
            dirnames.sort()
            for name in sorted(filenames):
                full = os.path.join(dirpath, name)
                relative = os.path.relpath(full, directory)
                if relative not in seen:  # a later dir's copy is shadowed, never read
                    seen.add(relative)
                    files.append(full)
    return files
