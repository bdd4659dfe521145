"""What every toolchain provides to the cache: an identity, the effective
options, the directories its own headers live in, and a compile step that
writes a binary plus a dependency file.

A Compiler does nothing else: keys, locking and publication live in the cache
so that every toolchain gets the same guarantees.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from ..errors import CompileError, ToolchainNotFoundError


@dataclass
class CompileOutput:
    command: list[str]
    log: str
    deps: list[str]  # files the compiler read, from its depfile
    binary: str  # file name of the binary inside the build dir
    extra: dict = field(default_factory=dict)  # backend facts for the manifest (e.g. resource usage)


class Compiler(ABC):
    backend: str
    source_name: str

    @abstractmethod
    def identity(self, options: tuple[str, ...]) -> dict:
        """Everything about the toolchain that changes the binary (keyed).

        No absolute install paths: two installs of one version must agree.
        """

    @abstractmethod
    def effective_options(self, options: tuple[str, ...], num_include_dirs: int) -> list[str]:
        """Defaults + user options, as keyed (include dirs as placeholders)."""

    @abstractmethod
    def system_dirs(self, options: tuple[str, ...]) -> tuple[str, ...]:
        """The toolchain's own header directories (anchors ``sys<i>``)."""

    @abstractmethod
    def compile(self, build_dir: str, options: tuple[str, ...], include_dirs: tuple[str, ...]) -> CompileOutput:
        """Compile ``build_dir/source_name`` into a binary in ``build_dir``."""

    @property
    @abstractmethod
    def binary(self) -> str:
        """Absolute path of the compiler executable that is run."""


def find_executable(configured: str | None, variable: str, candidates: tuple[str, ...], what: str) -> str:
    """Resolve a configured or searched compiler path, or explain what is missing."""
    if configured is not None:
        path = configured if os.sep in configured else shutil.which(configured)
        if path is None or not os.path.isfile(path) or not os.access(path, os.X_OK):
            raise ToolchainNotFoundError(f"toolchain not found: {variable}={configured!r} is not an executable file")
        return os.path.abspath(path)
    for name in candidates:
        path = shutil.which(name)
        if path is not None:
            return os.path.abspath(path)
    raise ToolchainNotFoundError(
        f"toolchain not found: no {what} ({' or '.join(candidates)}) on PATH; set {variable} to its path"
    )


def run_tool(argv: list[str], cwd: str | None = None, what: str = "compiler") -> subprocess.CompletedProcess:
    """Run a toolchain command; an OSError becomes a typed error naming the binary."""
    try:
        return subprocess.run(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except FileNotFoundError as exc:
        raise ToolchainNotFoundError(f"toolchain not found: cannot run {argv[0]}: {exc}") from exc
    except OSError as exc:  # EACCES, ENOEXEC (a script without #!), ...
        raise ToolchainNotFoundError(f"toolchain not found: {argv[0]} cannot be executed: {exc}") from exc


def check_ran(proc: subprocess.CompletedProcess, argv: list[str]) -> str:
    log = (proc.stdout or "") + (proc.stderr or "")
    if proc.returncode != 0:
        command = " ".join(argv)
        raise CompileError(f"command failed with exit code {proc.returncode}: {command}\n{log.strip()}")
    return log


def read_depfile(path: str, argv: list[str]) -> list[str]:
    from ..closure import parse_depfile

    try:
        with open(path) as f:
            return parse_depfile(f.read())
    except FileNotFoundError:
        raise CompileError(f"compiler wrote no dependency file {path}: {' '.join(argv)}") from None
