"""What a sweep shows: the progress bar's counts, the heatmap PNG, and the re-timing that
settles an overlapping ranking (timings are faked where a test needs them to overlap)."""
from __future__ import annotations

import io
import math

import pytest
from rich.console import Console

import kernforge.tune as kt
from kernforge.tune import consult, sweep
from kernforge.tune.heatmap import HeatmapError, axes_of, draw, grid
from kernforge.tune.progress import SweepProgress

GG = "m_grouped_gemm_nt_contiguous"
SPACE = dict(block_M=[32, 64], block_N=[32], block_K=[32, 64])  # block_M=64 fails to verify on "small"


@pytest.fixture(autouse=True)
def _db(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNFORGE_TUNE_DB", str(tmp_path / "tune.sqlite"))
    consult.reset()
    yield
    consult.reset()


def test_progress_counts_each_configuration_once_and_shows_the_best():
    out = io.StringIO()
    bar = SweepProgress(GG, console=Console(file=out, force_terminal=True, width=200), enabled=True)
    with bar:
        res = kt.tune(GG, backend="interp", problem="small", space=SPACE, repeats=2, progress=bar)
    assert bar.counts["compiled"] == 4 and bar.counts["verified"] == 2
    assert bar.counts["timed"] == 2 and bar.counts["rejected"] == 2  # re-timings are not new timings
    assert res.planned == 4 and len(bar._finished) == 4
    line = bar.line(res)
    assert f"best {res.leader.median_ms:.4g} ms" in line and "block_K=" in line
    assert res.leader.config == res.best or res.settle_rounds > 0
    assert "tune " + GG in out.getvalue()


def test_progress_is_silent_off_a_terminal():
    out = io.StringIO()
    bar = SweepProgress(GG, console=Console(file=out, force_terminal=False))
    with bar:
        kt.tune(GG, backend="interp", problem="small", space=dict(SPACE, block_M=[32]), repeats=2, progress=bar)
    assert out.getvalue() == "" and bar.counts["timed"] == 2


def test_heatmap_cells_are_the_best_median_and_rejected_cells_are_marked(tmp_path):
    res = kt.tune(GG, backend="interp", problem="small", space=SPACE, repeats=2, settle=0)
    g = grid(res, *axes_of(res, "block_K,block_M"))
    for r in res.ranked:
        assert g.ms[g.ys.index(r.config["block_M"])][g.xs.index(r.config["block_K"])] == r.median_ms
    assert g.rejected == {(0, 1), (1, 1)} and all(math.isnan(v) for v in g.ms[1])
    png = tmp_path / "h.png"
    draw(res, str(png), "block_K,block_M")
    import matplotlib.image

    img = matplotlib.image.imread(str(png))
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    one = grid(res, *axes_of(res, "block_K"))  # one tunable: one row
    assert one.y is None and len(one.ms) == 1
    with pytest.raises(HeatmapError, match="block_Q"):
        axes_of(res, "block_K,block_Q")


def test_overlapping_top_two_are_retimed_longer_until_separated(monkeypatch):
    calls = []
    real = sweep._time

    def fake(kernel, inputs, samples, device):
        real(kernel, inputs, 1, device)
        calls.append(samples)
        # overlapping until a configuration has been timed with 40 samples
        return (1.0 + 0.1 * len(calls), 0.5 if samples < 40 else 0.01)

    monkeypatch.setattr(sweep, "_time", fake)
    res = kt.tune(GG, backend="interp", problem="small", space=dict(SPACE, block_M=[32]), repeats=10)
    assert calls == [10, 10, 20, 20, 40, 40]
    assert res.settle_rounds == 2 and res.stable is True
    assert sorted(r.samples for r in res.ranked) == [40, 40]
    calls.clear()
    res = kt.tune(GG, backend="interp", problem="small", space=dict(SPACE, block_M=[32]), repeats=10,
                  force=True, settle=1)
    assert calls == [10, 10, 20, 20] and res.settle_rounds == 1 and res.stable is False
