"""The lifecycle of one compile request: memory, disk, lock, disk, build, load.

``Runtime.compile`` is the flow the rest of kernforge uses::

    pre-key -> memory tier (closure re-checked) -> disk tiers (manifests
    validated) -> per-key file lock -> disk tiers again (another process may
    have built it while we waited) -> build in a private dir -> publish -> load

Threads of one process asking for one key wait on a per-key lock, so a key
is compiled once per process; the file lock makes it once per cache.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import socket
import sys
import threading
import time
import warnings
from dataclasses import asdict, dataclass

from . import manifest as manifest_io
from .cache import Entry, ManifestCache, explain_miss, find, group_dir, lock_path, touch
from .closure import Anchors, ChangedDuringCompile, ClosureWatch, build_closure
from .config import Config
from .errors import CacheError, CompileError, ConfigError, LoadError
from .hashing import StatCache, digest_bytes, digest_file, digest_json
from .lock import BuildLock
from .module import CompileResult, CpuModule, Module
from .publish import fsync_tree, new_build_dir, publish, quarantine, remove_tree

BACKENDS = ("cpu", "cuda", "ascend")
_TAG = re.compile(r"[A-Za-z0-9_]+")


class CacheCorruptionWarning(RuntimeWarning):
    """A committed entry failed its checksum; it is being rebuilt."""


@dataclass
class Counters:
    memory_hits: int = 0
    disk_hits: int = 0
    misses: int = 0
    compiles: int = 0
    compile_time_s: float = 0.0
    lock_wait_s: float = 0.0
    races_lost: int = 0
    corrupt_entries: int = 0


@dataclass(frozen=True)
class Request:
    tag: str
    source: str
    backend: str
    options: tuple[str, ...]
    include_dirs: tuple[str, ...]
    inputs: dict
    prekey: str
    anchors: Anchors


class Runtime:
    def __init__(self, config: Config | None = None):
        self.config = config or Config.from_env()
        self.counters = Counters()
        self.stats = StatCache()
        self.manifests = ManifestCache()
        self._compilers: dict[str, object] = {}
        self._requests: dict[tuple, Request] = {}
        self._memory: dict[tuple, tuple[Module, ClosureWatch]] = {}
        self._flights: dict[str, _Flight] = {}
        self._lock = threading.Lock()
        atexit.register(self.save_counters)

    # -- request --------------------------------------------------------
    def compiler(self, backend: str):
        found = self._compilers.get(backend)
        if found is None:
            from .compilers import make_compiler

            with self._lock:
                found = self._compilers.get(backend) or make_compiler(backend, self.config)
                self._compilers[backend] = found
        return found

    def request(self, tag, source, backend, options, include_dirs, dependency_signature) -> Request:
        if not isinstance(options, (str, bytes)):
            options = tuple(options)
        if not isinstance(include_dirs, (str, bytes)):
            include_dirs = tuple(include_dirs)
        memo_key = (tag, source, backend, options, include_dirs, dependency_signature)
        found = self._requests.get(memo_key)
        if found is not None:
            return found
        _validate(tag, source, backend, options, include_dirs, dependency_signature)
        include_dirs = tuple(os.path.normpath(os.path.abspath(os.fspath(d))) for d in include_dirs)
        compiler = self.compiler(backend)
        inputs = {
            "format": manifest_io.FORMAT,
            "backend": backend,
            "source": digest_bytes(source.encode()),
            "compiler": compiler.identity(options),
            "options": compiler.effective_options(options, len(include_dirs)),
            "signature": dependency_signature,
        }
        anchors = Anchors(include_dirs, compiler.system_dirs(options))
        found = Request(tag, source, backend, options, include_dirs, inputs, digest_json(inputs), anchors)
        self._requests[memo_key] = found
        return found

    # -- public entry points -------------------------------------------
    def compile(self, tag, source, *, backend="cpu", options=(), include_dirs=(), dependency_signature="") -> Module:
        req = self.request(tag, source, backend, options, include_dirs, dependency_signature)
        module = self._memory_hit(req)
        if module is not None:
            return module
        with self._flight(req.prekey) as flight:
            module = self._memory_hit(req)
            if module is not None:
                return module
            entry, reason = flight.run(lambda: self._obtain(req))
            try:
                module = _load(entry, reason)
            except (LoadError, FileNotFoundError):
                if os.path.exists(entry.path):
                    raise
                # `cache gc` removed the entry between lookup and load: look again.
                entry, reason = flight.run(lambda: self._obtain(req))
                module = _load(entry, reason)
            self._memory[(req.prekey, req.include_dirs)] = (module, ClosureWatch(entry.manifest["closure"], req.anchors))
            return module

    def compile_without_load(self, tag, source, *, backend="cpu", options=(), include_dirs=(),
                             dependency_signature="") -> CompileResult:
        req = self.request(tag, source, backend, options, include_dirs, dependency_signature)
        with self._flight(req.prekey) as flight:
            entry, reason = flight.run(lambda: self._obtain(req))
        return CompileResult(entry.path, entry.manifest, reason)

    # -- tiers ----------------------------------------------------------
    def _memory_hit(self, req: Request) -> Module | None:
        found = self._memory.get((req.prekey, req.include_dirs))
        if found is None or found[1].stale(self.stats) is not None:
            return None
        self.counters.memory_hits += 1
        return found[0]

    def _flight(self, prekey: str) -> "_Flight":
        with self._lock:
            return self._flights.setdefault(prekey, _Flight())

    def _find(self, req: Request):
        return find(self.config.cache_dirs, req.tag, req.prekey, req.anchors, self.stats, self.manifests)

    def _obtain(self, req: Request) -> tuple[Entry, str | None]:
        roots = self.config.cache_dirs
        lookup = self._find(req)
        if lookup.entry is not None:
            self.counters.disk_hits += 1
            touch(lookup.entry, roots[0])
            return lookup.entry, None
        reason = explain_miss(roots, req.tag, req.inputs, lookup)
        _ensure_writable(roots[0])
        with BuildLock(lock_path(roots[0], req.prekey), self.config.lock_timeout_s) as lock:
            self.counters.lock_wait_s += lock.waited_s
            lookup = self._find(req)
            if lookup.entry is not None:  # built by another process while we waited
                self.counters.disk_hits += 1
                return lookup.entry, None
            for bad in lookup.corrupt:
                self.counters.corrupt_entries += 1
                where = "removing and rebuilding" if bad.root == roots[0] else "ignoring it (read-only tier)"
                warnings.warn(f"kernforge: corrupt cache entry {bad.manifest['error']}; {where}",
                              CacheCorruptionWarning, stacklevel=4)
                if bad.root == roots[0]:
                    quarantine(bad.path, roots[0])
            if self.config.verbose:
                print(f"[kernforge.runtime] miss {req.tag} ({req.backend}): {reason}", file=sys.stderr)
            self.counters.misses += 1
            _first_use_notice(req, roots[0])
            return self._build(req, roots[0]), reason

    def _build(self, req: Request, root: str) -> Entry:
        compiler = self.compiler(req.backend)
        tmp = new_build_dir(root)
        try:
            with open(os.path.join(tmp, compiler.source_name), "w") as f:
                f.write(req.source)
            if self.config.print_command:
                print(f"[kernforge.runtime] compiling {req.tag} in {tmp}", file=sys.stderr)
            out, closure, elapsed = self._compile_stable(compiler, req, tmp)
            key = digest_json({"prekey": req.prekey, "closure": closure})
            with open(os.path.join(tmp, "build.log"), "w") as f:
                f.write(out.log)
            names = (compiler.source_name, out.binary, "build.log")
            manifest = {
                "format": manifest_io.FORMAT,
                "tag": req.tag,
                "prekey": req.prekey,
                "key": key,
                "backend": req.backend,
                "inputs": req.inputs,
                "closure": closure,
                "files": {name: digest_file(os.path.join(tmp, name)) for name in names},
                "binary": out.binary,
                "command": out.command,
                "compiler_path": compiler.binary,
                "extra": out.extra,
                "created": time.time(),
                "host": socket.gethostname(),
                "compile_time_s": elapsed,
            }
            manifest_io.write(tmp, manifest)
            fsync_tree(tmp)
            final = os.path.join(group_dir(root, req.tag, req.prekey), key)
            won = publish(tmp, final)
            tmp = None
        except OSError as exc:
            raise CacheError(f"cannot write cache entry under {root}: {exc}") from exc
        finally:
            if tmp is not None:
                remove_tree(tmp)
        if not won:
            self.counters.races_lost += 1
            manifest = manifest_io.read(final)
        return Entry(root, final, manifest)

    def _compile_stable(self, compiler, req: Request, tmp: str, attempts: int = 3):
        """Compile until no input changed underneath the compiler (at most ``attempts`` times)."""
        for _ in range(attempts):
            started_ns = _filesystem_now_ns(tmp)
            start = time.perf_counter()
            out = compiler.compile(tmp, req.options, req.include_dirs)
            elapsed = time.perf_counter() - start
            self.counters.compiles += 1
            self.counters.compile_time_s += elapsed
            if self.config.print_command:
                print("[kernforge.runtime] Running command: " + " ".join(out.command), file=sys.stderr)
            try:
                return out, build_closure(out.deps, tmp, req.anchors, self.stats, started_ns), elapsed
            except ChangedDuringCompile as changed:
                last = str(changed)
        raise CompileError(f"{last} kept changing while {req.tag} compiled ({attempts} attempts); not cached")

    # -- diagnostics ------------------------------------------------------
    def save_counters(self) -> None:
        """Append this process's counters to ``<root0>/stats.jsonl`` (best effort)."""
        counters = asdict(self.counters)
        if not any(counters.values()):
            return
        line = json.dumps(dict(counters, pid=os.getpid(), host=socket.gethostname(), time=time.time())) + "\n"
        try:
            fd = os.open(os.path.join(self.config.cache_dirs[0], "stats.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError:
            return  # counters are diagnostics; a read-only cache must not fail exit
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
        self.counters = Counters()


class _Flight:
    """Single flight per key: threads that waited on a failing build get its error.

    A caller that arrives after the failure retries (the failure is not cached).
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._generation = 0
        self._error: BaseException | None = None
        self._local = threading.local()

    def __enter__(self) -> "_Flight":
        self._local.seen = self._generation
        self._lock.acquire()
        return self

    def __exit__(self, *exc_info) -> None:
        self._lock.release()

    def run(self, work):
        if self._error is not None and self._generation != self._local.seen:
            raise self._error  # the build we waited for failed
        try:
            result = work()
        except Exception as exc:
            self._error = exc
            self._generation += 1
            raise
        self._error = None
        self._generation += 1
        return result


def _validate(tag, source, backend, options, include_dirs, signature) -> None:
    if not isinstance(tag, str) or not _TAG.fullmatch(tag):
        raise ConfigError(f"cache tag must contain only letters, digits, or underscores: {tag!r}")
    if not isinstance(source, str) or not source:
        raise ConfigError("source must be a non-empty string")
    if backend not in BACKENDS:
        raise ConfigError(f"unknown backend {backend!r}; expected one of {BACKENDS}")
    for name, value in (("options", options), ("include_dirs", include_dirs)):
        if isinstance(value, (str, bytes)):
            raise ConfigError(f"{name} must be a sequence of strings, not a single string")
    for option in options:
        if not isinstance(option, str) or not option:
            raise ConfigError(f"options must be non-empty strings, got {option!r}")
    for directory in include_dirs:
        if not os.path.isdir(directory):
            raise ConfigError(f"include directory does not exist: {directory}")
    if not isinstance(signature, str):
        raise ConfigError(f"dependency_signature must be a string, got {type(signature).__name__}")


def _ensure_writable(root: str) -> None:
    for sub in ("tmp", "locks", "cache"):
        try:
            os.makedirs(os.path.join(root, sub), exist_ok=True)
        except OSError as exc:
            raise CacheError(
                f"cache directory {root} is not writable ({exc.strerror or exc}); "
                "put a writable directory first in KERNFORGE_CACHE_DIR"
            ) from exc
    if not os.access(os.path.join(root, "tmp"), os.W_OK):
        raise CacheError(f"cache directory {root} is not writable; put a writable directory first in KERNFORGE_CACHE_DIR")


def _first_use_notice(req: Request, root: str) -> None:
    """Say on a terminal what is compiling, since a first call at a new shape otherwise pauses
    for seconds without a word; later calls hit the cache and print nothing.  Silent when stderr
    is not a terminal (CI logs, pipes, pytest's capture), so their output stays the results."""
    try:
        tty = sys.stderr.isatty()
    except (AttributeError, ValueError):
        return
    if tty:  # \r\x1b[K: start on a clean line if a progress line (kernforge run) is showing
        sys.stderr.write(f"\r\x1b[Kkernforge: compiling {req.tag} ({req.backend}) on first use; "
                         f"cached in {root} afterwards\n")
        sys.stderr.flush()


def _filesystem_now_ns(directory: str) -> int:
    """The filesystem's current timestamp (its clock can lag time.time_ns())."""
    marker = os.path.join(directory, ".started")
    with open(marker, "w"):
        pass
    stamp = os.stat(marker).st_mtime_ns
    os.unlink(marker)
    return stamp


def _load(entry: Entry, reason: str | None) -> Module:
    backend = entry.manifest["backend"]
    if backend == "cpu":
        return CpuModule(entry.path, entry.manifest, reason)
    if backend == "cuda":
        from .cuda_module import CudaModule

        return CudaModule(entry.path, entry.manifest, reason)
    raise LoadError(
        f"{backend} binaries are built and cached but not loaded in-process here (Ascend needs the ACL runtime); "
        "use compile_without_load and hand .binary_path to the launcher"
    )


_default: Runtime | None = None
_default_lock = threading.Lock()


def get_runtime() -> Runtime:
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = Runtime()
    return _default


def reset() -> None:
    """Drop the default runtime: the next call re-reads the environment."""
    global _default
    with _default_lock:
        if _default is not None:
            _default.save_counters()
        _default = None
