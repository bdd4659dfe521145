"""``kernforge.tune``: sweep a library kernel's tuning space, verify every configuration,
time the correct ones, and remember the results.

A configuration is kept only after it has run on the spec's own poisoned inputs
(``spec.make_inputs``: outputs start as NaN or sentinels) and matched the spec's torch
reference within the spec's tolerance; one that fails to trace, compile, run or verify
is rejected with the reason.  Timing is serial, after a warm-up: each sample times
enough back-to-back calls to last about a millisecond, and the result is the median
of the samples with their interquartile spread.  Every configuration is written to the
database (:mod:`kernforge.tune.db`) the moment it is done, so a sweep that dies is
resumed by running it again.
"""
from __future__ import annotations

import itertools
import json
import random as _random
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Union

from kernforge import backends
from kernforge.kernels import registry
from kernforge.kernels.check import ProblemError, default_problem, get_problem
from kernforge.tune import consult
from kernforge.tune.db import Database, Key, Row, canonical
from kernforge.tune.errors import BadShapeError, EmptySpaceError, TuneError, UnknownKernelError, UnknownTunableError
from kernforge.tune.keys import bind_params, make_key
from kernforge.tune.fit import misfit

STRATEGIES = ("grid", "random", "halving")
# Progress events: ("compiled" | "verified" | "timed" | "rejected" | "pruned" | "reused", config, result);
# "timed" comes again for a configuration re-timed to settle the ranking
Progress = Optional[Callable[[str, dict, "TuneResult"], None]]


@dataclass
class TuneResult:
    """A sweep's outcome.  ``ranked``: the timed configurations, fastest first (then the ones
    successive halving pruned after short timings, flagged ``pruned``); ``rejected``: the
    configurations that failed, each with its reason.  ``cached``: returned from the
    database without running anything; ``stopped``: why the sweep ended before covering its
    plan (``"budget"``), else empty.  ``stable``: the best median's interquartile range
    lies below the runner-up's, so the ranking at the top is not noise."""

    kernel: str
    backend: str
    key: Key
    strategy: str
    space: dict
    ranked: list[Row] = field(default_factory=list)
    rejected: list[Row] = field(default_factory=list)
    cached: bool = False
    stopped: str = ""
    elapsed_s: float = 0.0
    time_to_best_s: Optional[float] = None  # when the final best was first timed (this run)
    db_path: str = ""
    planned: int = 0  # configurations in the plan (progress bars size themselves on it)
    settle_rounds: int = 0  # extra timing rounds run to separate the top two (see ``stable``)
    leader: Optional[Row] = None  # the fastest timing so far, while the sweep runs (for progress)

    @property
    def best(self) -> Optional[dict]:
        timed = [r for r in self.ranked if r.status == "timed"]
        return timed[0].config if timed else None

    @property
    def stable(self) -> Optional[bool]:
        timed = [r for r in self.ranked if r.status == "timed"]
        if len(timed) < 2:
            return None
        return separated(timed[0], timed[1])

    def to_json(self) -> dict:
        return dict(kernel=self.kernel, backend=self.backend, key=json.loads(self.key.text),
                    strategy=self.strategy, space=self.space, best=self.best, stable=self.stable,
                    cached=self.cached, stopped=self.stopped, elapsed_s=self.elapsed_s,
                    time_to_best_s=self.time_to_best_s, db=self.db_path, settle_rounds=self.settle_rounds,
                    ranked=[r.to_json() for r in self.ranked], rejected=[r.to_json() for r in self.rejected])


def separated(a: Row, b: Row) -> bool:
    """Whether ``a``'s interquartile range lies below ``b``'s (medians +- half the spread)."""
    return a.median_ms * (1 + (a.spread or 0) / 2) < b.median_ms * (1 - (b.spread or 0) / 2)


# ---------------------------------------------------------------- requests


def resolve_spec(kernel: Union[str, registry.KernelSpec, Callable]) -> registry.KernelSpec:
    """The registry spec for a kernel name, a spec, or a spec's factory: tuning needs the
    spec's inputs and torch reference to verify every configuration."""
    if isinstance(kernel, registry.KernelSpec):
        return kernel
    specs = registry.all_specs()
    if isinstance(kernel, str):
        if kernel not in specs:
            raise UnknownKernelError(f"unknown kernel {kernel!r}; known: {', '.join(sorted(specs))}")
        return specs[kernel]
    for spec in specs.values():
        if kernel is spec.factory or kernel is getattr(spec.factory, "factory", None):
            return spec
    name = getattr(kernel, "name", getattr(kernel, "__name__", repr(kernel)))
    raise UnknownKernelError(f"{name} is not a registry kernel: tuning verifies each configuration against "
                             f"a spec's torch reference (kernforge.kernels.registry)")


def _factory(spec: registry.KernelSpec):
    """The ``@T.tunable`` factory behind the spec (under its runtime-size wrapper)."""
    return getattr(spec.factory, "factory", spec.factory)


def resolve_space(spec: registry.KernelSpec, space: Optional[dict]) -> dict:
    """The swept values per tunable (``space`` checked against the declared one)."""
    declared = dict(getattr(spec.factory, "space", {}) or {})
    if space is None:
        space = declared
    if not space:
        raise EmptySpaceError(f"{spec.name} declares no tuning space (@T.tunable) and none was given")
    out = {}
    for k, values in space.items():
        if k not in declared:
            raise UnknownTunableError(f"{k!r} is not a tunable of {spec.name} (tunables: "
                                      f"{', '.join(declared) or 'none'})")
        values = list(values) if isinstance(values, (list, tuple, range)) else [values]
        if not values:
            raise EmptySpaceError(f"tunable {k!r} of {spec.name} has no values to try")
        out[k] = values
    return out


def _plan(space: dict, strategy: str, samples: Optional[int], seed: int) -> list[dict]:
    keys = list(space)
    grid = [dict(zip(keys, v)) for v in itertools.product(*(space[k] for k in keys))]
    if strategy == "random":
        n = samples if samples is not None else max(1, min(len(grid), max(8, len(grid) // 4)))
        return _random.Random(seed).sample(grid, min(n, len(grid)))
    return grid


# ---------------------------------------------------------------- one configuration


def _compile(spec, backend, params):
    """Trace and build one configuration (module-level so tests can count the builds); a
    spec with a ``build`` hook builds all its launches (:meth:`~kernforge.kernels.registry.KernelSpec.compile`)."""
    return spec.compile(backend, **params)


def _clone(inputs):
    return [t.clone() if hasattr(t, "clone") else t for t in inputs]


def _time(kernel, inputs, samples: int, device: str) -> tuple[float, float]:
    """(median ms per call, interquartile range / median) over ``samples`` samples, after a
    warm-up; each sample is enough back-to-back calls to last about a millisecond."""
    sync = (lambda: __import__("torch").cuda.synchronize()) if device == "cuda" else (lambda: None)
    kernel(*inputs)
    sync()
    t = time.perf_counter()
    kernel(*inputs)
    sync()
    once = time.perf_counter() - t
    calls = max(1, min(100, int(1e-3 / max(once, 1e-7))))
    times = []
    for _ in range(samples):
        t = time.perf_counter()
        for _ in range(calls):
            kernel(*inputs)
        sync()
        times.append((time.perf_counter() - t) * 1e3 / calls)
    med = statistics.median(times)
    if len(times) >= 4:
        q = statistics.quantiles(times, n=4)
        spread = (q[2] - q[0]) / med if med > 0 else 0.0
    else:
        spread = (max(times) - min(times)) / med if med > 0 else 0.0
    return med, spread


class _Workloads:
    """The inputs and torch reference each configuration is verified and timed on.

    ``spec.make_inputs`` sees the whole configuration, and a tunable may shape the inputs:
    the MoE mapping kernels' ``chunk_offset`` has one row per ``chunk`` slots, so a chunk
    of 256 run on inputs sized for 64 computes a different (not a wrong) answer.  Inputs
    are therefore made per configuration, and the reference, the costly part, is computed
    once per distinct set of inputs: a configuration whose inputs equal an earlier one's
    (every tunable that leaves the inputs alone) reuses that one's."""

    def __init__(self, spec, seed: int, device: str):
        self.spec, self.seed, self.device = spec, seed, device
        self.seen: list[tuple[list, list]] = []  # (inputs, expected), one per distinct inputs

    def get(self, full: dict) -> tuple[list, list]:
        inputs = self.spec.make_inputs(full, self.seed, self.device)
        for have, expected in self.seen:
            if _same_inputs(have, inputs):
                return have, expected
        expected = self.spec.reference(_clone(inputs), full)
        self.seen.append((inputs, expected))
        return inputs, expected


def _same_inputs(a: list, b: list) -> bool:
    """Bit-equal argument lists (NaN poison included, which ``torch.equal`` calls unequal)."""
    import torch

    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
            return False
        if not isinstance(x, torch.Tensor):
            if x != y:
                return False
        elif (x.dtype, x.shape, x.stride(), x.device) != (y.dtype, y.shape, y.stride(), y.device) or \
                not torch.equal(x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8)):
            return False
    return True


def _reason(stage: str, e: BaseException) -> str:
    text = " | ".join(line.strip() for line in str(e).splitlines() if line.strip()) or type(e).__name__
    return f"{stage}: {type(e).__name__}: {text[:400]}"


# ---------------------------------------------------------------- the sweep


def tune(kernel, backend: Optional[str] = None, problem: Union[str, dict, None] = None,
         space: Optional[dict] = None, budget_s: Optional[float] = None, strategy: str = "grid",
         jobs: int = 1, force: bool = False, samples: Optional[int] = None, repeats: int = 10,
         seed: int = 0, settle: int = 3, db: Union[str, Database, None] = None,
         progress: Progress = None) -> TuneResult:
    """Sweep ``kernel`` (a registry name, spec or factory) on ``backend`` (default: the
    default CPU backend) at ``problem`` (a registry label, or a dict of parameters
    overriding the default problem's).

    ``space`` defaults to the factory's ``@T.tunable`` space; ``strategy`` is ``grid``
    (every point), ``random`` (``samples`` points drawn with ``seed``) or ``halving``
    (successive halving: all verified points get three short samples, the faster half
    twice as many, and so on; the last two get ``repeats`` samples).  ``budget_s`` stops
    the sweep with the best so far.  While the top two's timings overlap, both are timed
    again with twice the samples, at most ``settle`` times (``TuneResult.stable`` then says
    whether that separated them).  ``jobs > 1`` builds the configurations in that many
    worker processes first (the JIT cache makes the builds here hits).  ``force`` re-runs
    a key already in the database; otherwise a finished sweep of the same space returns
    at once, and an unfinished one resumes, skipping the configurations recorded."""
    t_start = time.perf_counter()
    spec = resolve_spec(kernel)
    backend = backend or backends.for_device("cpu")
    try:
        backends.get(backend)
    except backends.BackendError as e:
        raise TuneError(str(e)) from None
    if strategy not in STRATEGIES:
        raise TuneError(f"unknown strategy {strategy!r}; choices: {', '.join(STRATEGIES)}")
    if not isinstance(settle, int) or settle < 0:
        raise TuneError(f"settle must be a non-negative int, got {settle!r}")
    if not isinstance(jobs, int) or jobs < 1:
        raise TuneError(f"jobs must be a positive int, got {jobs!r}")
    if budget_s is not None and budget_s <= 0:
        raise TuneError(f"budget_s must be positive, got {budget_s!r}")
    swept = resolve_space(spec, space)
    if isinstance(problem, dict):
        base = dict(get_problem(spec, default_problem(spec, backend)).params)
        base.update(problem)
        params, label = base, "custom"
    else:
        try:
            label = problem or default_problem(spec, backend)
            params = dict(get_problem(spec, label).params)
        except ProblemError as e:
            raise BadShapeError(str(e)) from None
    params = bind_params(_factory(spec), params, spec)
    # every declared tunable is in each configuration (those not swept at the problem's
    # value), so a recorded best is a complete configuration for the ops
    space = {k: swept.get(k, [params[k]]) for k in spec.factory.space}
    key = make_key(spec.name, backend, params, space)
    database = db if isinstance(db, Database) else Database(db)
    owned = not isinstance(db, Database)
    try:
        result = TuneResult(spec.name, backend, key, strategy, space, db_path=database.path)
        recorded = database.sweep(key)
        if not force and recorded and recorded["complete"] and recorded["space"] == space:
            _fill(result, database.rows(key))
            result.cached = True
            result.elapsed_s = time.perf_counter() - t_start
            return result
        workload = {k: v for k, v in params.items() if k not in space and k not in json.loads(key.bucket)}
        database.begin_sweep(key, space, strategy, dict(workload, problem=label), force)
        _run(spec, backend, params, space, strategy, samples, repeats, seed, budget_s, jobs, settle, database,
             key, result, progress, t_start)
        if not result.stopped:
            database.finish_sweep(key)
        _fill(result, database.rows(key), only=_plan(space, strategy, samples, seed))
        result.elapsed_s = time.perf_counter() - t_start
        return result
    finally:
        consult.reset()  # the ops see what was just recorded
        if owned:
            database.close()


def _fill(result: TuneResult, rows: list[Row], only: Optional[list[dict]] = None) -> None:
    if only is not None:
        wanted = {canonical(c) for c in only}
        rows = [r for r in rows if canonical(r.config) in wanted]
    order = {"timed": 0, "pruned": 1}
    result.ranked = sorted((r for r in rows if r.status != "rejected"),
                           key=lambda r: (order[r.status], r.median_ms))
    result.rejected = [r for r in rows if r.status == "rejected"]


def _run(spec, backend, params, space, strategy, samples, repeats, seed, budget_s, jobs, settle, database, key,
         result, progress, t_start) -> None:
    say = progress or (lambda *_: None)
    done = {canonical(r.config): r for r in database.rows(key) if r.status in ("timed", "rejected")}
    plan = _plan(space, strategy, samples, seed)
    result.planned = len(plan)
    todo = [c for c in plan if canonical(c) not in done]
    for c in plan:
        row = done.get(canonical(c))
        if row is not None:
            if row.status == "timed" and (result.leader is None or row.median_ms < result.leader.median_ms):
                result.leader = row
            say("reused", c, result)
    over = (lambda: budget_s is not None and time.perf_counter() - t_start > budget_s)
    if jobs > 1 and len(todo) > 1:
        from kernforge.tune.pool import prebuild

        prebuild(spec.name, backend, [dict(params, **c) for c in todo], jobs)
    device = backends.device(backend)
    workloads = _Workloads(spec, seed, device)

    first_timed = {}  # canonical config -> seconds into the sweep when this run first timed it

    def record_time(config, med, spread, n):
        database.record(key, Row(config, "timed", med, spread, n))
        first_timed.setdefault(canonical(config), time.perf_counter() - t_start)
        if result.leader is None or med < result.leader.median_ms:
            result.leader = Row(config, "timed", med, spread, n)
        say("timed", config, result)

    def reject(config, reason):
        row = Row(config, "rejected", reason=reason)
        database.record(key, row)
        say("rejected", config, result)

    verified = []  # (config, kernel, inputs) ready to time
    built = {}  # canonical config -> (kernel, inputs) of everything verified in this run
    for config in todo:
        if over():
            result.stopped = "budget"
            break
        full = dict(params, **config)
        try:
            kern = _compile(spec, backend, full)
        except Exception as e:  # noqa: BLE001 - a configuration that cannot build is a result, not a crash
            reject(config, _reason("compile", e))
            continue
        why = misfit(kern, backend)
        if why:
            reject(config, why)
            continue
        say("compiled", config, result)
        inputs, expected = workloads.get(full)
        args = _clone(inputs)
        try:
            kern(*args)
            spec.check([args[i] for i in spec.outputs], expected, args, full)
        except AssertionError as e:
            reject(config, _reason("verify", e))
            continue
        except Exception as e:  # noqa: BLE001
            reject(config, _reason("run", e))
            continue
        say("verified", config, result)
        built[canonical(config)] = (kern, args)
        if strategy == "halving":
            verified.append((config, kern, args))
            continue
        record_time(config, *_time(kern, args, repeats, device), repeats)
    if strategy == "halving" and verified:
        _halve(verified, repeats, device, over, database, key, result, say, record_time)
    if not result.stopped and settle:
        _settle(spec, backend, params, workloads, plan, built, settle, device, over, database, key, result, say,
                record_time)
    best = database.best(key.text)
    result.time_to_best_s = first_timed.get(canonical(best)) if best is not None else None


def _halve(verified, repeats, device, over, database, key, result, say, record_time) -> None:
    """Successive halving: every verified configuration gets three short samples, the faster
    half twice as many, and so on; the last two get the full ``repeats``."""
    alive, short = verified, 3
    while len(alive) > 2 and not over():
        timed = sorted(((_time(k, a, short, device), (c, k, a)) for c, k, a in alive), key=lambda x: x[0][0])
        keep = max(2, len(timed) // 2)
        for (med, spread), (c, _, _) in timed[keep:]:
            database.record(key, Row(c, "pruned", med, spread, short, reason=f"pruned after {short} samples"))
            say("pruned", c, result)
        alive, short = [x for _, x in timed[:keep]], short * 2
    if len(alive) > 2:  # the budget ran out before the races: the rest stay unrecorded, to resume
        result.stopped, alive = "budget", alive[:2]
    for c, k, a in alive:
        record_time(c, *_time(k, a, repeats, device), repeats)


def _settle(spec, backend, params, workloads, plan, built, rounds, device, over, database, key, result, say,
            record_time) -> None:
    """Time the top two again, with twice the samples each round, while their interquartile
    ranges overlap: a ranking decided by noise is not worth remembering.  Gives up after
    ``rounds`` (two configurations of equal speed never separate); ``result.stable`` says
    which way it ended.  A configuration recorded by an earlier run is rebuilt (a JIT cache
    hit) on the same inputs it was verified on."""
    wanted = {canonical(c) for c in plan}
    for _ in range(rounds):
        timed = sorted((r for r in database.rows(key) if r.status == "timed" and canonical(r.config) in wanted),
                       key=lambda r: r.median_ms)
        if len(timed) < 2 or separated(timed[0], timed[1]) or over():
            return
        result.settle_rounds += 1
        for row in timed[:2]:
            full = dict(params, **row.config)
            kern, args = built.get(canonical(row.config)) or (
                _compile(spec, backend, full), _clone(workloads.get(full)[0]))
            n = 2 * (row.samples or 1)
            record_time(row.config, *_time(kern, args, n, device), n)
