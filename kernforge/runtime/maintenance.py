"""Cache upkeep behind ``kernforge cache ls|stats|verify|clear|gc``.

Only the first (writable) root is ever modified.  Entries are removed by
renaming them into ``tmp/`` first, so a reader sees a whole entry or none.
``gc`` also deletes build directories left by killed processes: those of a
dead pid on this host at once, any other once older than ``tmp_age_s``.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass

from . import manifest as manifest_io
from .hashing import StatCache
from .publish import quarantine, remove_tree


@dataclass
class EntryInfo:
    root: str
    path: str
    tag: str
    key: str
    backend: str
    size: int
    last_used: float
    compile_time_s: float
    problem: str | None  # None when committed and intact


def tree_size(path: str) -> int:
    total = 0
    for dirpath, _, filenames in os.walk(path):
        for name in filenames:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except FileNotFoundError:
                pass
    return total


def entries(root: str, check: bool = False) -> list[EntryInfo]:
    """Committed (and corrupt) entries of one root; uncommitted dirs are skipped."""
    found = []
    cache = os.path.join(root, "cache")
    stats = StatCache()
    for group in sorted(_listdir(cache)):
        tag = group.split(".", 1)[0]
        for key in sorted(_listdir(os.path.join(cache, group))):
            path = os.path.join(cache, group, key)
            problem = None
            try:
                manifest = manifest_io.read(path)
            except manifest_io.ManifestError as exc:
                manifest, problem = {}, str(exc)
            if manifest is None:
                continue
            if check and problem is None:
                problem = manifest_io.check_files(path, manifest, stats)
            found.append(EntryInfo(root, path, tag, key, manifest.get("backend", "?"), tree_size(path),
                                   _mtime(path), manifest.get("compile_time_s", 0.0), problem))
    return found


def disk_stats(root: str) -> dict:
    listed = entries(root)
    counters: dict[str, float] = {}
    try:
        with open(os.path.join(root, "stats.jsonl")) as f:
            for line in f:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue  # a line cut short by a full disk; skip it
                for name in ("memory_hits", "disk_hits", "misses", "compiles", "compile_time_s"):
                    counters[name] = counters.get(name, 0) + record.get(name, 0)
    except FileNotFoundError:
        pass
    return {
        "root": root,
        "entries": len(listed),
        "bytes": sum(e.size for e in listed),
        "build_dirs": len(_listdir(os.path.join(root, "tmp"))),
        "recorded_compile_time_s": sum(e.compile_time_s for e in listed),
        "counters": counters,
    }


def clear(root: str) -> int:
    """Remove every entry and build dir of ``root``; returns entries removed."""
    removed = 0
    cache = os.path.join(root, "cache")
    for group in _listdir(cache):
        for key in _listdir(os.path.join(cache, group)):
            quarantine(os.path.join(cache, group, key), root)
            removed += 1
        _rmdir_if_empty(os.path.join(cache, group))
    for name in _listdir(os.path.join(root, "tmp")):
        remove_tree(os.path.join(root, "tmp", name))
    return removed


def gc(root: str, max_bytes: int, tmp_age_s: float = 86400.0) -> dict:
    """Drop dead build dirs, corrupt entries, then least recently used entries over the cap."""
    now = time.time()
    stale = 0
    for name in _listdir(os.path.join(root, "tmp")):
        path = os.path.join(root, "tmp", name)
        if _dead_build_dir(name) or now - _mtime(path) > tmp_age_s:
            remove_tree(path)
            stale += 1
    listed = entries(root, check=True)
    corrupt = [e for e in listed if e.problem is not None]
    for entry in corrupt:
        quarantine(entry.path, root)
    alive = sorted((e for e in listed if e.problem is None), key=lambda e: e.last_used)
    total = sum(e.size for e in alive)
    evicted = 0
    while alive and total > max_bytes:
        victim = alive.pop(0)
        quarantine(victim.path, root)
        total -= victim.size
        evicted += 1
    cache = os.path.join(root, "cache")
    for group in _listdir(cache):
        _rmdir_if_empty(os.path.join(cache, group))
    return {"removed_build_dirs": stale, "removed_corrupt": len(corrupt), "evicted": evicted, "bytes": total}


def _dead_build_dir(name: str) -> bool:
    """A build dir named ``<host>-<pid>-<hex>`` of this host whose pid is gone."""
    parts = name.rsplit("-", 2)
    if len(parts) != 3 or parts[0] != socket.gethostname() or not parts[1].isdigit():
        return False
    try:
        os.kill(int(parts[1]), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except FileNotFoundError:
        return 0.0


def _rmdir_if_empty(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass  # not empty (a publish just landed) or already gone: both fine
