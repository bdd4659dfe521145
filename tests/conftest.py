"""Shared test configuration: temporary JIT cache, backend discovery, hypothesis profile."""
from __future__ import annotations

import os
from typing import Optional

import pytest
from hypothesis import settings

# CI runs a fixed (derandomized) set of examples so that a landing never depends on the
# draw; local runs explore new examples each time.
settings.register_profile("kernforge", deadline=None, max_examples=20,
                          derandomize=bool(os.environ.get("CI")), print_blob=True)
settings.load_profile("kernforge")


@pytest.fixture(scope="session", autouse=True)
def _session_cache_dir(tmp_path_factory):
    """All tests share one throwaway JIT cache, never the user's.

    Under pytest-xdist every worker of the run uses the same one (in the run's base temp
    directory, the parent of the workers' own): a kernel that tests on two workers need is
    compiled once, not once per worker.  The cache is built for that (per-key ``flock`` build
    locks, atomic publishes; tests/runtime/test_concurrency.py); tests that count compiles or
    misses use private roots of their own."""
    if "KERNFORGE_CACHE_DIR" not in os.environ or os.environ.get("CI"):
        if os.environ.get("PYTEST_XDIST_WORKER"):
            shared = tmp_path_factory.getbasetemp().parent / "kf_cache"
            shared.mkdir(exist_ok=True)
        else:
            shared = tmp_path_factory.mktemp("kf_cache")
        os.environ["KERNFORGE_CACHE_DIR"] = str(shared)
    yield


def pytest_collection_modifyitems(items):
    """Modules holding a ``slow`` test run first, each module's tests still together and in
    order (so a module-scoped fixture is set up once per worker, as before).

    pytest-xdist hands out tests in collection order; with the long tests early, the last
    ones to be handed out are short and both workers finish together, instead of one worker
    spending the end of the run alone on a minute-long test collected last (tests/tilelang,
    tests/tune).  Every worker computes the same order, which xdist requires."""
    slow = {item.module.__name__ for item in items
            if item.get_closest_marker("slow") is not None and getattr(item, "module", None) is not None}
    items.sort(key=lambda item: getattr(item, "module", None) is None or item.module.__name__ not in slow)


HOST_BACKENDS = ("interp", "cpu", "cuda-emu")


def host_backend_skip_reason(name: str) -> Optional[str]:
    """Why backend ``name`` cannot run on this machine (None: it can).

    cpu and cuda-emu compile with the C++ compiler kernforge's runtime would pick itself
    (``KERNFORGE_JIT_CXX``, else g++ or clang++ on PATH), so the answer is the runtime's own."""
    from kernforge import backends

    try:
        backends.get(name)
    except backends.BackendError as e:
        return f"backend {name!r} is not available: {e}"
    if name in ("cpu", "cuda-emu"):
        from kernforge.runtime.compilers import make_compiler
        from kernforge.runtime.config import Config
        from kernforge.runtime.errors import ConfigError, ToolchainNotFoundError

        try:
            make_compiler("cpu", Config.from_env())
        except (ToolchainNotFoundError, ConfigError) as e:
            return f"backend {name!r} needs a C++ compiler: {e}"
    return None


_SKIP_REASONS: dict[str, Optional[str]] = {}


def _cached_skip_reason(name: str) -> Optional[str]:
    if name not in _SKIP_REASONS:
        _SKIP_REASONS[name] = host_backend_skip_reason(name)
    return _SKIP_REASONS[name]


def backend_param(name: str, *more, **kw):
    """``pytest.param(name, *more)``, skipped with the reason when backend ``name`` cannot run here."""
    reason = _cached_skip_reason(name)
    marks = [pytest.mark.skip(reason=reason)] if reason else []
    return pytest.param(name, *more, marks=marks, **kw)


class HostBackends(list):
    """The parameters of :func:`host_backends`; ``"cpu" in it`` is true only when cpu can run."""

    def __contains__(self, item) -> bool:
        if isinstance(item, str):
            return any(p.values[0] == item and not p.marks for p in self)
        return super().__contains__(item)


def host_backends(*names: str) -> HostBackends:
    """One parametrize value per host backend (``names``, default interp, cpu and cuda-emu):
    a backend that cannot run on this machine is still listed, skipped with the reason, so a
    missing compiler shows up in the report instead of silently shrinking the suite."""
    for n in names:
        if n not in HOST_BACKENDS:
            raise ValueError(f"{n!r} is not a host backend ({', '.join(HOST_BACKENDS)})")
    return HostBackends(backend_param(n, id=n) for n in names or HOST_BACKENDS)
