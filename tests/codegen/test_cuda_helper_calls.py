"""The generated library kernels reach the device helpers of kf/softmax.cuh and kf/radix.cuh
(render only, no compiler): MLA decode's online softmax is one kf::online_softmax_step call
on every target, TopK's digit histograms add through kf::hist_add_warp."""
import pytest

from kernforge.backends.cuda.renderer import render_cuda
from kernforge.kernels.registry import all_specs

SPECS = all_specs()


def _source(name, problem, arch):
    spec = SPECS[name]
    return render_cuda(spec.factory(**spec.problems[problem].params).ir, arch).source


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a", "sm_100a"])
@pytest.mark.parametrize("name", ["mla_decode", "mla_decode_sparse"])
def test_mla_decode_runs_the_softmax_helper(name, arch):
    src = _source(name, "demo", arch)
    assert '#include "kf/softmax.cuh"' in src
    # block_H 64 x block_N 32 scores over 8 warps: 4 warps along rows, 2 along keys
    assert src.count("kf::online_softmax_step<1, 2, 4, 2, 8>(acc_s, m, l, rescale, ") == 1
    assert "exp2f" not in src                     # the step is not spelled out in the kernel any more
    assert "kf_softmax_scratch" in src


def test_mla_scores_outside_registers_use_the_row_helper():
    # the sparse "small" problem has 8-row tiles: no mma accumulator, the scores live in shared memory
    src = _source("mla_decode_sparse", "small", "sm_90a")
    assert "kf::online_softmax_row(" in src and "online_softmax_step" not in src


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("name", ["topk_fp32", "topk_bf16"])
def test_topk_histograms_are_warp_aggregated(name, arch):
    src = _source(name, "small", arch)                # the tile_scan (data-parallel) compaction
    assert '#include "kf/radix.cuh"' in src
    digits = 4 if name == "topk_fp32" else 2
    assert src.count("kf::hist_add_warp(") == digits
    assert "kf::atomic_add(&hist" not in src
