"""``meta.json``: the manifest of a cache entry and its single commit point.

It is written last into the private build directory, after every artifact,
and lists each artifact with its content digest.  An entry directory without
a readable manifest is uncommitted and ignored; an entry whose files do not
match their digests is corrupt (truncated disk, bit rot, a bad copy) and is
reported and rebuilt instead of being loaded.
"""

from __future__ import annotations

import json
import os

from .hashing import StatCache, canonical_json

FORMAT = 1
MANIFEST_NAME = "meta.json"
REQUIRED = ("format", "tag", "prekey", "key", "backend", "inputs", "closure", "files", "binary", "command")


class ManifestError(ValueError):
    """The manifest is missing fields or not valid JSON (a corrupt entry)."""


def write(entry_dir: str, manifest: dict) -> None:
    path = os.path.join(entry_dir, MANIFEST_NAME)
    data = canonical_json(manifest).encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def read(entry_dir: str) -> dict | None:
    """The parsed manifest, None when the entry is uncommitted (no manifest)."""
    path = os.path.join(entry_dir, MANIFEST_NAME)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        manifest = json.loads(raw)
    except ValueError as exc:
        raise ManifestError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(manifest, dict):
        raise ManifestError(f"{path}: not a JSON object")
    missing = [k for k in REQUIRED if k not in manifest]
    if missing:
        raise ManifestError(f"{path}: missing fields {missing}")
    if manifest["format"] != FORMAT:
        raise ManifestError(f"{path}: format {manifest['format']} is not {FORMAT}")
    return manifest


def check_files(entry_dir: str, manifest: dict, stats: StatCache) -> str | None:
    """None when every listed artifact has its recorded digest, else the problem."""
    for name, expected in sorted(manifest["files"].items()):
        path = os.path.join(entry_dir, name)
        actual = stats.digest(path)
        if actual is None:
            return f"{name} is missing"
        if actual != expected:
            return f"{name} does not match its checksum"
    return None
