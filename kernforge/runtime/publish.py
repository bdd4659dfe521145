"""Build directories and atomic publication of whole entries.

An entry is built in ``<root>/tmp/<host>-<pid>-<hex>``, every file and the
directory are fsynced, and the directory is renamed into
``<root>/cache/<tag>.<prekey>/<key>`` in one ``rename``.  Readers therefore
see either nothing or a complete entry; never one writer's binary next to
another's metadata (Triton PR #11319).  When the rename loses a race, the
winner's committed entry is reused; on a network filesystem the winner's
manifest may become visible a little later (DeepEP #683), so the loser waits
briefly for it before giving up.
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import sys
import time
import uuid

from . import manifest as manifest_io
from .errors import CacheError, PublishError


def new_build_dir(root: str) -> str:
    tmp_root = os.path.join(root, "tmp")
    path = os.path.join(tmp_root, f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:16]}")
    try:
        os.makedirs(tmp_root, exist_ok=True)
        os.mkdir(path)
    except OSError as exc:
        raise CacheError(
            f"cache directory {root} is not writable ({exc.strerror or exc}); "
            "put a writable directory first in KERNFORGE_CACHE_DIR"
        ) from exc
    return path


def fsync_tree(path: str) -> None:
    """fsync every file, then every directory bottom-up, then ``path``."""
    for dirpath, dirnames, filenames in os.walk(path, topdown=False):
        for name in filenames:
            full = os.path.join(dirpath, name)
            if os.path.islink(full):
                continue
            fd = os.open(full, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(dirpath)


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_tree(path: str) -> None:
    """Delete a tree without following symlinks; a concurrent delete is fine."""
    if os.path.islink(path):
        os.unlink(path)
        return

    def on_error(func, target, exc):
        if not isinstance(exc, FileNotFoundError):
            raise exc

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=on_error)
    else:
        shutil.rmtree(path, onerror=lambda func, target, info: on_error(func, target, info[1]))


def publish(tmp: str, final: str, visibility_wait_s: float = 2.0) -> bool:
    """Rename ``tmp`` to ``final``. True when ours won, False when we reuse a winner's."""
    for _ in range(3):
        try:
            os.makedirs(os.path.dirname(final), exist_ok=True)
            os.rename(tmp, final)
        except FileNotFoundError:
            # `gc` removed the empty group directory between makedirs and
            # rename: make it again.
            continue
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise PublishError(f"failed to publish cache entry {tmp} -> {final}: {exc}") from exc
            if _wait_committed(final, visibility_wait_s):
                remove_tree(tmp)
                return False
            raise PublishError(
                f"failed to publish cache entry {tmp} -> {final}: destination exists but is not committed"
            ) from exc
        fsync_dir(os.path.dirname(final))
        return True
    raise PublishError(f"failed to publish cache entry {tmp} -> {final}: its parent keeps disappearing")


def _wait_committed(final: str, wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            if manifest_io.read(final) is not None:
                return True
        except manifest_io.ManifestError:
            return False
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def quarantine(entry_dir: str, root: str) -> None:
    """Atomically take a corrupt entry out of readers' view, then delete it."""
    target = os.path.join(root, "tmp", f"corrupt-{uuid.uuid4().hex[:16]}")
    os.makedirs(os.path.dirname(target), exist_ok=True)
    try:
        os.rename(entry_dir, target)
    except FileNotFoundError:
        return  # someone else already removed it
    remove_tree(target)
