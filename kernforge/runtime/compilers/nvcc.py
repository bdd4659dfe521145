"""nvcc -> cubin (default) or fatbin (``-fatbin`` in options), for the CUDA backend.

Identity: the full ``nvcc --version`` text plus the host C++ compiler's
``--version`` (nvcc preprocesses with it).  System headers are anchored at the
toolkit root (``TOP`` from ``nvcc --dryrun``) and at the host compiler's
search directories, so two toolkit installs of one version share entries.

``-Xptxas -v`` is always on: its report (registers, shared memory, stack,
spills per kernel) is parsed into the manifest at build time, which is how
``kernforge build`` reports resources without a GPU or ``cuobjdump``; so are ptxas'
wgmma performance advisories (C7519 / C7520: a serialized wgmma), per kernel.
"""

from __future__ import annotations

import os
import re
import shutil
import threading

from ..config import cuda_home
from ..errors import ConfigError, ToolchainNotFoundError
from .base import CompileOutput, Compiler, check_ran, find_executable, read_depfile, run_tool
from .cpu import parse_probe

DEFAULT_OPTIONS = ("-O3", "-std=c++17", "--expt-relaxed-constexpr", "-Xptxas", "-v")
_ARCH_FLAGS = ("-arch", "--gpu-architecture", "-gencode", "--generate-code")
_HOST_FLAGS = ("-ccbin", "--compiler-bindir")


def parse_ptxas_report(log: str) -> dict:
    """Per-kernel resources from ``ptxas -v``: registers, smem, stack, spills."""
    usage: dict[str, dict] = {}
    current = None
    lines = log.splitlines()
    for i, line in enumerate(lines):
        match = re.search(r"Compiling entry function '([^']+)' for '([^']+)'", line)
        if match:
            current = usage.setdefault(match.group(1), {"arch": match.group(2)})
            continue
        match = re.search(r"Function properties for (\S+)", line)
        if match and match.group(1) in usage and i + 1 < len(lines):
            props = lines[i + 1]
            entry = usage[match.group(1)]
            for field, pattern in (("stack_bytes", r"(\d+) bytes stack frame"),
                                   ("spill_store_bytes", r"(\d+) bytes spill stores"),
                                   ("spill_load_bytes", r"(\d+) bytes spill loads")):
                found = re.search(pattern, props)
                if found:
                    entry[field] = int(found.group(1))
            continue
        match = re.search(r"Used (\d+) registers", line)
        if match and current is not None:
            current["registers"] = int(match.group(1))
            smem = re.search(r"(\d+) bytes smem", line)
            current["shared_bytes"] = int(smem.group(1)) if smem else 0
    return usage


def parse_ptxas_advisories(log: str) -> dict:
    """``{entry: ["C7520: <message>", ...]}``: ptxas' wgmma performance advisories per kernel --
    the ``ptxas info : (Cnnnn)`` lines about wgmma / warpgroup / GMMA, such as C7520 (wgmma
    serialized: a warpgroup arrive in a divergent path) and C7519 (a warpgroup.arrive injected
    because accumulator registers are used inside the asynchronous region).  They name the
    function they are about."""
    found: dict[str, list[str]] = {}
    for line in log.splitlines():
        match = re.search(r"\((C\d{4})\)\s*(.*)", line)
        if not match or not re.search(r"wgmma|warpgroup|gmma", match.group(2), re.IGNORECASE):
            continue
        func = re.search(r"function '([^']+)'", match.group(2))
        found.setdefault(func.group(1) if func else "", []).append(f"{match.group(1)}: {match.group(2).strip()}")
    return found


class NvccCompiler(Compiler):
    backend = "cuda"
    source_name = "kernel.cu"

    def __init__(self, configured: str | None):
        home = cuda_home()
        if configured is None and home is not None:
            candidate = os.path.join(home, "bin", "nvcc")
            if not os.access(candidate, os.X_OK):
                raise ToolchainNotFoundError(f"toolchain not found: CUDA_HOME/CUDA_PATH={home} has no bin/nvcc")
            configured = candidate
        self._binary = find_executable(configured, "KERNFORGE_JIT_NVCC", ("nvcc",), "CUDA compiler")
        self._lock = threading.Lock()
        self._facts: dict | None = None
        self._hosts: dict[str, dict] = {}

    @property
    def binary(self) -> str:
        return self._binary

    def _toolkit(self) -> dict:
        with self._lock:
            if self._facts is None:
                argv = [self._binary, "--version"]
                version = check_ran(run_tool(argv), argv).strip()
                argv = [self._binary, "--dryrun", "-cubin", "-x", "cu", os.devnull, "-o", os.devnull]
                dry = run_tool(argv)
                top = None
                for line in (dry.stdout + dry.stderr).splitlines():
                    if line.startswith("#$ TOP="):
                        top = os.path.normpath(line.split("=", 1)[1].strip())
                if top is None:
                    top = os.path.dirname(os.path.dirname(os.path.realpath(self._binary)))
                self._facts = {"version": version, "top": top}
            return self._facts

    def _host(self, options) -> dict:
        host = _host_compiler(options)
        with self._lock:
            if host not in self._hosts:
                argv = [host, "-E", "-v", "-x", "c++", os.devnull, "-o", os.devnull]
                probe = parse_probe(check_ran(run_tool(argv), argv))
                argv = [host, "--version"]
                probe["full_version"] = check_ran(run_tool(argv), argv).strip()
                self._hosts[host] = probe
            return self._hosts[host]

    def _full_options(self, options) -> list[str]:
        options = list(options)
        if not any(o.split("=")[0] in _ARCH_FLAGS for o in options):
            raise ConfigError("the cuda backend needs a target architecture option, e.g. options=('-arch=sm_90a',)")
        kind = [] if ("-fatbin" in options or "--fatbin" in options) else ["-cubin"]
        return list(DEFAULT_OPTIONS) + kind + options

    def binary_name(self, options) -> str:
        return "kernel.fatbin" if ("-fatbin" in options or "--fatbin" in options) else "kernel.cubin"

    def identity(self, options) -> dict:
        host = self._host(options)
        return {
            "kind": "nvcc",
            "name": os.path.basename(os.path.realpath(self._binary)),
            "version": self._toolkit()["version"],
            "host_version": host["full_version"],
            "host_target": host["target"],
        }

    def effective_options(self, options, num_include_dirs) -> list[str]:
        return self._full_options(options) + [f"-I<inc{i}>" for i in range(num_include_dirs)]

    def system_dirs(self, options) -> tuple[str, ...]:
        return (self._toolkit()["top"], *self._host(options)["search"])

    def compile(self, build_dir, options, include_dirs) -> CompileOutput:
        binary = self.binary_name(options)
        argv = [self._binary, *self._full_options(options)]
        argv += [f"-I{os.path.abspath(d)}" for d in include_dirs]
        argv += ["-MD", "-MF", "kernel.d", "-o", binary, self.source_name]
        proc = run_tool(argv, cwd=build_dir)
        log = check_ran(proc, argv)
        deps = read_depfile(os.path.join(build_dir, "kernel.d"), argv)
        os.unlink(os.path.join(build_dir, "kernel.d"))
        return CompileOutput(command=argv, log=log, deps=deps, binary=binary,
                             extra={"resource_usage": parse_ptxas_report(log),
                                    "advisories": parse_ptxas_advisories(log)})


def _host_compiler(options) -> str:
    options = list(options)
    for i, option in enumerate(options):
        name, _, value = option.partition("=")
        if name in _HOST_FLAGS:
            value = value or (options[i + 1] if i + 1 < len(options) else "")
            path = os.path.join(value, "g++") if os.path.isdir(value) else value
            if not os.access(path, os.X_OK):
                raise ToolchainNotFoundError(f"toolchain not found: host compiler {path} given by {name}")
            return path
    found = shutil.which("g++") or shutil.which("c++")
    if found is None:
        raise ToolchainNotFoundError("toolchain not found: nvcc needs a host C++ compiler (g++) on PATH")
    return found
