"""On-disk cache tiers: layout, lookup across roots, and why a lookup missed.

Layout of each root (``KERNFORGE_CACHE_DIR`` is a colon list of roots)::

    <root>/cache/<tag>.<prekey>/<key>/   committed entry: source, binary,
                                         build.log, meta.json (written last)
    <root>/tmp/<host>-<pid>-<hex>/       private build directories
    <root>/locks/<prekey>.lock           per-prekey build locks
    <root>/stats.jsonl                   per-process counters, appended at exit

The pre-key (source, options, compiler identity, signature) names a group; the
group holds one entry per distinct include closure, and the entry name is the
full key (pre-key + closure contents).  A lookup reads each variant's manifest
(cached per process by stat signature) and validates its closure, so a header
that changed never reuses a stale binary, and switching back to an earlier
header version hits the earlier entry.

All roots are searched in order; only the first is ever written, so a
read-only shared cache can sit behind a private writable one.
"""

from __future__ import annotations

import glob
import os
import threading
from dataclasses import dataclass

from . import manifest as manifest_io
from .closure import Anchors, check_closure
from .hashing import StatCache


def group_dir(root: str, tag: str, prekey: str) -> str:
    return os.path.join(root, "cache", f"{tag}.{prekey}")


def lock_path(root: str, prekey: str) -> str:
    return os.path.join(root, "locks", f"{prekey}.lock")


@dataclass
class Entry:
    root: str
    path: str
    manifest: dict


@dataclass
class Lookup:
    entry: Entry | None
    rejected: list[str]  # why variants that exist were not usable
    corrupt: list[Entry]  # committed entries whose files fail their checksums


class ManifestCache:
    """Parsed manifests keyed by path and the manifest file's stat signature."""

    def __init__(self):
        self._entries: dict[str, tuple[tuple, dict]] = {}
        self._lock = threading.Lock()

    def read(self, entry_dir: str) -> dict | None:
        path = os.path.join(entry_dir, manifest_io.MANIFEST_NAME)
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        sig = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        cached = self._entries.get(path)
        if cached is not None and cached[0] == sig:
            return cached[1]
        parsed = manifest_io.read(entry_dir)
        if parsed is not None:
            with self._lock:
                self._entries[path] = (sig, parsed)
        return parsed


def find(roots, tag: str, prekey: str, anchors: Anchors, stats: StatCache, manifests: ManifestCache) -> Lookup:
    rejected, corrupt = [], []
    for root in roots:
        group = group_dir(root, tag, prekey)
        try:
            variants = sorted(os.listdir(group))
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as exc:
            rejected.append(f"cannot list {group}: {exc}")
            continue
        for name in variants:
            path = os.path.join(group, name)
            try:
                manifest = manifests.read(path)
            except manifest_io.ManifestError as exc:
                corrupt.append(Entry(root, path, {"error": str(exc)}))
                continue
            if manifest is None:
                continue  # uncommitted leftovers are ignored and left alone
            if manifest["prekey"] != prekey:
                corrupt.append(Entry(root, path, {"error": f"{path}: manifest is for another key"}))
                continue
            reason = check_closure(manifest["closure"], anchors, stats)
            if reason is not None:
                rejected.append(reason)
                continue
            problem = manifest_io.check_files(path, manifest, stats)
            if problem is not None:
                corrupt.append(Entry(root, path, dict(manifest, error=f"{path}: {problem}")))
                continue
            return Lookup(Entry(root, path, manifest), rejected, corrupt)
    return Lookup(None, rejected, corrupt)


def touch(entry: Entry, writable_root: str) -> None:
    """Record use for LRU ``gc``, only in the writable root; never fails a hit."""
    if entry.root != writable_root:
        return
    try:
        os.utime(entry.path)
    except OSError:
        pass


def explain_miss(roots, tag: str, inputs: dict, lookup: Lookup) -> str:
    """Say which part of the key changed since the newest entry with this tag."""
    if lookup.rejected:
        return "; ".join(dict.fromkeys(lookup.rejected))
    if lookup.corrupt:
        return "corrupt entry: " + lookup.corrupt[0].manifest["error"]
    newest, newest_time = None, -1.0
    for root in roots:
        for group in glob.glob(os.path.join(glob.escape(os.path.join(root, "cache")), f"{glob.escape(tag)}.*")):
            for entry_dir in glob.glob(os.path.join(glob.escape(group), "*")):
                try:
                    manifest = manifest_io.read(entry_dir)
                except manifest_io.ManifestError:
                    continue
                if manifest is not None and manifest.get("created", 0) > newest_time:
                    newest, newest_time = manifest, manifest.get("created", 0)
    if newest is None:
        return f"no entry for tag {tag!r} yet"
    changed = diff_inputs(newest["inputs"], inputs)
    return "changed since the last entry of this tag: " + ", ".join(changed) if changed else "no matching entry"


def diff_inputs(old: dict, new: dict, prefix: str = "") -> list[str]:
    parts = []
    for name in sorted(set(old) | set(new)):
        a, b = old.get(name), new.get(name)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            parts += diff_inputs(a, b, f"{prefix}{name}.")
        else:
            parts.append(f"{prefix}{name} ({_short(a)} -> {_short(b)})")
    return parts


def _short(value) -> str:
    text = " ".join(value) if isinstance(value, list) else str(value)
    text = text.replace("\n", " ")
    return text if len(text) <= 60 else text[:57] + "..."
