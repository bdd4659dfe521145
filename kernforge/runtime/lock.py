"""Per-key build lock: processes compiling one key compile it once.

``flock`` is released by the kernel when its holder exits for any reason,
SIGKILL included, so a dead holder never wedges the cache and no stale-lock
heuristics (pid files, ages) are needed.  Lock files are never deleted while
the cache is in use: unlinking a lock file lets a second process lock a fresh
inode while the first still holds the old one.  The holder writes its host
and pid into the file so that a timeout can say who held it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import time

from .errors import CacheError, LockTimeoutError


class BuildLock:
    def __init__(self, path: str, timeout_s: float):
        self.path = path
        self.timeout_s = timeout_s
        self.waited_s = 0.0
        self._fd: int | None = None

    def __enter__(self) -> "BuildLock":
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as exc:
            raise CacheError(f"cannot create build lock {self.path}: {exc}") from exc
        start = time.monotonic()
        delay = 0.002
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    os.close(fd)
                    raise CacheError(f"cannot lock {self.path}: {exc}") from exc
            if time.monotonic() - start > self.timeout_s:
                holder = _read_holder(fd)
                os.close(fd)
                raise LockTimeoutError(
                    f"timed out after {self.timeout_s:.0f}s waiting for build lock {self.path} held by {holder}"
                    " (raise KERNFORGE_JIT_LOCK_TIMEOUT if compiles are this slow)"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.1)
        self.waited_s = time.monotonic() - start
        self._fd = fd
        holder = f"{socket.gethostname()} pid {os.getpid()}\n".encode()
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, holder, 0)
        except OSError:
            pass  # the holder note is diagnostics only; the flock is what excludes
        return self

    def __exit__(self, *exc_info) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def _read_holder(fd: int) -> str:
    try:
        text = os.pread(fd, 256, 0).decode(errors="replace").strip()
    except OSError:
        text = ""
    return text or "an unknown process"
