"""The tuning database: one SQLite file in WAL mode, safe for several tuners at once.

Two tables.  ``sweeps`` has one row per key (kernel, shape bucket, dtype, backend, device,
compiler, kernforge version: see :class:`Key`) saying what space was swept and whether the
sweep finished.  ``configs`` has one row per configuration tried under a key, written the
moment that configuration is done (timed, rejected, or pruned by successive halving), each
in its own short transaction: a sweep killed at any point keeps every row already written,
and the next sweep of the key skips them.  WAL lets readers (the ops' lookups) proceed
while a tuner writes; writers queue on SQLite's lock with a generous busy timeout.
"""
from __future__ import annotations

import json
import os
import sqlite3
import time
from dataclasses import dataclass
from typing import Iterator, Optional

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sweeps (
    key TEXT PRIMARY KEY, kernel TEXT NOT NULL, bucket TEXT NOT NULL, dtype TEXT NOT NULL,
    backend TEXT NOT NULL, device TEXT NOT NULL, compiler TEXT NOT NULL, version TEXT NOT NULL,
    space TEXT NOT NULL, strategy TEXT NOT NULL, workload TEXT NOT NULL,
    complete INTEGER NOT NULL DEFAULT 0, updated REAL NOT NULL);
CREATE TABLE IF NOT EXISTS configs (
    key TEXT NOT NULL, config TEXT NOT NULL, status TEXT NOT NULL, median_ms REAL,
    spread REAL, samples INTEGER, reason TEXT NOT NULL DEFAULT '', updated REAL NOT NULL,
    PRIMARY KEY (key, config));
"""
STATUSES = ("timed", "pruned", "rejected")
_COLUMNS = {"sweeps": ("key", "kernel", "bucket", "dtype", "backend", "device", "compiler", "version", "space",
                       "strategy", "workload", "complete", "updated"),
            "configs": ("key", "config", "status", "median_ms", "spread", "samples", "reason", "updated")}
_FORMAT = "kernforge-tune-db/1"  # the --export file's format tag


def canonical(value) -> str:
    """The one JSON spelling of a dict (sorted keys, no spaces): equal dicts, equal text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def default_path() -> str:
    """``KERNFORGE_TUNE_DB`` if set, else ``tune.sqlite`` in the first JIT cache root (beside
    the runtime's ``cache/`` and ``tmp/``, which ``kernforge cache`` maintenance walks; the
    database is never swept with them)."""
    path = os.environ.get("KERNFORGE_TUNE_DB")
    if path is not None:
        if not path.strip():
            raise ValueError("KERNFORGE_TUNE_DB is set but empty")
        return os.path.expanduser(path)
    from kernforge.runtime.config import Config

    return os.path.join(Config.from_env().cache_dirs[0], "tune.sqlite")


@dataclass(frozen=True)
class Key:
    """What a tuning result is valid for.  ``bucket`` is the problem's shape bucket: the exact
    value of every scalar parameter that is not tuned (compile-time sizes, dtypes, the layout
    alignment), factory defaults filled in; list-valued workload sizes (rows per expert)
    only shape the timing runs and are stored with the sweep, not in the key."""

    kernel: str
    bucket: str  # canonical JSON
    dtype: str
    backend: str
    device: str
    compiler: str
    version: str

    @property
    def text(self) -> str:
        return canonical([self.kernel, json.loads(self.bucket), self.dtype, self.backend, self.device,
                          self.compiler, self.version])


@dataclass
class Row:
    """One configuration's record."""

    config: dict
    status: str  # timed | pruned | rejected
    median_ms: Optional[float] = None
    spread: Optional[float] = None  # interquartile range / median
    samples: int = 0
    reason: str = ""

    def to_json(self) -> dict:
        return dict(config=self.config, status=self.status, median_ms=self.median_ms, spread=self.spread,
                    samples=self.samples, reason=self.reason)


class Database:
    """A connection to one tuning database file (created on first use)."""

    def __init__(self, path: Optional[str] = None):
        self.path = path or default_path()
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        self._conn = sqlite3.connect(self.path, timeout=60.0, isolation_level=None)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.executescript(_SCHEMA)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _write(self, sql: str, args: tuple) -> None:
        with self._conn:  # BEGIN ... COMMIT: one row, one transaction
            self._conn.execute("BEGIN IMMEDIATE")
            self._conn.execute(sql, args)

    # ------------------------------------------------------------ sweeps

    def begin_sweep(self, key: Key, space: dict, strategy: str, workload: dict, force: bool) -> None:
        """Create or refresh ``key``'s sweep row (not complete); ``force`` drops its configs."""
        with self._conn:
            self._conn.execute("BEGIN IMMEDIATE")
            if force:
                self._conn.execute("DELETE FROM configs WHERE key=?", (key.text,))
            self._conn.execute(
                "INSERT INTO sweeps VALUES (?,?,?,?,?,?,?,?,?,?,?,0,?) ON CONFLICT(key) DO UPDATE SET "
                "space=excluded.space, strategy=excluded.strategy, workload=excluded.workload, complete=0, "
                "updated=excluded.updated",
                (key.text, key.kernel, key.bucket, key.dtype, key.backend, key.device, key.compiler, key.version,
                 canonical(space), strategy, canonical(workload), time.time()))

    def finish_sweep(self, key: Key) -> None:
        self._write("UPDATE sweeps SET complete=1, updated=? WHERE key=?", (time.time(), key.text))

    def sweep(self, key: Key) -> Optional[dict]:
        """``key``'s sweep row as a dict (space and workload decoded), or None."""
        cur = self._conn.execute("SELECT * FROM sweeps WHERE key=?", (key.text,))
        row = cur.fetchone()
        if row is None:
            return None
        out = dict(zip([d[0] for d in cur.description], row))
        out.update(space=json.loads(out["space"]), workload=json.loads(out["workload"]),
                   bucket=json.loads(out["bucket"]), complete=bool(out["complete"]))
        return out

    # ------------------------------------------------------------ configurations

    def record(self, key: Key, row: Row) -> None:
        if row.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {row.status!r}")
        self._write("INSERT OR REPLACE INTO configs VALUES (?,?,?,?,?,?,?,?)",
                    (key.text, canonical(row.config), row.status, row.median_ms, row.spread, row.samples,
                     row.reason, time.time()))

    def rows(self, key: Key) -> list[Row]:
        cur = self._conn.execute("SELECT config, status, median_ms, spread, samples, reason FROM configs "
                                 "WHERE key=?", (key.text,))
        return [Row(json.loads(c), s, m, sp, n or 0, r) for c, s, m, sp, n, r in cur.fetchall()]

    def best(self, key_text: str) -> Optional[dict]:
        """The fastest fully timed configuration recorded under the key spelled ``key_text``."""
        found = self._conn.execute("SELECT config FROM configs WHERE key=? AND status='timed' "
                                   "ORDER BY median_ms LIMIT 1", (key_text,)).fetchone()
        return json.loads(found[0]) if found else None

    def entries(self, kernel: Optional[str] = None) -> Iterator[dict]:
        """Every sweep (of ``kernel``, if given) with its best configuration and counts."""
        sql = "SELECT key FROM sweeps" + (" WHERE kernel=?" if kernel else "") + " ORDER BY kernel, updated"
        for (text,) in self._conn.execute(sql, (kernel,) if kernel else ()).fetchall():
            s = self._sweep_by_text(text)
            counts = dict(self._conn.execute("SELECT status, COUNT(*) FROM configs WHERE key=? GROUP BY status",
                                             (text,)).fetchall())
            best = self._conn.execute("SELECT config, median_ms FROM configs WHERE key=? AND status='timed' "
                                      "ORDER BY median_ms LIMIT 1", (text,)).fetchone()
            s.update(counts={k: counts.get(k, 0) for k in STATUSES},
                     best=json.loads(best[0]) if best else None, best_ms=best[1] if best else None)
            yield s

    def _sweep_by_text(self, text: str) -> dict:
        cur = self._conn.execute("SELECT * FROM sweeps WHERE key=?", (text,))
        out = dict(zip([d[0] for d in cur.description], cur.fetchone()))
        out.update(space=json.loads(out["space"]), workload=json.loads(out["workload"]),
                   bucket=json.loads(out["bucket"]), complete=bool(out["complete"]))
        return out

    # ------------------------------------------------------------ moving between machines

    def export(self, path: str) -> int:
        """Write every sweep and configuration to ``path`` as JSON; returns the sweep count."""
        sweeps = [dict(zip([d[0] for d in c.description], r))
                  for c in [self._conn.execute("SELECT * FROM sweeps")] for r in c.fetchall()]
        cur = self._conn.execute("SELECT * FROM configs")
        configs = [dict(zip([d[0] for d in cur.description], r)) for r in cur.fetchall()]
        with open(path, "w") as f:
            json.dump({"format": _FORMAT, "sweeps": sweeps, "configs": configs}, f, indent=1)
        return len(sweeps)

    def import_(self, path: str) -> int:
        """Merge an :meth:`export` file: its rows replace the ones with the same key (and
        configuration), the rest are kept.  Returns the sweep count read."""
        with open(path) as f:
            try:
                data = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: not a tuning database export ({e})") from None
        if not isinstance(data, dict) or data.get("format") != _FORMAT:
            raise ValueError(f"{path}: not a tuning database export (format must be {_FORMAT!r})")
        with self._conn:
            self._conn.execute("BEGIN IMMEDIATE")
            for table in ("sweeps", "configs"):
                for r in data.get(table, []):
                    cols = list(_COLUMNS[table])
                    if not isinstance(r, dict) or set(r) != set(cols):
                        raise ValueError(f"{path}: a {table} row must have exactly the columns {', '.join(cols)}")
                    self._conn.execute(f"INSERT OR REPLACE INTO {table} ({','.join(cols)}) "
                                       f"VALUES ({','.join('?' * len(cols))})", [r[c] for c in cols])
        return len(data.get("sweeps", []))
