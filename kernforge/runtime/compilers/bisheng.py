"""bisheng (CANN's clang-based compiler) -> object file, for the Ascend backend.

Found through ``KERNFORGE_JIT_BISHENG``, else ``$ASCEND_HOME_PATH``'s
``compiler/ccec_compiler/bin/bisheng`` (or ``bin/bisheng``), else ``PATH``.
It takes gcc-style ``-MD -MF`` so the include closure comes from the compiler
itself, as for the other backends.  The target (e.g. ``--cce-aicore-arch=...``)
is passed by the caller in ``options`` and is part of the key.
"""

from __future__ import annotations

import os
import threading

from ..config import ascend_home
from .base import CompileOutput, Compiler, check_ran, find_executable, read_depfile, run_tool
from .cpu import parse_probe

DEFAULT_OPTIONS = ("-O2", "-std=c++17", "-fPIC", "-c")

# The NPU targets kernforge renders for, by kernforge's arch name: CANN >= 9 (asc-devkit) spells
# them --npu-arch=..., older CANN --cce-aicore-arch=... (spec section 8).
NPU_ARCH = {"dav-c220": "dav-2201", "dav-3510": "dav-3510"}
LEGACY_ARCH = {"dav-c220": "dav-c220", "dav-3510": "dav-c310"}


def arch_options(arch: str, legacy: bool = False) -> tuple[str, ...]:
    """The options that make ``kernel.cpp`` an Ascend C device compile for ``arch``: the source
    language (``-xasc``; ``-xcce`` for the legacy driver) and the target.  AIV-only kernels
    target the vector core (``-vec``) in the legacy spelling, which names the core type."""
    if arch not in NPU_ARCH:
        raise ValueError(f"bisheng: unknown arch {arch!r}; known: {', '.join(NPU_ARCH)}")
    if legacy:
        return ("-xcce", f"--cce-aicore-arch={LEGACY_ARCH[arch]}-vec", "--cce-aicore-only")
    return ("-xasc", f"--npu-arch={NPU_ARCH[arch]}")


class BishengCompiler(Compiler):
    backend = "ascend"
    source_name = "kernel.cpp"

    def __init__(self, configured: str | None):
        home = ascend_home()
        if configured is None and home is not None:
            for relative in ("compiler/ccec_compiler/bin/bisheng", "bin/bisheng"):
                candidate = os.path.join(home, relative)
                if os.access(candidate, os.X_OK):
                    configured = candidate
                    break
        self._binary = find_executable(configured, "KERNFORGE_JIT_BISHENG", ("bisheng",), "Ascend compiler")
        self._lock = threading.Lock()
        self._probe_result: dict | None = None

    @property
    def binary(self) -> str:
        return self._binary

    def _probe(self) -> dict:
        with self._lock:
            if self._probe_result is None:
                argv = [self._binary, "-E", "-v", "-x", "c++", os.devnull, "-o", os.devnull]
                probe = parse_probe(check_ran(run_tool(argv), argv))
                argv = [self._binary, "--version"]
                probe["full_version"] = check_ran(run_tool(argv), argv).strip()
                self._probe_result = probe
            return self._probe_result

    def identity(self, options) -> dict:
        probe = self._probe()
        return {"kind": "bisheng", "name": os.path.basename(os.path.realpath(self._binary)),
                "version": probe["full_version"], "target": probe["target"]}

    def effective_options(self, options, num_include_dirs) -> list[str]:
        return list(DEFAULT_OPTIONS) + list(options) + [f"-I<inc{i}>" for i in range(num_include_dirs)]

    def system_dirs(self, options) -> tuple[str, ...]:
        return tuple(self._probe()["search"])

    def compile(self, build_dir, options, include_dirs) -> CompileOutput:
        argv = [self._binary, *DEFAULT_OPTIONS, *options]
        argv += [f"-I{os.path.abspath(d)}" for d in include_dirs]
        argv += ["-MD", "-MF", "kernel.d", "-o", "kernel.o", self.source_name]
        log = check_ran(run_tool(argv, cwd=build_dir), argv)
        deps = read_depfile(os.path.join(build_dir, "kernel.d"), argv)
        os.unlink(os.path.join(build_dir, "kernel.d"))
        return CompileOutput(command=argv, log=log, deps=deps, binary="kernel.o")
