"""Content digests and canonical JSON, the only hashing the cache uses.

Keys are hashes of sorted, compact JSON (never ``repr`` of objects, never
mtimes), so the same inputs give the same key in every process and on every
machine.  :class:`StatCache` remembers a file's digest next to its stat
signature so that validating a manifest on every lookup costs one ``stat`` per
file instead of one read.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading

DIGEST_SIZE = 16  # 32 hex characters, as DeepJIT's keys


def digest_bytes(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=DIGEST_SIZE).hexdigest()


def digest_file(path: str) -> str:
    hasher = hashlib.blake2b(digest_size=DIGEST_SIZE)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            hasher.update(block)
    return hasher.hexdigest()


def canonical_json(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def digest_json(value) -> str:
    return digest_bytes(canonical_json(value).encode())


def _signature(st: os.stat_result) -> tuple:
    # ctime changes on every write/rename/chmod, so a file rewritten within the
    # same mtime tick with the same size is still caught unless ctime also ties.
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class StatCache:
    """Path -> (stat signature, content digest); thread-safe."""

    def __init__(self):
        self._entries: dict[str, tuple[tuple, str]] = {}
        self._lock = threading.Lock()

    def digest(self, path: str) -> str | None:
        """Content digest of ``path``, or None when it does not exist."""
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        sig = _signature(st)
        cached = self._entries.get(path)
        if cached is not None and cached[0] == sig:
            return cached[1]
        value = digest_file(path)
        # Re-stat: a file written while we read it must not be cached under
        # the old signature.
        if _signature(os.stat(path)) == sig:
            with self._lock:
                self._entries[path] = (sig, value)
        return value
