"""Races: 8 processes on one key, threads in one process, SIGKILL mid-compile."""

import json
import os
import signal
import subprocess
import threading
import time

import pytest

from conftest import PYTHON, committed_entries
from kernforge import runtime
from kernforge.runtime.publish import new_build_dir, publish
from rt_sources import THREADS

CHILD = r"""
import json, sys, time
from kernforge import runtime
start = float(sys.argv[1])
while time.time() < start:
    time.sleep(0.001)
module = runtime.compile("race", sys.argv[2])
import ctypes
out = (ctypes.c_int64 * 1)(-1)
fn = module.get_function("kf_threads", argtypes=("ptr", "ptr"))
status = fn(runtime.pack_pointers([out]), runtime.pack_dims([0]))
print(json.dumps({"key": module.key, "path": module.path, "status": status, "threads": out[0],
                  "stats": runtime.stats()}))
"""


def test_eight_processes_racing_compile_once(cache_root, wrapper):
    wrapper.write(sleep_s=1.0)  # hold the lock long enough for everyone to pile up
    start = time.time() + 1.5
    procs = [subprocess.Popen([PYTHON, "-c", CHILD, str(start), THREADS], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(8)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        results.append(json.loads(out))
    assert wrapper.compiles == 1
    assert len({r["key"] for r in results}) == 1 and len({r["path"] for r in results}) == 1
    assert all(r["status"] == 0 and r["threads"] == 2 for r in results)
    assert sum(r["stats"]["compiles"] for r in results) == 1
    assert sum(r["stats"]["disk_hits"] for r in results) == 7
    assert len(committed_entries(cache_root)) == 1
    assert os.listdir(cache_root / "tmp") == []


def test_threads_share_one_compile(wrapper):
    wrapper.write(sleep_s=0.5)
    results, errors = [], []

    def work():
        try:
            results.append(runtime.compile("threads", THREADS))
        except Exception as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert wrapper.compiles == 1 and len({id(m) for m in results}) == 1
    assert runtime.stats()["memory_hits"] == 7


def test_sigkill_during_compile_leaves_nothing_visible(cache_root, wrapper, monkeypatch):
    wrapper.write(sleep_s=60)
    monkeypatch.setenv("KERNFORGE_JIT_LOCK_TIMEOUT", "30")
    child = subprocess.Popen([PYTHON, "-c", CHILD, "0", THREADS], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.time() + 60
    while wrapper.compiles == 0:  # the compiler is running and the lock is held
        assert time.time() < deadline and child.poll() is None, "child never reached the compiler"
        time.sleep(0.05)
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    assert committed_entries(cache_root) == []
    assert len(os.listdir(cache_root / "tmp")) == 1  # the dead build dir, never published
    wrapper.write(sleep_s=0)
    runtime.reset()
    started = time.time()
    module = runtime.compile("race", THREADS)
    assert time.time() - started < 25  # the dead holder's lock was released by the kernel
    assert module.miss_reason is not None and len(committed_entries(cache_root)) == 1


def test_publish_race_loser_reuses_winner(cache_root):
    final = str(cache_root / "cache" / "t.prekey" / "key")
    dirs = []
    for content in (b"winner", b"loser"):
        tmp = new_build_dir(str(cache_root))
        with open(os.path.join(tmp, "kernel.so"), "wb") as f:
            f.write(content)
        with open(os.path.join(tmp, "meta.json"), "w") as f:
            json.dump({k: 1 for k in ("format", "tag", "prekey", "key", "backend", "inputs", "closure", "files",
                                       "binary", "command")}, f)
        dirs.append(tmp)
    assert publish(dirs[0], final) is True
    assert publish(dirs[1], final) is False
    assert open(os.path.join(final, "kernel.so"), "rb").read() == b"winner"
    assert not os.path.exists(dirs[1])


def test_publish_onto_uncommitted_destination_fails_loudly(cache_root):
    final = cache_root / "cache" / "t.prekey" / "key"
    final.mkdir(parents=True)
    (final / "stray").write_text("not committed")
    tmp = new_build_dir(str(cache_root))
    (open(os.path.join(tmp, "kernel.so"), "w")).close()
    with pytest.raises(runtime.PublishError, match="not committed"):
        publish(tmp, str(final), visibility_wait_s=0.1)
    assert os.path.exists(tmp) and (final / "stray").read_text() == "not committed"


def test_lock_timeout_names_the_holder(cache_root, monkeypatch):
    import socket

    from kernforge.runtime.cache import lock_path
    from kernforge.runtime.lock import BuildLock

    monkeypatch.setenv("KERNFORGE_JIT_LOCK_TIMEOUT", "0.3")
    runtime.reset()
    req = runtime.get_runtime().request("held", THREADS, "cpu", (), (), "")
    with BuildLock(lock_path(str(cache_root), req.prekey), 5):  # another holder (separate open file)
        started = time.time()
        with pytest.raises(runtime.LockTimeoutError, match=f"{socket.gethostname()} pid {os.getpid()}"):
            runtime.compile("held", THREADS)
        assert time.time() - started < 5
    assert runtime.compile("held", THREADS).miss_reason is not None  # free again once released


def test_threads_waiting_on_a_failing_build_share_its_error(wrapper):
    wrapper.write(sleep_s=0.5)
    broken = 'extern "C" int kf_broken() { return missing_symbol; }\n'
    errors = []

    def work():
        try:
            runtime.compile("broken", broken)
        except runtime.CompileError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(errors) == 4 and wrapper.compiles == 1
    assert all("missing_symbol" in str(e) for e in errors)
    with pytest.raises(runtime.CompileError):  # a later call retries rather than reusing the failure
        runtime.compile("broken", broken)
    assert wrapper.compiles == 2
