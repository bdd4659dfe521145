"""Typed errors of the JIT runtime, so callers can tell a missing toolchain
from a compile error from a broken cache without parsing messages."""


class RuntimeJitError(Exception):
    """Base class of every error the runtime raises on purpose."""


class ConfigError(RuntimeJitError, ValueError):
    """An environment variable or argument has an invalid value."""


class ToolchainNotFoundError(RuntimeJitError):
    """The compiler for the requested backend is not installed or not executable."""


class CompileError(RuntimeJitError):
    """The compiler ran and failed; the message carries its command and output."""


class CacheError(RuntimeJitError):
    """A cache directory cannot be used (permissions, read-only, disk full)."""


class PublishError(CacheError):
    """A built entry could not be renamed into the cache."""


class LockTimeoutError(CacheError):
    """Another live process held the build lock longer than the timeout."""


class LaunchError(RuntimeJitError, TypeError):
    """Arguments given to a kernel do not match its declared signature."""


class LoadError(RuntimeJitError):
    """A binary could not be loaded or a symbol is missing from it."""
