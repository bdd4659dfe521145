"""What the ops ask the tuning database: "is there a tuned configuration for this call?".

Every family's configuration chooser (``kernforge/kernels/*/config.py``) is wrapped in
:func:`tuned`, which overlays the database's best tunables on the heuristic's
configuration (:func:`overlay`).  Choosers run on every op call, so both layers are
memoised per process: the first call per (kernel, backend, parameters) opens the database
read-only, and only computes the device and compiler identity if some sweep of that
kernel on that backend exists at all (a process that never tuned pays one ``stat`` of the
file).  :func:`reset` forgets everything (``tune`` calls it after recording).
``KERNFORGE_TUNE=0`` turns lookups off.
"""
from __future__ import annotations

import functools
import inspect
import json
import os
import sqlite3
import threading
from typing import Callable, Optional, Union

_memo: dict = {}
_overlays: dict = {}  # (kernel, backend, heuristic config, keyed arguments, valid, pinned, db place) -> config or None
_swept: dict = {}  # db path -> {(kernel, backend)} with at least one sweep
_lock = threading.Lock()
_generation = 0  # bumped by reset(): caches of chooser results key on it (see stamp())


def enabled() -> bool:
    return os.environ.get("KERNFORGE_TUNE", "1").strip().lower() not in ("0", "false", "no", "off")


def reset() -> None:
    """Forget memoised lookups (after the database changed in this process)."""
    global _generation
    with _lock:
        _generation += 1
        _memo.clear()
        _swept.clear()
        _overlays.clear()


def lookup(kernel_name: str, backend: str, params: dict, factory=None,
           pinned: Optional[dict] = None) -> Optional[dict]:
    """The fastest recorded configuration (every tunable of the kernel, as keyword
    parameters) for ``kernel_name`` on ``backend`` at ``params`` (its non-tuned parameters;
    tunables in it are ignored), on this device with this compiler and kernforge version;
    None if there is none or ``KERNFORGE_TUNE=0``.  ``factory`` is the kernel's
    ``@T.tunable`` factory (default: the registry's), which fills in defaults so the key
    matches the one the sweep recorded.

    A sweep matches when its shape bucket holds every scalar of ``params`` at the same
    value.  Runtime sizes the sweep also recorded (``rows``, ``batch``, ``tokens``: the
    spec's sizes, not compile-time parameters) and ``params`` leaves out match any value:
    one compiled kernel serves every row count, so its tuned tiles do too.  Of several
    matching sweeps the most recently updated one with a timed row wins.

    ``pinned``: tunables the caller cannot change (a value another kernel already
    committed to); only rows holding those values count, the fastest of them wins."""
    if not enabled():
        return None
    # keyed on the variables that place the database, not on the resolved path: resolving it
    # reads the runtime's whole configuration, too slow for every op call
    env = os.environ
    memo_key = (env.get("KERNFORGE_TUNE_DB"), env.get("KERNFORGE_CACHE_DIR"), kernel_name, backend,
                tuple(sorted((k, repr(v)) for k, v in params.items())),
                tuple(sorted((k, repr(v)) for k, v in pinned.items())) if pinned else ())
    with _lock:
        if memo_key in _memo:
            return _memo[memo_key]
    from kernforge.tune.db import default_path

    found = _read(default_path(), kernel_name, backend, params, factory, pinned or {})
    with _lock:
        _memo[memo_key] = found
    return found


def _read(path: str, kernel_name: str, backend: str, params: dict, factory, pinned: dict) -> Optional[dict]:
    if not os.path.exists(path):
        return None
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10.0)
    except sqlite3.Error:
        return None
    try:
        if path not in _swept:
            try:
                _swept[path] = set(conn.execute("SELECT DISTINCT kernel, backend FROM sweeps").fetchall())
            except sqlite3.Error:  # not (yet) a tuning database
                _swept[path] = set()
        if (kernel_name, backend) not in _swept[path]:
            return None
        import kernforge
        from kernforge.tune import identity
        from kernforge.tune.db import canonical
        from kernforge.tune.keys import bind_params, shape_bucket

        if factory is None:
            from kernforge.kernels import registry

            factory = registry.get(kernel_name).factory
        factory = getattr(factory, "factory", factory)
        tunables = set(getattr(factory, "space", {}))
        bound = bind_params(factory, {k: v for k, v in params.items() if k not in tunables})
        want = json.loads(canonical(shape_bucket(bound, tunables)))  # JSON's spelling, as stored
        sweeps = conn.execute("SELECT key, bucket FROM sweeps WHERE kernel=? AND backend=? AND device=? AND "
                              "compiler=? AND version=? ORDER BY updated DESC",
                              (kernel_name, backend, identity.device(backend), identity.compiler(backend),
                               kernforge.__version__)).fetchall()
        for key, bucket in sweeps:
            have = json.loads(bucket)
            if any(k not in have or have[k] != v for k, v in want.items()):
                continue
            for (text,) in conn.execute("SELECT config FROM configs WHERE key=? AND status='timed' "
                                        "ORDER BY median_ms", (key,)):
                config = json.loads(text)
                if all(config.get(k) == v for k, v in pinned.items()):
                    return config
        return None
    finally:
        conn.close()


Kernel = Union[str, tuple, Callable[[dict], Union[str, tuple]]]


def overlay(kernel: Kernel, backend: str, heuristic: dict, keyed: Optional[dict] = None,
            valid: Optional[Callable[[dict], bool]] = None, pinned: tuple = ()) -> dict:
    """``heuristic`` (every parameter of one kernel factory, as a chooser returns them) with
    the tuning database's best tunables for the call laid over it, or ``heuristic`` itself
    when nothing matches, ``KERNFORGE_TUNE=0``, or ``valid`` refuses the result.

    ``kernel``: the registry name the sweeps were recorded under; a tuple of names sharing
    one factory (``topk_fp32``/``topk_bf16``: their buckets' dtypes tell them apart, the
    first with a match wins); or a function of ``heuristic`` giving either (one chooser
    serving two factories).  ``keyed``: call arguments that are not kernel parameters but
    are in the sweeps' keys (the layout ``alignment``), looked up with the parameters.
    ``valid(config)`` sees the overlaid configuration plus ``keyed`` and may refuse what
    the sweep verified on one workload but this call cannot take (a row tile spanning two
    experts).  ``pinned``: tunables whose heuristic value the call must keep (the MoE
    scatter's ``chunk``, fixed by the scan whose per-chunk offsets it reads): the fastest
    recorded row with those values is used.  Memoised per process on its arguments and
    the database's location."""
    try:
        memo_key = (kernel, backend, tuple(heuristic.items()), tuple(keyed.items()) if keyed else (), valid,
                    pinned, _settings())
        hit = _overlays.get(memo_key, _overlays)
    except TypeError:  # an unhashable parameter value: look it up every time
        memo_key, hit = None, _overlays
    if hit is _overlays:
        hit = _overlay(kernel, backend, heuristic, keyed or {}, valid, pinned) if enabled() else None
        if memo_key is not None:
            with _lock:
                _overlays[memo_key] = hit
    return heuristic if hit is None else dict(hit)


_SETTINGS = ("KERNFORGE_TUNE", "KERNFORGE_TUNE_DB", "KERNFORGE_CACHE_DIR")
_ENCODED = tuple(map(os.environ.encodekey, _SETTINGS)) if hasattr(os.environ, "encodekey") else None


def _settings() -> tuple:
    """The raw values of the variables that turn lookups off or place the database, for the
    memo key.  Read from ``os.environ``'s own store where CPython has one: ``os.environ.get``
    encodes the name and raises and catches a ``KeyError`` per unset variable, about 0.4 us
    each on every op call."""
    data = getattr(os.environ, "_data", None)
    if data is None or _ENCODED is None:
        return tuple(map(os.environ.get, _SETTINGS))
    return data.get(_ENCODED[0]), data.get(_ENCODED[1]), data.get(_ENCODED[2])


def stamp() -> tuple:
    """What an op's own cache of chooser results must key on to see what the choosers
    would see: the memo generation (:func:`reset` bumps it, and ``tune`` resets after
    recording) and the variables that turn lookups off or place the database.  For ops
    that skip the chooser on their hot path (``kernforge.ops.topk``): it adds about 0.4 us
    to their cache hit (``benchmarks/bench_choose_overhead.py``)."""
    data = getattr(os.environ, "_data", None)
    if data is None or _ENCODED is None:
        return (_generation,) + tuple(map(os.environ.get, _SETTINGS))
    return _generation, data.get(_ENCODED[0]), data.get(_ENCODED[1]), data.get(_ENCODED[2])


def _overlay(kernel: Kernel, backend: str, heuristic: dict, keyed: dict, valid, pinned: tuple) -> Optional[dict]:
    names = kernel(heuristic) if callable(kernel) else kernel
    for name in (names,) if isinstance(names, str) else names:
        found = lookup(name, backend, dict(heuristic, **keyed), pinned={k: heuristic[k] for k in pinned})
        if found is None:
            continue
        config = dict(heuristic, **found)
        return config if valid is None or valid(dict(config, **keyed)) else None
    return None


def tuned(kernel: Kernel, keys: tuple = (), valid: Optional[Callable[[dict], bool]] = None, pinned: tuple = ()):
    """Decorate a family's chooser ``choose(backend, ...) -> dict`` so that it consults the
    tuning database (:func:`overlay`): the chooser's own result is the heuristic, and
    ``keys`` names its arguments that go to the lookup as ``keyed``; ``pinned`` names its
    arguments that are tunables the caller fixes, returned as given (:func:`overlay`;
    the heuristic must return them unchanged).  The undecorated
    chooser stays reachable as ``.heuristic``: for choosers built on another's heuristic,
    and for the catalogue's problems, which must not move with the local database."""
    def wrap(choose):
        sig = inspect.signature(choose)
        names = list(sig.parameters)
        for what, given in (("keys", keys), ("pinned", pinned)):
            for k in given:
                if k not in names[1:]:
                    raise TypeError(f"{what}: {choose.__name__} has no argument {k!r} (its arguments: "
                                    f"{', '.join(names[1:])})")
        where = {k: (names.index(k) - 1, sig.parameters[k].default) for k in keys}  # index past ``backend``

        @functools.wraps(choose)
        def chooser(backend: str, *args, **kwargs) -> dict:
            keyed = {k: kwargs[k] if k in kwargs else args[i] if i < len(args) else default
                     for k, (i, default) in where.items()} if where else None
            return overlay(kernel, backend, choose(backend, *args, **kwargs), keyed, valid, pinned)

        chooser.heuristic = choose
        chooser.pinned = pinned
        return chooser

    return wrap
