"""g++ / clang++ -> shared object, for the CPU backend.

The identity comes from one ``-E -v`` probe run with the target options: it
names the compiler version and target triple and prints the flags the driver
resolved ``-march=native`` to (gcc: ``-march=znver3 -mavx512f ... --param
l1-cache-size=32``; clang: ``-target-cpu``/``-target-feature``).  Keying those
resolved flags, not the literal ``-march=native``, keeps a cache shared by
machines with different CPUs from handing out a binary built for another one.
"""

from __future__ import annotations

import os
import re
import threading

from .base import CompileOutput, Compiler, check_ran, find_executable, read_depfile, run_tool

# -ffp-contract=off: g++ otherwise fuses a*b+c into an FMA under -march=native
# (even in ISO mode), so elementwise results would differ in the last bit from
# the numpy/interpreter references and between machines with and without FMA.
# Kernels that want an FMA call std::fma.
DEFAULT_OPTIONS = ("-O3", "-std=c++17", "-fPIC", "-shared", "-fopenmp", "-march=native", "-ffp-contract=off")


def _target_options(options) -> list[str]:
    """Options that change what the driver resolves the target to."""
    return [o for o in options if o.startswith("-m")]


def parse_probe(stderr: str) -> dict:
    """Version, target and resolved machine flags from ``-E -v`` output."""
    lines = stderr.splitlines()
    version = next((l.strip() for l in lines if re.match(r"^(gcc|clang|[\w.+-]* ?clang) version", l.strip())), "")
    target = next((l.split(":", 1)[1].strip() for l in lines if l.startswith("Target:")), "")
    machine: list[str] = []
    for line in lines:
        tokens = [t.strip('"') for t in line.split()]
        if not tokens:
            continue
        if tokens[0].endswith("cc1plus") or tokens[0].endswith("cc1"):
            i = 0
            while i < len(tokens):
                tok = tokens[i]
                if tok.startswith("-m") and not tok.startswith("-mllvm"):
                    machine.append(tok)
                elif tok == "--param" and i + 1 < len(tokens):
                    machine.append(f"--param={tokens[i + 1]}")
                    i += 1
                i += 1
        elif "-cc1" in tokens:
            for i, tok in enumerate(tokens[:-1]):
                if tok in ("-triple", "-target-cpu", "-tune-cpu", "-target-feature", "-target-abi"):
                    machine.append(f"{tok}={tokens[i + 1]}")
    search, inside = [], False
    for line in lines:
        if line.startswith("#include <...> search starts here"):
            inside = True
        elif line.startswith("End of search list"):
            inside = False
        elif inside and line.strip():
            search.append(os.path.normpath(line.strip().split(" (framework")[0]))
    return {"version": version, "target": target, "machine": machine, "search": search}


class CpuCompiler(Compiler):
    backend = "cpu"
    source_name = "kernel.cpp"

    def __init__(self, configured: str | None):
        self._binary = find_executable(configured, "KERNFORGE_JIT_CXX", ("g++", "clang++"), "C++ compiler")
        self._probes: dict[tuple, dict] = {}
        self._version: str | None = None
        self._lock = threading.Lock()

    @property
    def binary(self) -> str:
        return self._binary

    def _full_options(self, options) -> list[str]:
        # User options come last so that a later -O2 or -march=... wins.
        return list(DEFAULT_OPTIONS) + list(options)

    def _probe(self, options) -> dict:
        target = tuple(_target_options(self._full_options(options)))
        with self._lock:
            if target not in self._probes:
                argv = [self._binary, *target, "-E", "-v", "-x", "c++", os.devnull, "-o", os.devnull]
                proc = run_tool(argv)
                check_ran(proc, argv)
                self._probes[target] = parse_probe(proc.stderr)
            if self._version is None:
                argv = [self._binary, "--version"]
                proc = run_tool(argv)
                self._version = check_ran(proc, argv).strip()
            return self._probes[target]

    def identity(self, options) -> dict:
        probe = self._probe(options)
        return {
            "kind": "cxx",
            "name": os.path.basename(os.path.realpath(self._binary)),
            "version": self._version,
            "driver_version": probe["version"],
            "target": probe["target"],
            "machine": probe["machine"],
        }

    def effective_options(self, options, num_include_dirs) -> list[str]:
        return self._full_options(options) + [f"-I<inc{i}>" for i in range(num_include_dirs)]

    def system_dirs(self, options) -> tuple[str, ...]:
        return tuple(self._probe(options)["search"])

    def compile(self, build_dir, options, include_dirs) -> CompileOutput:
        argv = [self._binary, *self._full_options(options)]
        argv += [f"-I{os.path.abspath(d)}" for d in include_dirs]
        argv += ["-MD", "-MF", "kernel.d", "-o", "kernel.so", self.source_name]
        proc = run_tool(argv, cwd=build_dir)
        log = check_ran(proc, argv)
        deps = read_depfile(os.path.join(build_dir, "kernel.d"), argv)
        os.unlink(os.path.join(build_dir, "kernel.d"))
        return CompileOutput(command=argv, log=log, deps=deps, binary="kernel.so")
