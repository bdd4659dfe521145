"""Fixtures: every test gets private cache roots and a fresh runtime snapshot.

No test touches the user's ``~/.cache/kernforge``: ``KERNFORGE_CACHE_DIR`` is
pointed at a temporary directory and every ``*_JIT_*`` variable is cleared.
"""

import os
import shutil
import stat
import sys

import pytest

from kernforge import runtime

GXX = shutil.which("g++") or shutil.which("clang++")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def isolated_env(tmp_path, monkeypatch):
    for name in list(os.environ):
        if "_JIT_" in name or name == "KERNFORGE_CACHE_DIR":
            monkeypatch.delenv(name)
    cache = tmp_path / "cache"
    monkeypatch.setenv("KERNFORGE_CACHE_DIR", str(cache))
    monkeypatch.setenv("PYTHONPATH", REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    runtime.set_app_prefix(None)
    runtime.reset()
    yield cache
    runtime.reset()
    runtime.set_app_prefix(None)


@pytest.fixture
def cache_root(isolated_env):
    return isolated_env


class Wrapper:
    """A g++ wrapper script that logs each real compile (and can lie about its version)."""

    def __init__(self, directory, version=None, sleep_s=0.0):
        self.path = str(directory / "kf-test-cxx")
        self.log = str(directory / "compiles.log")
        self.write(version=version, sleep_s=sleep_s)

    def write(self, version=None, sleep_s=0.0, sleep_after_s=0.0):
        """sleep_s: before the real compile (holds the lock); sleep_after_s: after it."""
        version_case = f'if [ "$1" = "--version" ]; then echo "{version}"; exit 0; fi\n' if version else ""
        script = (
            "#!/bin/sh\n"
            + version_case
            + f'case " $* " in *" -shared "*) echo "$$" >> {self.log}; sleep {sleep_s};; esac\n'
            + f'{GXX} "$@" || exit $?\n'
            + f'case " $* " in *" -shared "*) sleep {sleep_after_s};; esac\n'
        )
        tmp = self.path + ".new"
        with open(tmp, "w") as f:
            f.write(script)
        os.chmod(tmp, os.stat(tmp).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        os.replace(tmp, self.path)

    @property
    def compiles(self) -> int:
        if not os.path.exists(self.log):
            return 0
        with open(self.log) as f:
            return len(f.read().split())


@pytest.fixture
def wrapper(tmp_path, monkeypatch):
    w = Wrapper(tmp_path)
    monkeypatch.setenv("KERNFORGE_JIT_CXX", w.path)
    runtime.reset()
    return w


def committed_entries(root):
    """Committed entry directories (those with a manifest) under a cache root."""
    found = []
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, "cache")):
        if "meta.json" in filenames:
            found.append(dirpath)
    return sorted(found)


def snapshot(root):
    """Names, modes, sizes, mtimes and contents of everything under root."""
    state = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            content = open(full, "rb").read() if stat.S_ISREG(st.st_mode) else None
            state[os.path.relpath(full, root)] = (st.st_mode, st.st_size, st.st_mtime_ns, content)
    st = os.lstat(root)
    state["."] = (st.st_mode, st.st_mtime_ns)
    return state


PYTHON = sys.executable
