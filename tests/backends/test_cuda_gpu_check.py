"""``benchmarks/gpu_check.py`` on a machine without a GPU: importable, and ``--dry-run`` builds for real."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil

import pytest

_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "gpu_check.py")


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", _PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_json_goes_to_out_dir_by_default(gpu_check, monkeypatch, tmp_path):
    monkeypatch.setenv("OUT", str(tmp_path))
    assert gpu_check.out_path(None) == os.path.join(str(tmp_path), "gpu_check.json")
    assert gpu_check.out_path("x.json") == "x.json"
    monkeypatch.delenv("OUT")
    assert gpu_check.out_path(None) is None


def test_unknown_kernel_is_refused(gpu_check):
    with pytest.raises(SystemExit, match="unknown kernel"):
        gpu_check.selected_specs("no_such_kernel")


def test_every_family_has_a_timing_peer(gpu_check):
    from kernforge.kernels import registry

    assert {s.family for s in registry.all_specs().values()} <= set(gpu_check.PEERS)


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_dry_run_compiles_and_reports_resources(gpu_check, tmp_path, capsys):
    out = tmp_path / "check.json"
    code = gpu_check.main(["--dry-run", "--kernels", "m_grouped_gemm_nt_contiguous", "--problems", "small",
                           "--arch", "sm_80", "--jobs", "1", "--out", str(out)])
    assert code == 0
    result = json.loads(out.read_text())
    (row,) = result["rows"]
    assert result["mode"] == "dry-run" and row["status"] == "compiled" and row["arch"] == "sm_80"
    assert row["registers"] > 0 and row["spill_stores"] == 0 and os.path.exists(row["path"])
    assert "m_grouped_gemm_nt_contiguous" in capsys.readouterr().out


def test_every_peer_runs_on_small_inputs(gpu_check):
    """The torch peers are device-agnostic: run each once on the host so a GPU run cannot trip on them."""
    from kernforge.kernels import registry

    for spec in registry.all_specs().values():
        params = spec.problems["small"].params
        inputs = spec.make_inputs(params, 0, "cpu")
        peers = gpu_check.PEERS[spec.family](spec, inputs, params)
        assert peers
        for fn in peers.values():
            fn()
