"""``kernforge cache`` tools, driven through the module's own entry point."""

import os
import socket
import subprocess

import pytest

from conftest import PYTHON, committed_entries
from kernforge import runtime
from kernforge.runtime import cli
from kernforge.runtime.maintenance import tree_size


def make_entries(count):
    return [runtime.compile_without_load(f"k{i}", f'extern "C" int kf_{i}() {{ return {i}; }}\n')
            for i in range(count)]


def test_ls_and_stats(cache_root, capsys):
    built = make_entries(2)
    runtime.reset()  # flush counters to stats.jsonl
    assert cli.main(["cache", "ls"]) == 0
    listing = capsys.readouterr().out
    assert all(r.key in listing for r in built)
    assert cli.main(["cache", "stats"]) == 0
    text = capsys.readouterr().out
    assert "2 entries" in text and "misses 2" in text and "compiles 2" in text


def test_verify_finds_corruption_and_gc_removes_it(cache_root, capsys):
    good, bad = make_entries(2)
    with open(bad.binary_path, "r+b") as f:
        f.write(b"\0\0\0\0")
    assert cli.main(["cache", "verify"]) == 1
    out = capsys.readouterr().out
    assert "CORRUPT" in out and bad.path in out and good.path not in out
    assert cli.main(["cache", "gc"]) == 0
    assert committed_entries(cache_root) == [good.path]
    assert cli.main(["cache", "verify"]) == 0


def test_gc_evicts_least_recently_used_to_the_cap(cache_root, capsys):
    built = make_entries(4)
    for age, result in zip((400, 100, 300, 200), built):  # seconds since last use
        os.utime(result.path, (os.path.getmtime(result.path) - age,) * 2)
    sizes = {r.path: tree_size(r.path) for r in built}
    cap = sizes[built[1].path] + sizes[built[3].path]  # room for the two most recent
    assert cli.main(["cache", "gc", "--max-size", str(cap)]) == 0
    assert committed_entries(cache_root) == sorted([built[1].path, built[3].path])
    assert "evicted 2" in capsys.readouterr().out
    runtime.reset()
    again = runtime.compile_without_load("k1", 'extern "C" int kf_1() { return 1; }\n')
    assert again.miss_reason is None  # survivors are still served


def test_gc_removes_build_dirs_of_dead_processes_only(cache_root):
    make_entries(1)
    dead = subprocess.run([PYTHON, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    host = socket.gethostname()
    dead_dir = cache_root / "tmp" / f"{host}-{dead.stdout.strip()}-deadbeef"
    live_dir = cache_root / "tmp" / f"{host}-{os.getpid()}-feedface"
    dead_dir.mkdir()
    live_dir.mkdir()
    assert cli.main(["cache", "gc"]) == 0
    assert not dead_dir.exists() and live_dir.exists()


def test_clear_only_touches_the_first_root(tmp_path, monkeypatch, capsys):
    first, second = tmp_path / "first", tmp_path / "second"
    monkeypatch.setenv("KERNFORGE_CACHE_DIR", str(second))
    runtime.reset()
    make_entries(1)
    monkeypatch.setenv("KERNFORGE_CACHE_DIR", f"{first}:{second}")
    runtime.reset()
    runtime.compile_without_load("other", 'extern "C" int kf_other() { return 9; }\n')
    assert cli.main(["cache", "clear", "--yes"]) == 0
    assert committed_entries(first) == [] and len(committed_entries(second)) == 1


def test_module_runs_as_a_script(cache_root):
    make_entries(1)
    proc = subprocess.run([PYTHON, "-m", "kernforge.runtime.cli", "cache", "stats", "--json"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert '"entries": 1' in proc.stdout


def test_register_adds_cache_subcommand():
    import argparse

    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["cache", "gc", "--max-size", "1G"])
    assert args.func is cli.handle and args.max_size == "1G"
    with pytest.raises(SystemExit):
        parser.parse_args(["cache", "explode"])


def test_entry_evicted_between_lookup_and_load_is_looked_up_again(cache_root, monkeypatch):
    from kernforge.runtime import runtime as runtime_impl
    from kernforge.runtime.publish import quarantine

    source = 'extern "C" int kf_evicted() { return 5; }\n'
    built = runtime.compile_without_load("evicted", source)
    runtime.reset()
    real_load = runtime_impl._load
    calls = []

    def load_after_gc(entry, reason):
        if not calls:
            quarantine(entry.path, str(cache_root))  # what `cache gc` does to an old entry
        calls.append(entry.path)
        return real_load(entry, reason)

    monkeypatch.setattr(runtime_impl, "_load", load_after_gc)
    module = runtime.compile("evicted", source)
    assert module.key == built.key and len(calls) == 2
    assert module.get_function("kf_evicted", argtypes=(), restype="i32")() == 5


def test_clear_without_a_terminal_or_yes_says_so_and_keeps_the_entries(cache_root):
    make_entries(1)
    proc = subprocess.run([PYTHON, "-m", "kernforge.runtime.cli", "cache", "clear"], capture_output=True,
                          text=True, stdin=subprocess.DEVNULL)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "pass --yes" in proc.stderr
    assert len(committed_entries(cache_root)) == 1


def test_clear_on_a_terminal_asks_and_an_empty_answer_keeps_the_entries(cache_root, monkeypatch, capsys):
    make_entries(1)
    monkeypatch.setattr("sys.stdin.isatty", lambda: True, raising=False)
    monkeypatch.setattr("builtins.input", lambda prompt: (_ for _ in ()).throw(EOFError))
    assert cli.main(["cache", "clear"]) == 1
    assert "nothing removed" in capsys.readouterr().err
    assert len(committed_entries(cache_root)) == 1
    monkeypatch.setattr("builtins.input", lambda prompt: "y")
    assert cli.main(["cache", "clear"]) == 0
    assert committed_entries(cache_root) == []


class _Terminal:
    """A stderr that says it is a terminal, recording what is written."""

    def __init__(self):
        self.text = ""

    def isatty(self):
        return True

    def write(self, s):
        self.text += s

    def flush(self):
        pass


def test_a_first_use_compile_says_so_once_on_a_terminal_only(cache_root, monkeypatch):
    tty = _Terminal()
    monkeypatch.setattr("sys.stderr", tty)
    source = 'extern "C" int kf_notice() { return 7; }\n'
    runtime.compile_without_load("notice", source)
    assert tty.text.count("compiling notice (cpu) on first use") == 1
    assert f"cached in {cache_root}" in tty.text
    runtime.reset()
    runtime.compile_without_load("notice", source)  # a disk hit: nothing compiles, nothing said
    assert tty.text.count("on first use") == 1
    import io

    pipe = io.StringIO()  # not a terminal: CI logs, pipes
    monkeypatch.setattr("sys.stderr", pipe)
    runtime.compile_without_load("notice2", 'extern "C" int kf_notice2() { return 8; }\n')
    assert pipe.getvalue() == ""
