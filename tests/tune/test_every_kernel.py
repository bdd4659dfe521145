"""``kernforge.tune`` works on every registry kernel on the CPU backend (and on CUDA where
a GPU is present).

One test per kernel (so xdist spreads them), taken from the registry at collection time:
a family registered later is covered without editing this file.  Each sweeps two
configurations at the kernel's smallest problem: the problem's own, and another value of
the first tunable that has one the factory accepts there.  The tuner must return a winner
that it verified and timed, reject nothing (both points are valid configurations, so a
rejection is a kernel or tuner bug), and the winner must match the spec's torch
reference again on inputs drawn with another seed.
"""
from __future__ import annotations

import math

import pytest
import torch

import kernforge.tune as kt
from kernforge import backends
from kernforge.kernels import registry
from kernforge.tune import consult
from tests.conftest import host_backends

SPECS = registry.all_specs()

# A tunable whose other values are not valid at the smallest problem: the contiguous grouped
# GEMMs' "small" layout aligns experts to 32 rows, so a 64-row tile would span two experts
# (the sweep rejects it as a verify mismatch, tests/tune/test_tune.py; the ops' ``valid``
# refuses such a row).  These kernels sweep their next tunable instead.
NOT_AT_SMALL = {name: ("block_M",) for name in SPECS if name.startswith("m_grouped_") and name.endswith("_contiguous")}


def smallest_problem(spec: registry.KernelSpec) -> str:
    """``small`` (the catalogue's test size) if the kernel has it, else the problem whose
    integer sizes multiply to the least."""
    if "small" in spec.problems:
        return "small"

    def size(label):
        ints = [v for v in spec.problems[label].params.values() if isinstance(v, int) and not isinstance(v, bool)]
        return math.prod(max(v, 1) for v in ints)

    return min(spec.problems, key=size)


def _traces(spec: registry.KernelSpec, params: dict) -> bool:
    """Whether the factory accepts ``params`` (tracing is cheap; building is the sweep's job).
    A declared value can be invalid at a given problem, e.g. mla_decode's ``block_N=32``
    with 16-token pages: the sweep rejects it with the factory's message, which is right,
    but it leaves nothing to compare the problem's configuration with."""
    try:
        spec.factory(**params)
    except ValueError:
        return False
    return True


def two_point_space(spec: registry.KernelSpec, params: dict) -> dict:
    """The problem's configuration and one neighbour: the first tunable with a declared value
    other than the problem's that the factory accepts takes both; the rest stay at the
    problem's values."""
    space = getattr(spec.factory, "space", {})
    assert space, f"{spec.name} declares no tuning space (@T.tunable), so `kernforge tune` cannot sweep it"
    factory = getattr(spec.factory, "factory", spec.factory)
    current = {t: params.get(t, factory.signature.parameters[t].default) for t in space}
    for t in space:
        if t in NOT_AT_SMALL.get(spec.name, ()):
            continue
        for v in space[t]:
            if v != current[t] and _traces(spec, dict(params, **{t: v})):
                return {t: [current[t], v]}
    raise AssertionError(f"{spec.name}: no tunable has a second value the factory accepts at this problem")


@pytest.fixture(autouse=True)
def _db(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNFORGE_TUNE_DB", str(tmp_path / "tune.sqlite"))
    monkeypatch.delenv("KERNFORGE_TUNE", raising=False)
    consult.reset()
    yield
    consult.reset()


# cuda: every kernel through nvcc and the fit check, on a GPU machine only (minutes of nvcc)
CUDA = pytest.param("cuda", id="cuda", marks=[
    pytest.mark.gpu, pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no NVIDIA GPU (torch.cuda.is_available() is False)")])


@pytest.mark.parametrize("backend", [*host_backends("cpu"), CUDA])
@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_registry_kernel_tunes_to_a_verified_winner(name, backend):
    spec = SPECS[name]
    label = smallest_problem(spec)
    params = dict(spec.problems[label].params)
    space = two_point_space(spec, params)
    res = kt.tune(name, backend=backend, problem=label, space=space, repeats=2, settle=0, budget_s=120)
    assert not res.stopped, f"{name}: the sweep ran out of its budget"
    (tunable, values), = space.items()
    assert not res.rejected, f"{name}: {[(r.config, r.reason) for r in res.rejected]}"
    timed = [r for r in res.ranked if r.status == "timed"]
    assert sorted(r.config[tunable] for r in timed) == sorted(values) and all(r.median_ms > 0 for r in timed)
    assert res.best is not None and res.best[tunable] in values
    assert res.best == timed[0].config
    # the winner, rebuilt (a JIT cache hit) as the tuner builds it (all its launches: the
    # split-KV entry's split kernel and combine) and run on fresh poisoned inputs, matches
    # the reference
    full = dict(params, **res.best)
    inputs = spec.make_inputs(full, 1, backends.device(backend))
    expected = spec.reference([t.clone() if hasattr(t, "clone") else t for t in inputs], full)
    spec.compile(backend, **full)(*inputs)
    spec.check([inputs[i] for i in spec.outputs], expected, inputs, full)
