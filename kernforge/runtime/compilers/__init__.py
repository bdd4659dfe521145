"""One Compiler per toolchain; ``make_compiler`` picks it for a backend."""

from __future__ import annotations

from ..config import Config
from ..errors import ConfigError
from .base import CompileOutput, Compiler


def make_compiler(backend: str, config: Config) -> Compiler:
    if backend == "cpu":
        from .cpu import CpuCompiler

        return CpuCompiler(config.cxx)
    if backend == "cuda":
        if config.use_nvrtc:
            from .nvrtc import NvrtcCompiler

            return NvrtcCompiler()
        from .nvcc import NvccCompiler

        return NvccCompiler(config.nvcc)
    if backend == "ascend":
        from .bisheng import BishengCompiler

        return BishengCompiler(config.bisheng)
    raise ConfigError(f"unknown backend {backend!r}")


__all__ = ["CompileOutput", "Compiler", "make_compiler"]
