"""`kernforge run|demo|list` on the kernel library: default problems, sizes, vs torch, tables."""
from __future__ import annotations

import dataclasses
import json
import re
import time

import pytest

from kernforge import backends
from kernforge.kernels import check, registry
from kernforge.kernels.check import RunResult, default_problem, run_spec
from tests.cli.conftest import assert_one_line_error, run_process


def _numel(inputs) -> int:
    return sum(t.numel() for t in inputs if hasattr(t, "numel"))


@pytest.mark.parametrize("name", sorted(registry.all_specs()))
def test_the_default_problem_is_the_smallest_on_oracles_and_emulators(name):
    spec = registry.get(name)
    first, *rest = spec.problems
    for b in backends.available():
        want = first if not backends.get(b).speed_path else "demo"
        assert default_problem(spec, b) == want
    assert default_problem(spec) == "demo"
    # "declared smallest first" is what default_problem relies on: check it on the inputs' sizes
    small = _numel(spec.make_inputs(spec.problems[first].params, 0, "cpu"))
    assert small < _numel(spec.make_inputs(spec.problems["demo"].params, 0, "cpu"))
    if spec.bytes is not None:
        assert all(spec.bytes(spec.problems[first].params) < spec.bytes(spec.problems[r].params) for r in rest)


def test_run_defaults_to_small_on_the_interpreter(cli):
    code, out, err = cli("run", "topk_bf16", "--backend", "interp", "--json")
    assert code == 0, err
    res = json.loads(out)
    assert res["problem"] == "small" and res["verified"]
    assert res["torch_ms"] > 0 and res["vs_torch"] == pytest.approx(res["torch_ms"] / res["median_ms"])
    assert err == ""  # no progress outside a terminal


def test_unknown_problem_lists_the_choices_with_their_sizes(cli):
    code, out, err = cli("run", "topk_bf16", "--problem", "huge")
    assert_one_line_error(code, err, "unknown problem 'huge'", "small (batch=3 vocab=700 k=16",
                          "bench (batch=32 vocab=129280")


def test_run_help_lists_every_kernels_problems_with_sizes(cli):
    code, out, err = cli("run", "--help")
    assert code == 0
    for name, spec in registry.all_specs().items():
        assert f"{name}: small (" in out
    assert "mla_decode: small (batch=2 seqlens=[37,5]" in out
    assert max(len(line) for line in out.splitlines() if "(" in line and ":" in line) <= 120


def test_run_spec_times_the_torch_reference_on_the_same_inputs():
    spec = registry.get("topk_bf16")
    seen = []

    def slow_reference(inputs, params):  # 30 ms slower than the real one, and records its inputs
        seen.append(inputs[0].data_ptr())
        time.sleep(0.03)
        return spec.reference(inputs, params)

    res = run_spec(dataclasses.replace(spec, reference=slow_reference), "interp", "small", repeat=3)
    assert res.verified, res.error
    assert res.torch_ms >= 30 and len(set(seen)) == 1 and len(seen) == 4  # check + 3 timed, one input set
    assert res.vs_torch == pytest.approx(res.torch_ms / res.median_ms)
    assert RunResult("k", "cpu", "demo", True, 0.1, 2.0, torch_ms=6.0).row()[-1] == "3.00x"
    assert RunResult("k", "cpu", "demo", False, 0.1, None, "run: x").row()[-2:] == ["-", "-"]


def _columns(header: str) -> list[int]:
    """Start offsets of the header's columns (names may hold one space: "build s")."""
    return [m.start() for m in re.finditer(r"\S+(?: \S+)*", header)]


def test_demo_prints_one_aligned_table_with_the_true_problem_per_row(cli, monkeypatch):
    specs = {k: v for k, v in registry.all_specs().items() if k in ("topk_bf16", "mla_decode")}
    monkeypatch.setattr(registry, "all_specs", lambda: specs)
    code, out, err = cli("demo", "--backends", "interp,cpu", "--repeat", "1")
    assert code == 0, out + err
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("kernel "))
    assert lines[header].split()[-2:] == ["vs", "torch"]
    rows = lines[header + 2: header + 2 + 4]
    starts = _columns(lines[header])
    for row in rows:
        assert [row[s - 1] if s else " " for s in starts] == [" "] * len(starts)  # a gap before each column
        assert re.search(r"\d+\.\d\dx\s*$", row), row
    problems = {(r.split()[0], r.split()[1]): r.split()[2] for r in rows}
    assert problems == {("mla_decode", "interp"): "small", ("mla_decode", "cpu"): "demo",
                        ("topk_bf16", "interp"): "small", ("topk_bf16", "cpu"): "demo"}
    assert sum("topk_bf16" in line for line in lines) == 2  # each row printed once
    assert "problem 'demo'" not in out and err == ""


def test_demo_json(cli, monkeypatch):
    specs = {"topk_bf16": registry.get("topk_bf16")}
    monkeypatch.setattr(registry, "all_specs", lambda: specs)
    code, out, err = cli("demo", "--backends", "interp", "--json")
    assert code == 0, err
    [row] = json.loads(out)
    assert row["problem"] == "small" and row["verified"] and row["vs_torch"] > 0


def test_demo_rejects_an_unknown_backend_in_one_line(cli):
    code, out, err = cli("demo", "--backends", "interp,warp-drive")
    assert_one_line_error(code, err, "unknown backend 'warp-drive'")


def test_list_fits_120_columns_and_shows_sizes(cli):
    code, out, err = cli("list")
    assert code == 0
    assert max(map(len, out.splitlines())) <= 120
    assert "small  batch=3 vocab=700 k=16" in out
    assert "bench  masked_rows=[192]*32 max_m=256" in out
    code, out, err = cli("list", "--json")
    got = {k["kernel"]: k for k in json.loads(out)}
    assert got.keys() == registry.all_specs().keys()
    assert got["topk_bf16"]["problems"]["small"]["vocab"] == 700
    assert "tile" in got["topk_bf16"]["tunables"]


def test_list_into_a_closed_pipe_is_quiet():
    import subprocess
    import sys

    from tests.cli.conftest import REPO

    proc = subprocess.Popen([sys.executable, "-m", "kernforge.cli", "list"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=REPO)
    proc.stdout.close()  # the reader is gone before the first byte (`| head -0`)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and err == b""


def test_entry_point_runs():
    import shutil
    import subprocess

    exe = shutil.which("kernforge")
    if exe is None:
        pytest.skip("kernforge is not installed as a command (pip install -e .)")
    proc = subprocess.run([exe, "list", "--json"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(proc.stdout)) == len(registry.all_specs())
    proc = run_process("run", "topk_bf16", "--problem", "huge")
    assert_one_line_error(proc.returncode, proc.stderr, "unknown problem 'huge'")


def test_run_checks_builds_the_checked_variant(monkeypatch, capsys):
    from kernforge import cli, runtime

    monkeypatch.delenv("KERNFORGE_CHECKS", raising=False)
    import os

    tags, real = [], runtime.compile
    monkeypatch.setattr(runtime, "compile", lambda tag, *a, **k: (tags.append(tag), real(tag, *a, **k))[1])
    assert cli.main(["run", "m_grouped_gemm_nt_masked", "--backend", "cpu", "--problem", "small",
                     "--repeat", "1", "--checks", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["verified"] is True
    assert tags and all(t.endswith("_checked") for t in tags)
    assert "KERNFORGE_CHECKS" not in os.environ  # the flag is an argument, not process state


def test_build_refuses_a_problem_configured_for_other_arches(cli):
    """MLA's bench problem takes the sm_90a chooser's 64-token tiles (the seesaw); on sm_80 it
    would not fit, and the CLI says so before compiling, naming the arches and a way out."""
    code, out, err = cli("build", "mla_decode", "--problem", "bench", "--arch", "sm_80")
    assert_one_line_error(code, err, "--problem bench of mla_decode is configured for sm_90a, sm_100a, not sm_80",
                          "try --problem demo")
    assert registry.get("mla_decode").problems["bench"].for_cuda_arch("sm_90a")
    assert registry.get("mla_decode").problems["demo"].for_cuda_arch("sm_80")
