"""kernforge's JIT runtime: compile generated source, cache it safely, load it.

::

    from kernforge import runtime
    module = runtime.compile("add", source, backend="cpu",
                             include_dirs=(include_dir,), dependency_signature="")
    fn = module.get_function("kf_add", argtypes=("ptr", "ptr"), restype="i32")
    status = fn(runtime.pack_pointers([x, y, out]), runtime.pack_dims([n]))

The cache key covers the source, every file the compiler read (from its own
dependency output, by content), the compiler's identity, the effective
options (``-march=native`` resolved) and ``dependency_signature``.  Entries are
published by one atomic directory rename with a checksummed manifest, under a
per-key file lock.  See ``docs/runtime.md``.
"""

from .args import pack_dims, pack_pointers
from .config import Config, set_app_prefix
from .errors import (
    CacheError,
    CompileError,
    ConfigError,
    LaunchError,
    LoadError,
    LockTimeoutError,
    PublishError,
    RuntimeJitError,
    ToolchainNotFoundError,
)
from .module import CompileResult, Function, Module
from .runtime import CacheCorruptionWarning, Runtime, get_runtime, reset


def compile(tag, source, *, backend="cpu", options=(), include_dirs=(), dependency_signature="") -> Module:
    """Compile (or fetch from cache) and load ``source``; returns a Module."""
    return get_runtime().compile(tag, source, backend=backend, options=options, include_dirs=include_dirs,
                                 dependency_signature=dependency_signature)


def compile_without_load(tag, source, *, backend="cpu", options=(), include_dirs=(),
                         dependency_signature="") -> CompileResult:
    """Compile (or fetch) and publish ``source`` without loading it (no GPU needed)."""
    return get_runtime().compile_without_load(tag, source, backend=backend, options=options,
                                              include_dirs=include_dirs, dependency_signature=dependency_signature)


def stats() -> dict:
    """This process's hit, miss and compile-time counters."""
    from dataclasses import asdict

    return asdict(get_runtime().counters)


__all__ = [
    "CacheCorruptionWarning", "CacheError", "CompileError", "CompileResult", "Config", "ConfigError",
    "Function", "LaunchError", "LoadError", "LockTimeoutError", "Module", "PublishError",
    "Runtime", "RuntimeJitError", "ToolchainNotFoundError", "compile", "compile_without_load", "get_runtime",
    "pack_dims", "pack_pointers", "reset", "set_app_prefix", "stats",
]
