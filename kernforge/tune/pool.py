"""Parallel builds for ``tune(..., jobs=N)``: the configurations are compiled in worker
processes first, so their compile times overlap; each build lands in the JIT cache, and
the serial verify-and-time loop in the parent then loads it instead of compiling.  A build
that fails in a worker fails again in the parent, which rejects it with the reason, so
workers report nothing.  Workers are spawned (not forked): the parent may hold OpenMP and
torch threads that a fork would copy in an unusable state."""
from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor, wait

from kernforge import backends


def _build(kernel: str, backend: str, params: dict) -> None:
    from kernforge.kernels import registry

    try:
        registry.get(kernel).compile(backend, **params)
    except Exception:  # noqa: BLE001 - the parent rebuilds it and records the reason
        pass


def prebuild(kernel: str, backend: str, configs: list[dict], jobs: int) -> None:
    """Build ``kernel`` at every one of ``configs`` (whole parameter dicts) on ``backend`` in
    ``jobs`` processes.  The interpreter has nothing to compile, so it is skipped."""
    if backends.lang(backend) == "ir":
        return
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(jobs, len(configs)), mp_context=ctx) as pool:
        wait([pool.submit(_build, kernel, backend, c) for c in configs])
