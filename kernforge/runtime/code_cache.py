"""Content-keyed disk cache for the Python code that turning a kernel into source compiles.

A fresh process that traces and renders its first kernel parsed and compiled the rewritten
kernel function (:mod:`kernforge.dsl.rewrite`) and every Jinja template it renders through
(:mod:`kernforge.backends.templates`), every time: for TopK, two thirds of its first trace and
most of its first template load.  Both are pure functions of their text, so their compiled code
objects are kept here, beside the JIT cache, as ``.pyc`` files keep a module's::

    <root>/codegen/<kind>/<key>.bin     MAGIC, sha256(payload), payload (marshal of a code object)

* **Content-keyed.**  ``key`` hashes everything the code depends on (the source text, the
  producer's own version, the interpreter's bytecode magic), so an edit is a new entry, never a
  stale hit, and two processes that race write the same bytes (temp file, then ``os.replace``).
* **Tiers as the JIT cache's.**  The roots are the runtime's ``KERNFORGE_CACHE_DIR`` list: all
  are read in order, only the first is written, and a hit in a later (read-only, shared) root
  writes nothing.  A root that cannot be written (read-only, full) costs the write, not the render.
* **Never trusted blindly.**  An entry whose digest, magic or unmarshalling fails is a miss
  (and the first root's copy is overwritten by the recompiled code).

The digest guards against torn and corrupted files, not against someone who can write the
cache: a cache root is trusted as the JIT binaries it holds are.  Entries are small (tens of KB
each, one per kernel function and template); ``kernforge cache`` walks only ``cache/`` and
``tmp/``, and deleting ``<root>/codegen`` is always safe.
"""
from __future__ import annotations

import hashlib
import importlib.util
import marshal
import os
import types
from typing import Optional

MAGIC = b"KFCODE1\n"
_DIGEST = 32  # sha256


def key(*parts) -> str:
    """A hex key over ``parts`` (str or bytes), framed so that no two part lists collide; the
    interpreter's bytecode magic is always one of them (marshal's format follows it)."""
    h = hashlib.sha256()
    for part in (importlib.util.MAGIC_NUMBER, *parts):
        data = part if isinstance(part, bytes) else str(part).encode("utf-8", "surrogatepass")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def roots() -> tuple[str, ...]:
    """The cache roots (``KERNFORGE_CACHE_DIR``): the default runtime's when it exists, else read
    from the environment *without* creating it (kernel modules trace, so reach here, at import
    time; a process that sets ``KERNFORGE_CACHE_DIR`` after its imports, as the pack builder's
    and the tuner's workers do, must still get its runtime from that setting); none when
    misconfigured: the code cache is an optimisation, so source generation goes on without it
    (building reports the configuration error)."""
    from . import runtime as _runtime
    from .config import _cache_dirs
    from .errors import ConfigError

    made = _runtime._default
    if made is not None:
        return made.config.cache_dirs
    try:
        return _cache_dirs(os.environ)
    except ConfigError:
        return ()


def _path(root: str, kind: str, key_: str) -> str:
    return os.path.join(root, "codegen", kind, key_ + ".bin")


def load(kind: str, key_: str) -> Optional[bytes]:
    """The payload stored under ``kind``/``key_`` in the first root holding a valid entry."""
    for root in roots():
        try:
            with open(_path(root, kind, key_), "rb") as f:
                blob = f.read()
        except OSError:
            continue
        head, digest, payload = blob[:len(MAGIC)], blob[len(MAGIC):len(MAGIC) + _DIGEST], blob[len(MAGIC) + _DIGEST:]
        if head == MAGIC and hashlib.sha256(payload).digest() == digest:
            return payload
    return None


def store(kind: str, key_: str, payload: bytes) -> bool:
    """Publish ``payload`` in the first root (atomically); False where that root refuses."""
    rs = roots()
    if not rs:
        return False
    final = _path(rs[0], kind, key_)
    tmp = f"{final}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    try:
        os.makedirs(os.path.dirname(final), exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(MAGIC + hashlib.sha256(payload).digest() + payload)
        os.replace(tmp, final)
        return True
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return False


def load_code(kind: str, key_: str) -> Optional[types.CodeType]:
    """A code object stored by :func:`store_code`, or None (absent, or not a code object)."""
    payload = load(kind, key_)
    if payload is None:
        return None
    try:
        code = marshal.loads(payload)
    except (EOFError, ValueError, TypeError):
        return None
    return code if isinstance(code, types.CodeType) else None


def store_code(kind: str, key_: str, code: types.CodeType) -> bool:
    return store(kind, key_, marshal.dumps(code))
