"""Every environment variable the JIT runtime reads, read in one place.

Resolution for a setting with suffix ``S`` is ``<APP>_JIT_S`` >
``KERNFORGE_JIT_S`` > default, as in DeepJIT: an application embedding
kernforge (prefix set with :func:`set_app_prefix`) can override any setting
without touching the global one.  A variable that is present but empty counts
as set, so an empty bool or int is an error rather than a silent default.

The cache roots are the one exception to the ``JIT_`` naming: they come from
``<APP>_JIT_CACHE_DIR`` > ``KERNFORGE_CACHE_DIR`` > ``~/.cache/kernforge``
(``KERNFORGE_CACHE_DIR`` is the documented project-wide name).

A :class:`Config` is an immutable snapshot; the runtime takes one when it is
created, so a long job is not affected by a later ``os.environ`` edit.
Call :func:`kernforge.runtime.reset` to take a fresh snapshot.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from .errors import ConfigError

GLOBAL_PREFIX = "KERNFORGE"
_app_prefix: str | None = None


def set_app_prefix(prefix: str | None) -> None:
    """Let ``<prefix>_JIT_*`` variables override ``KERNFORGE_JIT_*`` ones."""
    global _app_prefix
    if prefix is not None:
        if not re.fullmatch(r"[A-Z][A-Z0-9_]*", prefix):
            raise ConfigError(f"app prefix must be upper-case letters, digits or '_': {prefix!r}")
        if prefix == GLOBAL_PREFIX:
            raise ConfigError(f"{GLOBAL_PREFIX} is reserved for the global variables")
    _app_prefix = prefix


def _lookup(suffix: str, env) -> tuple[str, str] | None:
    """Return (variable name, value) of the highest-precedence variable set."""
    names = []
    if _app_prefix:
        names.append(f"{_app_prefix}_JIT_{suffix}")
    names.append(f"{GLOBAL_PREFIX}_JIT_{suffix}")
    for name in names:
        if name in env:
            return name, env[name]
    return None


def _parse_bool(name: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("true", "yes"):
        return True
    if lowered in ("false", "no"):
        return False
    if re.fullmatch(r"-?[0-9]+", value):
        return int(value) != 0
    raise ConfigError(f"invalid value for {name}: {value!r} (use true/false/yes/no or an integer)")


def _parse_float(name: str, value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise ConfigError(f"invalid value for {name}: {value!r} (expected a number)") from None
    if number < 0:
        raise ConfigError(f"invalid value for {name}: {value!r} (must be >= 0)")
    return number


def parse_size(name: str, value: str) -> int:
    match = re.fullmatch(r"([0-9]+)([KMGT]?)B?", value.strip().upper())
    if not match:
        raise ConfigError(f"invalid value for {name}: {value!r} (expected bytes, e.g. 10G)")
    scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[match.group(2)]
    return int(match.group(1)) * scale


def parse_cache_dirs(value: str, name: str) -> tuple[str, ...]:
    """Split a colon list of cache roots; an empty element is an error."""
    parts = value.split(":")
    if any(p == "" for p in parts):
        raise ConfigError(f"{name} contains an empty path: {value!r}")
    return tuple(os.path.expanduser(p) for p in parts)


@dataclass(frozen=True)
class Config:
    cache_dirs: tuple[str, ...]
    cxx: str | None  # None: search PATH for g++, then clang++
    nvcc: str | None
    bisheng: str | None
    use_nvrtc: bool
    verbose: bool
    print_command: bool
    lock_timeout_s: float
    cache_size_limit: int

    @classmethod
    def from_env(cls, env=None) -> "Config":
        env = os.environ if env is None else env

        def text(suffix):
            found = _lookup(suffix, env)
            if found is None:
                return None
            if found[1] == "":
                raise ConfigError(f"{found[0]} is set but empty")
            return found[1]

        def flag(suffix, default=False):
            found = _lookup(suffix, env)
            return default if found is None else _parse_bool(*found)

        cache_dirs = _cache_dirs(env)
        timeout = _lookup("LOCK_TIMEOUT", env)
        size = _lookup("CACHE_SIZE_LIMIT", env)
        return cls(
            cache_dirs=cache_dirs,
            cxx=text("CXX"),
            nvcc=text("NVCC"),
            bisheng=text("BISHENG"),
            use_nvrtc=flag("USE_NVRTC"),
            verbose=flag("VERBOSE"),
            print_command=flag("PRINT_COMMAND"),
            lock_timeout_s=600.0 if timeout is None else _parse_float(*timeout),
            cache_size_limit=(10 << 30) if size is None else parse_size(*size),
        )


def _cache_dirs(env) -> tuple[str, ...]:
    names = ([f"{_app_prefix}_JIT_CACHE_DIR"] if _app_prefix else []) + [f"{GLOBAL_PREFIX}_CACHE_DIR"]
    for name in names:
        if name in env:
            return parse_cache_dirs(env[name], name)
    home = env.get("HOME", "")
    if not home:
        raise ConfigError("HOME is empty and KERNFORGE_CACHE_DIR is not set: no cache directory")
    return (os.path.join(home, ".cache", "kernforge"),)


def ascend_home(env=None) -> str | None:
    """``ASCEND_HOME_PATH`` (CANN install root), read here like every variable."""
    env = os.environ if env is None else env
    return env.get("ASCEND_HOME_PATH") or None


def cuda_home(env=None) -> str | None:
    env = os.environ if env is None else env
    return env.get("CUDA_HOME") or env.get("CUDA_PATH") or None
