"""kernforge.tune: sweeps verify every configuration, the database remembers and resumes, the
grouped GEMM op follows the database's best, and the CLI reports mistakes in one line.

Timings on a shared machine are noise, so no test relies on which configuration is
fastest: where a test needs a known best it writes the database row itself.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import kernforge
import kernforge.tune as kt
from kernforge.kernels import registry
from kernforge.kernels.grouped_gemm import config as gg_config
from kernforge.kernels.grouped_gemm.problems import contiguous_layout
from kernforge.tune import Database, Row, consult, sweep
from tests.conftest import host_backends

GG = "m_grouped_gemm_nt_contiguous"
# block_M=64 spans two experts at alignment 32 ("small"), so half of this space is wrong
SPACE = dict(block_M=[32, 64], block_N=[32], block_K=[32, 64])


@pytest.fixture(autouse=True)
def _db(tmp_path, monkeypatch):
    """Each test gets its own database; the ops' memo starts empty."""
    path = tmp_path / "tune.sqlite"
    monkeypatch.setenv("KERNFORGE_TUNE_DB", str(path))
    monkeypatch.delenv("KERNFORGE_TUNE", raising=False)
    consult.reset()
    yield path
    consult.reset()


def _reference64(a, b, m_indices):
    """D in float64, straight from the definition: row r is A[r] @ B[g(r)]^T, zero if padding."""
    a, b = a.double(), b.double()
    out = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float64)
    for r, g in enumerate(m_indices.tolist()):
        if g >= 0:
            out[r] = b[g] @ a[r]
    return out


def _matches_reference(backend: str, params: dict, config: dict) -> bool:
    """Run ``config`` on fresh poisoned inputs and compare with the float64 reference
    (bf16 store: 2^-7 relative, plus float32 accumulation over K)."""
    spec = registry.get(GG)
    full = dict(params, **config)
    a, b, m_indices, d = spec.make_inputs(full, seed=7)
    kernforge.compile(spec.factory, backend=backend, **full)(a, b, m_indices, d)
    want = _reference64(a, b, m_indices)
    bound = 2.0 ** -7 * want.abs() + 1e-4 * _reference64(a.abs(), b.abs(), m_indices)
    return bool(((d.double() - want).abs() <= bound).all())


@pytest.mark.parametrize("backend", host_backends("interp", "cpu"))
def test_grid_ranks_only_verified_configurations(backend):
    res = kt.tune(GG, backend=backend, problem="small", space=SPACE, repeats=3, settle=0)
    params = dict(registry.get(GG).problems["small"].params)
    assert not res.cached and not res.stopped
    assert sorted(r.config["block_K"] for r in res.ranked) == [32, 64]
    assert all(r.status == "timed" and r.config["block_M"] == 32 for r in res.ranked)
    assert all(r.median_ms > 0 and r.spread >= 0 and r.samples == 3 for r in res.ranked)
    assert [r.median_ms for r in res.ranked] == sorted(r.median_ms for r in res.ranked)
    assert res.best == res.ranked[0].config
    # the untuned tunable rides along at the problem's value, so a best is a whole configuration
    assert all(r.config["num_stages"] == 2 for r in res.ranked + res.rejected)
    assert len(res.rejected) == 2 and all(r.config["block_M"] == 64 for r in res.rejected)
    assert all(r.reason.startswith("verify: AssertionError") for r in res.rejected)
    # independently of the spec's check: the kept ones are right, the rejected ones are wrong
    for r in res.ranked:
        assert _matches_reference(backend, params, r.config), r.config
    for r in res.rejected:
        assert not _matches_reference(backend, params, r.config), r.config


def test_configuration_that_fails_to_trace_is_rejected_with_its_reason():
    res = kt.tune("m_grouped_fp8_gemm_nt_contiguous", backend="interp", problem="small",
                  space=dict(block_N=[48, 64]), repeats=2)
    assert [r.config["block_N"] for r in res.ranked] == [64]
    (bad,) = res.rejected
    assert bad.config["block_N"] == 48
    assert bad.reason.startswith("compile: ValueError") and "block_N (48) must divide" in bad.reason


def test_a_tunable_that_shapes_the_inputs_is_verified_on_inputs_made_for_it(monkeypatch):
    """The mapping scan's ``chunk_offset`` has a row per ``chunk`` slots: each chunk is
    verified on inputs sized for it (not the problem's chunk of 64, on which 256 and 1024
    compute other offsets), and the reference runs once for each of the three input sets."""
    from kernforge.kernels.moe_permute import problems as moe_problems

    calls, real = [], moe_problems._scan_state
    monkeypatch.setattr(moe_problems, "_scan_state", lambda idx, p: calls.append(p["chunk"]) or real(idx, p))
    res = kt.tune("moe_mapping_scan", backend="interp", problem="small", space=dict(chunk=[64, 256, 1024]),
                  repeats=2, settle=0)
    assert not res.rejected, [(r.config, r.reason) for r in res.rejected]
    assert sorted(r.config["chunk"] for r in res.ranked) == [64, 256, 1024]
    assert sorted(calls) == [64, 256, 1024]
    # independently: each kept chunk's offsets, counted slot by slot
    params = registry.get("moe_mapping_scan").problems["small"].params
    for r in res.ranked:
        chunk, e = r.config["chunk"], params["num_experts"]
        idx, offset, *_ = registry.get("moe_mapping_scan").make_inputs(dict(params, chunk=chunk), 3, "cpu")
        kernforge.compile(registry.get("moe_mapping_scan").factory, backend="interp",
                          **dict(params, chunk=chunk))(idx, offset, *_)
        flat, want, run = idx.flatten().tolist(), [], [0] * e
        for c in range(-(-len(flat) // chunk)):
            want.append(list(run))
            for x in flat[c * chunk:(c + 1) * chunk]:
                if x >= 0:
                    run[x] += 1
        assert offset.tolist() == want, chunk


def test_database_round_trip_cached_forced_exported(tmp_path, monkeypatch):
    builds = []
    real = sweep._compile
    monkeypatch.setattr(sweep, "_compile", lambda *a: builds.append(a[2]) or real(*a))
    first = kt.tune(GG, backend="interp", problem="small", space=SPACE, repeats=2)
    assert len(builds) == 4
    again = kt.tune(GG, backend="interp", problem="small", space=SPACE, repeats=2)
    assert again.cached and len(builds) == 4  # returned at once: nothing built
    assert [r.to_json() for r in again.ranked] == [r.to_json() for r in first.ranked]
    assert [r.to_json() for r in again.rejected] == [r.to_json() for r in first.rejected]
    forced = kt.tune(GG, backend="interp", problem="small", space=SPACE, repeats=2, force=True)
    assert not forced.cached and len(builds) == 8
    # a different space under the same key is not the recorded sweep: only the new point runs
    wider = kt.tune(GG, backend="interp", problem="small", space=dict(SPACE, block_K=[32, 64, 72]), repeats=2,
                    settle=0)  # settling may rebuild a recorded point to re-time it (test_report.py)
    assert not wider.cached and len(builds) == 10 and len(wider.ranked) == 3

    export = tmp_path / "moved.json"
    with Database() as db:
        assert db.export(str(export)) == 1
    other = tmp_path / "other.sqlite"
    monkeypatch.setenv("KERNFORGE_TUNE_DB", str(other))
    with Database() as db:
        assert db.import_(str(export)) == 1
        (entry,) = db.entries(GG)
    assert entry["best"] == wider.best and entry["counts"] == {"timed": 3, "pruned": 0, "rejected": 3}
    assert kt.tune(GG, backend="interp", problem="small", space=dict(SPACE, block_K=[32, 64, 72])).cached
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "something else"}))
    with Database() as db, pytest.raises(ValueError, match="not a tuning database export"):
        db.import_(str(bad))


_WRITER = """
import sys
from kernforge.tune.db import Database, Key, Row
key = Key("k", "{}", "-", "interp", "dev", "cc", "0")
with Database(sys.argv[1]) as db:
    for i in range(40):
        db.begin_sweep(key, {"x": [i]}, "grid", {}, force=False)
        db.record(key, Row({"x": i, "who": sys.argv[2]}, "timed", float(i), 0.0, 1))
"""


def test_concurrent_writers_do_not_corrupt(tmp_path):
    path = str(tmp_path / "shared.sqlite")
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, path, who]) for who in ("a", "b")]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    from kernforge.tune.db import Key

    with Database(path) as db:
        rows = db.rows(Key("k", "{}", "-", "interp", "dev", "cc", "0"))
        assert db._conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert db._conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert sorted((r.config["who"], r.config["x"]) for r in rows) == sorted(
        (w, i) for w in "ab" for i in range(40))


def test_interrupted_sweep_keeps_its_results_and_resumes(monkeypatch):
    timed = []
    real = sweep._time

    def interrupt_on_second(*a):
        if len(timed) == 1:
            raise KeyboardInterrupt
        timed.append(1)
        return real(*a)

    monkeypatch.setattr(sweep, "_time", interrupt_on_second)
    space = dict(block_M=[32], block_N=[32], block_K=[32, 64, 128])
    with pytest.raises(KeyboardInterrupt):
        kt.tune(GG, backend="interp", problem="small", space=space, repeats=2)
    with Database() as db:
        (entry,) = db.entries(GG)
    assert entry["counts"]["timed"] == 1 and not entry["complete"]
    monkeypatch.setattr(sweep, "_time", real)
    builds = []
    real_compile = sweep._compile
    monkeypatch.setattr(sweep, "_compile", lambda *a: builds.append(a[2]["block_K"]) or real_compile(*a))
    res = kt.tune(GG, backend="interp", problem="small", space=space, repeats=2, settle=0)
    assert not res.cached and sorted(builds) == [64, 128]  # the recorded one is not redone
    assert sorted(r.config["block_K"] for r in res.ranked) == [32, 64, 128]
    assert kt.tune(GG, backend="interp", problem="small", space=space).cached


def _timed_rows(path) -> int:
    """Timed rows in the database at ``path`` (read-only: the writer may be mid-transaction)."""
    import sqlite3

    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1) as conn:
            return conn.execute("SELECT COUNT(*) FROM configs WHERE status='timed'").fetchone()[0]
    except sqlite3.Error:  # not created yet, or the schema is being written
        return 0


def test_sigkilled_cli_sweep_keeps_its_results_and_resumes(_db, monkeypatch):
    """A ``kernforge tune`` process killed with SIGKILL (no handler runs) after its first
    timings: the database is intact, the recorded configurations are not built or timed
    again, and the resumed sweep covers the whole space."""
    import os
    import signal
    import time as _time

    space = dict(block_M=[32], block_N=[32, 64], block_K=[32, 64, 128])
    cmd = [sys.executable, "-m", "kernforge.cli", "tune", GG, "--backend", "interp", "--problem", "small",
           "--repeats", "40", "--settle", "0", "--json"]
    cmd += [f"--space={k}={','.join(map(str, v))}" for k, v in space.items()]
    proc = subprocess.Popen(cmd, env=dict(os.environ), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = _time.monotonic() + 240
    while _timed_rows(_db) < 1 and proc.poll() is None and _time.monotonic() < deadline:
        _time.sleep(0.02)
    assert proc.poll() is None, f"the sweep ended before it could be killed: {proc.stderr.read()[-2000:]}"
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    assert proc.returncode == -signal.SIGKILL

    with Database() as db:
        (entry,) = db.entries(GG)
        assert db._conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        recorded = db._conn.execute("SELECT config, median_ms FROM configs WHERE key=? AND status='timed'",
                                    (entry["key"],)).fetchall()
    before = {json.dumps({k: json.loads(c)[k] for k in space}, sort_keys=True): ms for c, ms in recorded}
    assert not entry["complete"] and 1 <= len(before) < 6

    builds = []
    real_compile = sweep._compile
    monkeypatch.setattr(sweep, "_compile", lambda *a: builds.append(json.dumps(
        {k: a[2][k] for k in space}, sort_keys=True)) or real_compile(*a))
    res = kt.tune(GG, backend="interp", problem="small", space=space, repeats=2, settle=0)
    assert not res.cached and len(res.ranked) + len(res.rejected) == 6
    assert not set(builds) & set(before), "a configuration recorded before the kill was built again"
    assert len(builds) == 6 - len(before)
    kept = {json.dumps({k: r.config[k] for k in space}, sort_keys=True): r.median_ms for r in res.ranked}
    assert all(kept[c] == ms for c, ms in before.items())  # the killed run's timings, not new ones


def test_random_is_seeded_and_halving_prunes_to_two_fully_timed():
    space = dict(block_M=[32], block_N=[32, 64], block_K=[32, 64, 128])
    a = kt.tune(GG, backend="interp", problem="small", space=space, strategy="random", samples=2, seed=3,
                repeats=2)
    b = kt.tune(GG, backend="interp", problem="small", space=space, strategy="random", samples=2, seed=3,
                repeats=2, force=True)
    assert len(a.ranked) == 2 and {json.dumps(r.config) for r in a.ranked} == {json.dumps(r.config) for r in b.ranked}
    h = kt.tune(GG, backend="interp", problem="small", space=space, strategy="halving", repeats=4, force=True,
                settle=0)  # settling would re-time the last two when they overlap (test_report.py)
    # six verified: three pruned after 3 samples, one of the other three after 6, two timed in full
    assert [r.status for r in h.ranked] == ["timed"] * 2 + ["pruned"] * 4
    assert [r.samples for r in h.ranked[:2]] == [4, 4]
    assert sorted(r.samples for r in h.ranked[2:]) == [3, 3, 3, 6]
    assert all(r.reason == f"pruned after {r.samples} samples" for r in h.ranked[2:])


def test_budget_stops_early_and_the_rest_resumes():
    space = dict(block_M=[32], block_N=[32], block_K=[32, 64, 128])
    res = kt.tune(GG, backend="interp", problem="small", space=space, budget_s=1e-6, repeats=2)
    assert res.stopped == "budget" and res.ranked == []
    done = kt.tune(GG, backend="interp", problem="small", space=space, repeats=2)
    assert not done.stopped and len(done.ranked) == 3


@pytest.mark.parametrize("call, error, text", [
    (dict(kernel="no_such_kernel"), kt.UnknownKernelError, "unknown kernel 'no_such_kernel'"),
    (dict(space={"block_Q": [1]}), kt.UnknownTunableError, "'block_Q' is not a tunable"),
    (dict(space={"block_M": []}), kt.EmptySpaceError, "tunable 'block_M' of m_grouped_gemm_nt_contiguous"),
    (dict(space={}), kt.EmptySpaceError, "no tuning space"),
    (dict(problem={"Q": 3}), kt.BadShapeError, "has no parameter 'Q'"),
    (dict(problem="huge"), kt.BadShapeError, "unknown problem 'huge'"),
    (dict(strategy="annealing"), kt.TuneError, "unknown strategy 'annealing'"),
])
def test_bad_requests_are_typed_errors_naming_the_thing(call, error, text):
    args = dict(kernel=GG, backend="interp", problem="small")
    args.update(call)
    with pytest.raises(error, match=text.replace("(", r"\(")):
        kt.tune(args.pop("kernel"), **args)


def test_grouped_gemm_op_follows_the_database(monkeypatch):
    from kernforge.ops import grouped_gemm as ops

    rows, groups, n, k = [100, 0, 30], 3, 64, 128
    problem = dict(group_rows=rows, alignment=128, num_groups=groups, N=n, K=k)
    heuristic = gg_config.choose("cpu", groups, n, k, alignment=128)
    res = kt.tune(GG, backend="cpu", problem=problem, space=dict(block_M=[32], block_N=[32, 64], block_K=[64]),
                  repeats=3)
    assert gg_config.choose("cpu", groups, n, k, alignment=128) == dict(num_groups=groups, N=n, K=k, **res.best)
    # make the other configuration the recorded best: the chooser follows the database, not the timing
    other = next(r.config for r in res.ranked if r.config != res.best)
    with Database() as db:
        db.record(res.key, Row(other, "timed", 1e-9, 0.0, 3))
    consult.reset()
    chosen = gg_config.choose("cpu", groups, n, k, alignment=128)
    assert chosen == dict(num_groups=groups, N=n, K=k, **other) != heuristic
    seen = []
    real = ops._kernel
    monkeypatch.setattr(ops, "_kernel", lambda factory, backend, **p: seen.append(p) or real(factory, backend, **p))
    g = torch.Generator().manual_seed(1)
    m_indices = contiguous_layout(rows, 128)
    a = torch.randn(m_indices.numel(), k, generator=g).bfloat16()
    b = torch.randn(groups, n, k, generator=g).bfloat16()
    d = torch.full((m_indices.numel(), n), float("nan"), dtype=torch.bfloat16)
    ops.m_grouped_bf16_gemm_nt_contiguous(a, b, d, m_indices, backend="cpu")
    assert seen == [chosen]
    want = _reference64(a, b, m_indices)
    bound = 2.0 ** -7 * want.abs() + 1e-4 * _reference64(a.abs(), b.abs(), m_indices)
    assert ((d.double() - want).abs() <= bound).all()
    # other shapes, KERNFORGE_TUNE=0, and a tile that could span two experts keep the heuristic
    assert gg_config.choose("cpu", groups, n, 2 * k, alignment=128) == gg_config.choose.heuristic(
        "cpu", groups, n, 2 * k, alignment=128)
    monkeypatch.setenv("KERNFORGE_TUNE", "0")
    assert gg_config.choose("cpu", groups, n, k, alignment=128) == heuristic
    monkeypatch.delenv("KERNFORGE_TUNE")
    key32 = kt.sweep.make_key(GG, "cpu", kt.sweep.bind_params(registry.get(GG).factory.factory,
                                                              dict(problem, alignment=32)), res.space)
    with Database() as db:
        db.begin_sweep(key32, res.space, "grid", {}, force=False)
        db.record(key32, Row(dict(other, block_M=64), "timed", 1e-9, 0.0, 3))
    consult.reset()
    assert gg_config.choose("cpu", groups, n, k, alignment=32)["block_M"] == 32


def _cli(capsys, *argv):
    from kernforge.cli import main

    code = main(["tune", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_sweep_show_export_import_and_errors(capsys, tmp_path, monkeypatch):
    code, out, err = _cli(capsys, GG, "--backend", "interp", "--problem", "small", "--space", "block_M=32",
                          "--space", "block_N=32", "--space", "block_K=32,64", "--repeats", "2", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["best"]["block_M"] == 32 and len(data["ranked"]) == 2 and not data["cached"]
    code, out, _ = _cli(capsys, GG, "--backend", "interp", "--shape", "N=40,K=72,group_rows=[5,0,70,32]",
                        "--space", "block_M=32", "--space", "block_N=32", "--space", "block_K=32,64",
                        "--problem", "small", "--png", str(tmp_path / "h.png"))
    assert code == 0 and "from the database" in out and "best: block_K=" in out
    try:
        import matplotlib  # noqa: F401
        assert (tmp_path / "h.png").exists()
    except ImportError:
        assert "--png skipped: matplotlib is not installed" in out and not (tmp_path / "h.png").exists()
    code, out, _ = _cli(capsys, "--show", "--json")
    (entry,) = json.loads(out)["sweeps"]
    assert code == 0 and entry["kernel"] == GG and entry["complete"] and entry["counts"]["timed"] == 2
    code, out, _ = _cli(capsys, "--show", "topk_fp32")
    assert code == 0 and "(no sweeps)" in out
    moved = tmp_path / "db.json"
    assert _cli(capsys, "--export", str(moved))[0] == 0
    monkeypatch.setenv("KERNFORGE_TUNE_DB", str(tmp_path / "fresh.sqlite"))
    code, out, _ = _cli(capsys, "--import", str(moved))
    assert code == 0 and "imported 1 sweep(s)" in out
    code, out, _ = _cli(capsys, "--show")
    assert GG in out and "block_K=" in out
    for argv, text in [(["no_such"], "unknown kernel 'no_such'"),
                       ([GG, "--space", "block_Q=1"], "'block_Q' is not a tunable"),
                       ([GG, "--space", "block_M="], "--space block_M has no values"),
                       ([GG, "--shape", "N"], "bad --shape item 'N'"),
                       ([GG, "--shape", "Q=1"], "has no parameter 'Q'"),
                       ([], "name the kernel to tune")]:
        code, out, err = _cli(capsys, *argv, "--backend", "interp")
        assert code == 1 and out == "" and err.count("\n") == 1 and text in err, (argv, err)


def test_parallel_builds_then_serial_timing_via_the_callable_module(monkeypatch, tmp_path):
    """``jobs=2`` builds in worker processes; the parent's builds are then JIT cache hits, and
    the result is the same kind of verified ranking.  ``kernforge.tune(...)`` is the call.
    The environment is changed after the parent's runtime read it (as an earlier test in the
    same process can leave it): the workers must still build into the parent's cache tiers."""
    from kernforge.runtime import compilers
    from kernforge.runtime.runtime import get_runtime

    get_runtime()
    monkeypatch.setenv("KERNFORGE_CACHE_DIR", str(tmp_path / "not_the_parents_cache"))
    space = dict(block_M=[32], block_N=[64], block_K=[32, 64])  # not built by the other tests
    compiled = []
    real = compilers.cpu.CpuCompiler.compile
    monkeypatch.setattr(compilers.cpu.CpuCompiler, "compile", lambda self, *a: compiled.append(1) or real(self, *a))
    res = kernforge.tune(GG, backend="cpu", problem="small", space=space, jobs=2, repeats=3)
    assert compiled == []  # every build of the parent came from the workers' cache entries
    assert sorted(r.config["block_K"] for r in res.ranked) == [32, 64] and not res.rejected


def test_kernforge_tune_is_the_entry_point_and_the_package():
    import subprocess
    import sys

    code = ("import kernforge; assert callable(kernforge.tune); import kernforge.tune as t; "
            "assert t is kernforge.tune and t.tune is not None and callable(t.lookup)")
    subprocess.run([sys.executable, "-c", code], check=True)
