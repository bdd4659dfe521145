"""Cache tiers, read-only shared roots, corruption, and filesystem errors."""

import errno
import os

import numpy as np
import pytest

from conftest import committed_entries, snapshot
from kernforge import runtime
from kernforge.runtime import manifest as manifest_io
from rt_sources import THREADS

OTHER = THREADS.replace("num_threads(2)", "num_threads(1)")


def threads_of(module) -> int:
    out = np.full(1, -1, np.int64)
    module.get_function("kf_threads", argtypes=("ptr", "ptr"))(runtime.pack_pointers([out]), runtime.pack_dims([0]))
    return int(out[0])


def test_read_only_shared_tier_is_never_written(tmp_path, monkeypatch, wrapper):
    shared, private = tmp_path / "shared", tmp_path / "private"
    monkeypatch.setenv("KERNFORGE_CACHE_DIR", str(shared))
    runtime.reset()
    runtime.compile("shared_kernel", THREADS)
    runtime.reset()  # flush the writer's counters before taking the snapshot
    before = snapshot(shared)
    monkeypatch.setenv("KERNFORGE_CACHE_DIR", f"{private}:{shared}")
    runtime.reset()
    hit = runtime.compile("shared_kernel", THREADS)  # served by the second root
    assert hit.miss_reason is None and hit.path.startswith(str(shared)) and threads_of(hit) == 2
    miss = runtime.compile("private_kernel", OTHER)  # built and published in the first root only
    assert miss.path.startswith(str(private)) and threads_of(miss) == 1
    runtime.reset()  # counters are flushed to the first root only
    assert snapshot(shared) == before
    assert wrapper.compiles == 2
    assert [os.path.basename(os.path.dirname(p)).split(".")[0] for p in committed_entries(private)] == ["private_kernel"]


def test_first_root_wins_when_both_have_the_entry(tmp_path, monkeypatch, wrapper):
    a, b = tmp_path / "a", tmp_path / "b"
    for root in (b, a):
        monkeypatch.setenv("KERNFORGE_CACHE_DIR", str(root))
        runtime.reset()
        runtime.compile_without_load("k", THREADS)
    monkeypatch.setenv("KERNFORGE_CACHE_DIR", f"{a}:{b}")
    runtime.reset()
    assert runtime.compile("k", THREADS).path.startswith(str(a))


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES])
def test_unwritable_first_root_gives_a_clear_error(tmp_path, monkeypatch, code, wrapper):
    root = tmp_path / "ro"
    monkeypatch.setenv("KERNFORGE_CACHE_DIR", str(root))
    runtime.reset()
    real_makedirs = os.makedirs

    def refusing(path, *args, **kwargs):
        if str(path).startswith(str(root)):
            raise OSError(code, os.strerror(code), str(path))
        return real_makedirs(path, *args, **kwargs)

    monkeypatch.setattr(os, "makedirs", refusing)
    with pytest.raises(runtime.CacheError, match="is not writable") as info:
        runtime.compile("k", THREADS)
    assert os.strerror(code) in str(info.value) and "KERNFORGE_CACHE_DIR" in str(info.value)
    assert wrapper.compiles == 0


def test_disk_full_while_publishing_is_reported_and_cleaned_up(cache_root, monkeypatch):
    def full(entry_dir, manifest):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), entry_dir)

    monkeypatch.setattr(manifest_io, "write", full)
    with pytest.raises(runtime.CacheError, match="No space left on device"):
        runtime.compile("k", THREADS)
    assert committed_entries(cache_root) == [] and os.listdir(cache_root / "tmp") == []


@pytest.mark.parametrize("damage", ["truncate_binary", "flip_byte", "delete_binary", "garbage_manifest"])
def test_corrupted_entry_is_detected_reported_and_rebuilt(cache_root, wrapper, damage):
    # Built without loading: damaging a library this process has mapped would
    # crash it (entries are immutable; nothing in kernforge edits them in place).
    module = runtime.compile_without_load("c", THREADS)
    binary = os.path.join(module.path, "kernel.so")
    if damage == "truncate_binary":
        os.truncate(binary, os.path.getsize(binary) // 2)
    elif damage == "flip_byte":
        data = bytearray(open(binary, "rb").read())
        data[len(data) // 2] ^= 0xFF
        open(binary, "wb").write(bytes(data))
    elif damage == "delete_binary":
        os.unlink(binary)
    else:
        open(os.path.join(module.path, "meta.json"), "w").write('{"format": 1, "tag"')
    runtime.reset()
    with pytest.warns(runtime.CacheCorruptionWarning, match="corrupt cache entry"):
        rebuilt = runtime.compile("c", THREADS)
    assert rebuilt.miss_reason.startswith("corrupt entry")
    assert threads_of(rebuilt) == 2 and wrapper.compiles == 2
    assert runtime.stats()["corrupt_entries"] == 1
    assert len(committed_entries(cache_root)) == 1
    runtime.reset()
    assert runtime.compile("c", THREADS).miss_reason is None


def test_uncommitted_leftovers_are_ignored_and_left_alone(cache_root, wrapper):
    module = runtime.compile_without_load("u", THREADS)
    group = os.path.dirname(module.path)
    leftover = os.path.join(group, "0" * 32)
    os.mkdir(leftover)
    open(os.path.join(leftover, "kernel.so"), "w").write("half written")
    runtime.reset()
    assert runtime.compile("u", THREADS).miss_reason is None
    assert os.path.exists(os.path.join(leftover, "kernel.so")) and wrapper.compiles == 1


def test_memory_tier_and_counters(wrapper):
    a = runtime.compile("m", THREADS)
    b = runtime.compile("m", THREADS)
    assert a is b
    counts = runtime.stats()
    assert counts["misses"] == 1 and counts["compiles"] == 1 and counts["memory_hits"] == 1
    assert counts["compile_time_s"] > 0
