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


def test_grouped_gemms_are_set_against_the_measured_peak(gpu_check):
    """Issue 14: every grouped GEMM (bf16, FP8, FP8 x FP4; contiguous and masked) timed at its
    bench size is reported as a fraction of the dense peak of its operand type, against the 70%
    target, with DeepGEMM's published numbers beside it; other kernels are not."""
    from kernforge.kernels import registry

    specs = registry.all_specs()
    grouped = sorted(n for n, s in specs.items() if {"moe", "gemm"} <= set(s.tags))
    assert {f"m_grouped_{kind}gemm_nt_{layout}" for kind in ("", "fp8_", "fp8_fp4_")
            for layout in ("contiguous", "masked")} <= set(grouped)
    rows = [{"kernel": n, "tflops": 600.0} for n in grouped] + [{"kernel": "topk", "tflops": 1.0}]
    out = gpu_check.grouped_gemm_against_peak(rows, specs, {"bf16": 800.0, "fp8": 1000.0})
    assert [r["kernel"] for r in out] == grouped
    by_name = {r["kernel"]: r for r in out}
    bf16 = by_name["m_grouped_gemm_nt_contiguous"]
    assert bf16["fraction"] == 0.75 and bf16["meets_target"]
    assert by_name["m_grouped_fp8_fp4_gemm_nt_masked"]["fraction"] == 0.6
    assert not by_name["m_grouped_fp8_fp4_gemm_nt_masked"]["meets_target"]
    assert "masked grouped" in by_name["m_grouped_fp8_gemm_nt_masked"]["published"]
    # a GPU where the fp8 peak could not be measured: the fp8 rows say so instead of a fraction
    no_fp8 = gpu_check.grouped_gemm_against_peak(rows, specs, {"bf16": 800.0})
    assert "no fp8 peak measured" in gpu_check.peak_table(no_fp8)


@pytest.mark.slow
def test_engine_decode_check_runs_the_engine_against_the_reference(gpu_check):
    """The GPU run's engine row, on the CPU engine: verified, timed on both sides."""
    row = gpu_check.engine_decode_check(device="cpu", backend="cpu", prompt=20, decode=2, repeat=2)
    assert row["status"].startswith("verified"), row
    assert row["mean_abs_err"] < 0.08 and row["kernforge_ms"] > 0
    assert row["peers"]["reference model (torch)"]["ms"] > 0


def test_engine_decode_check_reports_a_wrong_engine(gpu_check, monkeypatch):
    from kernforge.engine import Engine

    forward = Engine.forward
    monkeypatch.setattr(Engine, "forward", lambda self, ids, start_pos=0: forward(self, ids, start_pos) + 0.5)
    row = gpu_check.engine_decode_check(device="cpu", backend="cpu", prompt=20, decode=2, repeat=2)
    assert row["status"].startswith("MISMATCH"), row
    assert gpu_check.failed([row])


def test_mla_op_check_verifies_the_seesaw_configuration(gpu_check):
    """The check a GPU run adds for MLA's op configuration, run here on cuda-emu (sm_90a: the
    chooser's 64-token tiles, which the renderer runs as the seesaw) at small lengths, through
    ``flash_mla_with_kvcache`` (MTP, causal, sink) against the float64 reference; a wrong result
    would be a MISMATCH row."""
    from kernforge.backends.cuda.renderer import render_cuda
    from kernforge.kernels import mla_decode as M

    row = gpu_check.mla_op_check(device="cpu", backend="cuda-emu", lens=(150, 1, 70), heads=16)
    assert row["block_N"] == 64 and row["status"] == "verified (sm_90a, 64-token tiles)", row
    cfg = M.config.choose("cuda-emu", 16, 1, 2, 576, 512, 64, True, arch="sm_90a")
    assert "kf_seesaw_x" in render_cuda(M.mla_decode(**cfg).ir, "sm_90a").source
