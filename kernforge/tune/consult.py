"""What the ops ask the tuning database: "is there a tuned configuration for this call?".

Called from a family's configuration chooser on every op call, so it is memoised per
process: the first call per (kernel, backend, parameters) opens the database read-only,
and only computes the device and compiler identity if some sweep of that kernel on that
backend exists at all (a process that never tuned pays one ``stat`` of the file).
:func:`reset` forgets everything (``tune`` calls it after recording).  ``KERNFORGE_TUNE=0``
turns lookups off.
"""
from __future__ import annotations

import json
import os
import sqlite3
import threading
from typing import Optional

_memo: dict = {}
_swept: dict = {}  # db path -> {(kernel, backend)} with at least one sweep
_lock = threading.Lock()


def enabled() -> bool:
    return os.environ.get("KERNFORGE_TUNE", "1").strip().lower() not in ("0", "false", "no", "off")


def reset() -> None:
    """Forget memoised lookups (after the database changed in this process)."""
    with _lock:
        _memo.clear()
        _swept.clear()


def lookup(kernel_name: str, backend: str, params: dict, factory=None) -> Optional[dict]:
    """The fastest recorded configuration (every tunable of the kernel, as keyword
    parameters) for ``kernel_name`` on ``backend`` at ``params`` (its non-tuned parameters;
    tunables in it are ignored), on this device with this compiler and kernforge version;
    None if there is none or ``KERNFORGE_TUNE=0``.  ``factory`` is the kernel's
    ``@T.tunable`` factory (default: the registry's), which fills in defaults so the key
    matches the one the sweep recorded."""
    if not enabled():
        return None
    # keyed on the variables that place the database, not on the resolved path: resolving it
    # reads the runtime's whole configuration, too slow for every op call
    env = os.environ
    memo_key = (env.get("KERNFORGE_TUNE_DB"), env.get("KERNFORGE_CACHE_DIR"), kernel_name, backend,
                tuple(sorted((k, repr(v)) for k, v in params.items())))
    with _lock:
        if memo_key in _memo:
            return _memo[memo_key]
    from kernforge.tune.db import default_path

    found = _read(default_path(), kernel_name, backend, params, factory)
    with _lock:
        _memo[memo_key] = found
    return found


def _read(path: str, kernel_name: str, backend: str, params: dict, factory) -> Optional[dict]:
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
        from kernforge.tune.sweep import bind_params, make_key

        if factory is None:
            from kernforge.kernels import registry

            factory = registry.get(kernel_name).factory
        factory = getattr(factory, "factory", factory)
        tunables = set(getattr(factory, "space", {}))
        bound = bind_params(factory, {k: v for k, v in params.items() if k not in tunables})
        key = make_key(kernel_name, backend, bound, tunables)
        row = conn.execute("SELECT config FROM configs WHERE key=? AND status='timed' ORDER BY median_ms LIMIT 1",
                           (key.text,)).fetchone()
        return json.loads(row[0]) if row else None
    finally:
        conn.close()
