"""Parallel builds for ``tune(..., jobs=N)``: the configurations are compiled in worker
processes first, so their compile times overlap; each build lands in the JIT cache, and
the serial verify-and-time loop in the parent then loads it instead of compiling.  A build
that fails in a worker fails again in the parent, which rejects it with the reason, so
workers report nothing.  Workers are spawned (not forked): the parent may hold OpenMP and
torch threads that a fork would copy in an unusable state."""
from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor, wait

from kernforge import backends


def _build(kernel: str, backend: str, params: dict) -> None:
    from kernforge.kernels import registry

    try:
        registry.get(kernel).compile(backend, **params)
    except Exception:  # noqa: BLE001 - the parent rebuilds it and records the reason
        pass


def _worker_init(cache_dirs: str) -> None:
    os.environ["KERNFORGE_CACHE_DIR"] = cache_dirs  # before the worker's runtime reads its configuration


def prebuild(kernel: str, backend: str, configs: list[dict], jobs: int) -> None:
    """Build ``kernel`` at every one of ``configs`` (whole parameter dicts) on ``backend`` in
    ``jobs`` processes.  The interpreter has nothing to compile, so it is skipped.  Workers
    write into the cache tiers of the parent's runtime, which the serial loop reads: the
    environment may name other ones by now (the runtime reads it once)."""
    if backends.lang(backend) == "ir":
        return
    from kernforge.runtime.runtime import get_runtime

    tiers = ":".join(get_runtime().config.cache_dirs)  # the runtime's own list syntax (config.parse_cache_dirs)
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(jobs, len(configs)), mp_context=ctx, initializer=_worker_init,
                             initargs=(tiers,)) as pool:
        wait([pool.submit(_build, kernel, backend, c) for c in configs])
