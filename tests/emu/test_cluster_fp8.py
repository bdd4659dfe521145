"""The FP8 GEMMs with 2-CTA clusters and TMA multicast of the A tile (``fp8_gemm(cluster=2)``,
``m_grouped_fp8_gemm_nt_contiguous`` / ``_masked(cluster=2)``) on cuda-emu, sm_90a.

Same protocol as the bf16 GEMMs (``tests/emu/test_cluster_gemm.py``): CTA r loads half the e4m3 A
tile and multicasts it into both CTAs' stage, each full barrier expects the whole A tile plus its
own B tile, and the consumers release a stage to both CTAs' empty barriers -- here from the
promotion ring (``partial * sfa * sfb`` added per 128-deep K block).  Checked against the
interpreter on poisoned outputs (dense and persistent, with a padded CTA or N tile: an odd N tile
count), the bench configurations' requests, the padded tile's clamped scale read, and bugs planted
in the generated source under a perturbed schedule.  "CUDA semantics verified on host emulation",
never GPU verified."""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import kernforge
from kernforge.backends.cuda.renderer import render_cuda
from kernforge.backends.cuda_emu.backend import EmulationError
from kernforge.kernels.registry import all_specs
from tests.emu.planted import CLUSTER_SCHEDULES, cluster_planted

SPECS = all_specs()
TILES = dict(block_M=64, block_N=64, num_stages=2, threads=128, cluster=2)
CASES = {
    # 3 N tiles: a padded 4th CTA; ragged M; 3 K blocks wrap the 2-stage ring
    "dense": ("fp8_gemm_nt", dict(M=100, N=160, K=384), None),
    # the bench's persistent walk, shrunk: 3 N tiles (the last unit's second tile is padding), 4 SMs
    "dense_persistent": ("fp8_gemm_nt", dict(M=100, N=160, K=384, persistent=2), 4),
    "contiguous": ("m_grouped_fp8_gemm_nt_contiguous",
                   dict(group_rows=[5, 0, 70, 130], alignment=64, num_groups=4, N=160, K=256, persistent=2), 4),
    "masked": ("m_grouped_fp8_gemm_nt_masked",
               dict(masked_rows=[40, 0, 128, 70], max_m=128, num_groups=4, N=160, K=256, persistent=2), 4),
}


def _run(case: str, kernel=None) -> tuple[list, list, object]:
    """(cuda-emu outputs, interpreter outputs, the emulated kernel) of ``CASES[case]``, both on
    NaN-poisoned outputs (a tile no CTA stores stays NaN in one and not the other)."""
    name, shape, sm_count = CASES[case]
    spec, params = SPECS[name], {**TILES, **shape}
    inputs = spec.make_inputs(params, 0, "cpu")
    oracle = [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]
    for i in spec.outputs:
        inputs[i].fill_(float("nan"))
        oracle[i].copy_(inputs[i])
    emu = kernforge.compile(spec.factory, backend="cuda-emu", arch="sm_90a", **params)
    if sm_count:
        emu.launcher.sm_count = sm_count
    if kernel is not None:
        emu.launcher.emulated = kernel
    emu(*inputs)
    kernforge.compile(spec.factory, backend="interp", **params)(*oracle)
    return [inputs[i].float().numpy() for i in spec.outputs], [oracle[i].float().numpy() for i in spec.outputs], emu


def _same(got: list, want: list) -> bool:
    """Equal up to float32 summation order, NaN (never stored) exactly where the interpreter has it."""
    return all(np.allclose(g, w, rtol=2.0 ** -7, atol=1e-3, equal_nan=True) for g, w in zip(got, want))


@pytest.mark.parametrize("case", sorted(CASES))
def test_clustered_fp8_gemm_matches_the_interpreter(case):
    got, want, emu = _run(case)
    program = emu.launcher.program
    assert program.cluster == 2, program.cluster_reason
    assert emu.launcher.last_variant == "tma"
    src = program.source
    rank = 3 if case == "masked" else 2
    assert src.count(f"kf::tma_load_{rank}d_multicast(") == 1 and "(uint16_t)3u)" in src
    assert "__cluster_dims__(2, 1, 1)" in src and src.count("kf::mbarrier_arrive_cluster(") == 1
    if CASES[case][2] is None:
        assert emu.launcher.last_grid == (4, 2)  # 3 N tiles padded to 2 clusters, 2 row tiles
    assert not all(np.isnan(w).all() for w in want)
    assert _same(got, want)


def test_bench_configurations_ask_for_clusters():
    """sm_90a's bench FP8 GEMMs are clustered (K-major A, an even count of 128-column N tiles,
    64-row slices of 128-byte rows); the FP8 x FP4 ones, whose A is widened in shared memory, are not."""
    for name in ("fp8_gemm_nt", "m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nt_masked"):
        params = SPECS[name].problems["bench"].params
        assert params["cluster"] == 2, name
        program = render_cuda(SPECS[name].factory(**params).ir, "sm_90a")
        assert program.cluster == 2 and "_multicast(" in program.source, (name, program.cluster_reason)
    for name in ("fp8_fp4_gemm_nt", "m_grouped_fp8_fp4_gemm_nt_contiguous", "m_grouped_fp8_fp4_gemm_nt_masked"):
        assert "cluster" not in SPECS[name].problems["bench"].params, name


def test_decode_tiles_and_mn_major_a():
    """64-row decode tiles still split into 1024-byte slices (A shared below 512 rows); an MN-major
    A is not shared (B may be, from 512 rows on); one N tile shares nothing; nor does a host."""
    from kernforge.kernels.gemm import config

    fp8 = dict(b_major="k", gran_n=128)
    decode = config.choose("cuda", 7168, 2048, 16, a_major="k", **fp8)
    assert decode["cluster"] == 2 and "multicast" not in decode and decode["block_M"] == 64
    assert "cluster" not in config.choose("cuda", 7168, 2048, 256, a_major="mn", **fp8)
    assert config.choose("cuda", 7168, 2048, 4096, a_major="mn", **fp8)["multicast"] == "b"
    assert "cluster" not in config.choose("cuda", 128, 2048, 256, a_major="k", **fp8)
    assert "cluster" not in config.choose("cpu", 7168, 2048, 4096, a_major="k", **fp8)


@pytest.mark.parametrize("name", ["fp8_gemm_nt", "m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nt_masked"])
def test_padded_tile_reads_scales_in_bounds(name):
    """With 128-column N tiles and an odd count, the padded tile's B scale block is one past the
    end: clamped where a cluster along N pads the N tiles only (elsewhere the plain index stays)."""
    factory = SPECS[name].factory
    groups = {} if name == "fp8_gemm_nt" else dict(num_groups=2)

    def source(N: int, **kw) -> str:
        shape = dict(groups, N=N, K=256, block_M=64, block_N=128, num_stages=2, threads=128, **kw)
        return render_cuda(factory(**shape).ir, "sm_90a").source

    assert "kf_min(((bx * 128) / 128), 2)" in source(384, cluster=2)
    assert "kf_min(((bx * 128) / 128)" not in source(384)
    assert "kf_min(((bx * 128) / 128)" not in source(256, cluster=2)  # 2 N tiles: no padding
    if name == "fp8_gemm_nt":  # clusters along M pad M blocks, whose A scale rows are clamped already
        assert "kf_min(((bx * 128) / 128)" not in source(384, cluster=2, multicast="b")


# ---------------------------------------------------------------- planted bugs (dense, promotion ring)

# each bug under the schedule that decides its race (tests/emu/planted.py, CLUSTER_SCHEDULES)
BUGS = {
    "release_own_cta_only": ("consumer_late", lambda s: re.sub(r"(kf::mbarrier_arrive_cluster\([^;]*), kf_r\);",
                                                              r"\1, kf_cta_rank);", s)),
    # 64x128 e4m3 A (8192 bytes) + 64x128 B: the peer's 4096-byte half left out
    "expect_tx_own_half_only": ("producer_late", lambda s: s.replace(", 16384u);", ", 12288u);")),
    "multicast_to_own_cta_only": ("consumer_late",
                                  lambda s: s.replace("(uint16_t)3u)", "(uint16_t)(1u << kf_cta_rank))")),
}


@pytest.fixture(scope="module")
def planted():
    name, shape, _ = CASES["dense"]
    params = {**TILES, **shape}
    ir = SPECS[name].factory(**{k: v for k, v in params.items() if k != "M"}).ir
    return cluster_planted("cluster_fp8_planted", ir, "sm_90a", BUGS)


@pytest.mark.parametrize("schedule", sorted(CLUSTER_SCHEDULES))
def test_perturbed_clean_copy_passes(planted, schedule):
    got, want, _ = _run("dense", planted.kernel(f"clean_{schedule}", timeout_ms=20_000))
    assert _same(got, want)


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_planted_bug_fails(planted, bug):
    try:
        got, want, _ = _run("dense", planted.kernel(bug, timeout_ms=3_000))
    except EmulationError:
        return
    assert not _same(got, want), f"planted {bug} went unnoticed"
