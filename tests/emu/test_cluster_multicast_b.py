"""B multicast: clusters along grid y (``dense_gemm(cluster=2, multicast="b")``, ``fp8_gemm`` too) on
cuda-emu, sm_90a.

The CTAs of adjacent M blocks need the same B tile: CTA r loads rows ``[r * BN / 2, (r + 1) * BN / 2)``
of it and multicasts them into both CTAs' stage (``kernforge/backends/cuda/cluster.py`` with
``axis=1``; the emulator runs the cluster's CTAs at adjacent ``blockIdx.y``, kf/emu/runtime.h).
The grid's y extent (M, a runtime size) is rounded up at launch, so an odd M block count runs a
padded CTA with a zero-filled A box that stores nothing; a persistent kernel keeps its 1-D launch
(clusters along x) and hands CTA r the M block ``2 * unit + r`` of the same N block.  Checked
against float64 torch / the interpreter on poisoned outputs, the plan and chooser rules, a
fallback, and bugs planted in the generated source (wrong CTA mask, wrong peer offsets, a release
to the own CTA only) under a perturbed schedule.  "CUDA semantics verified on host emulation",
never GPU verified."""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import kernforge
from kernforge.backends.cuda import cluster, persistent
from kernforge.backends.cuda.renderer import render_cuda
from kernforge.backends.cuda_emu.backend import EmulationError
from kernforge.kernels.gemm import config
from kernforge.kernels.registry import all_specs
from tests.emu.dsl_kernels import gated_ring_gemm
from tests.emu.planted import CLUSTER_SCHEDULES, cluster_planted

SPEC = all_specs()["bf16_gemm_nt"]
FP8 = all_specs()["fp8_gemm_nt"]
TILES = dict(block_M=64, block_N=64, block_K=64, num_stages=2, threads=128, dtype="bfloat16", out_dtype="bfloat16",
             cluster=2, multicast="b")


def _run(params: dict, sm_count=None, kernel=None) -> tuple[torch.Tensor, torch.Tensor, object]:
    """(the emulated output, float64 A @ B^T, the compiled kernel) on a NaN-poisoned output."""
    emu = kernforge.compile(SPEC.factory, backend="cuda-emu", arch="sm_90a", **params)
    if sm_count:
        emu.launcher.sm_count = sm_count
    if kernel is not None:
        emu.launcher.emulated = kernel
    A, B, D = SPEC.make_inputs(params, 0, "cpu")[:3]
    D.fill_(float("nan"))
    emu(A, B, D)
    return D, A.double() @ B.double().T, emu


def _close(out: torch.Tensor, ref: torch.Tensor) -> bool:
    """bf16 output rounding (2^-8 relative) over a float32 sum."""
    return bool(not torch.isnan(out).any() and ((out.double() - ref).abs() <= 2.0 ** -8 * ref.abs() + 1e-2).all())


# ---------------------------------------------------------------- plan rules


def test_plan_along_y():
    plan = cluster.plan_multicast("sm_90a", (3, 5), 128, 128, swizzle=128, axis=1)
    assert plan.size == 2 and plan.axis == 1 and plan.dims == (1, 2, 1)
    assert plan.attribute == "__cluster_dims__(1, 2, 1)" and plan.launch_grid == (3, 6)
    assert cluster.plan_multicast("sm_90a", (3, 1), 128, 128, axis=1).reason == "one CTA along grid y: no tile to share"
    assert cluster.plan_multicast("sm_80", (3, 4), 128, 128, axis=1).size == 1
    with pytest.raises(ValueError, match="axis"):
        cluster.plan_multicast("sm_90a", (3, 4), 128, 128, axis=2)
    assert cluster.launch_grid((3, 5), 2, 1) == (3, 6) and cluster.launch_grid((3, 5, 7), 2, 1) == (3, 6, 7)
    assert cluster.launch_grid((3, 5), 2) == (4, 5)
    # persistent: ceil(5 / 2) = 3 units of M blocks per N block, 9 in all
    assert persistent.launch_grid((3, 5), 132, 2, 1) == (18,) and persistent.launch_grid((3, 5), 132, 2) == (20,)
    assert persistent.launch_grid((3, 5), 7, 2, 1) == (6,)


def test_chooser_picks_b_or_a_per_shape():
    """DeepGEMM's rule: B from 512 rows on when the tiles are square (the larger block side first,
    B on a tie), B K-major and the M blocks pair evenly; else A as before."""
    assert config.choose_dense("cuda", 7168, 2048, 4096)["multicast"] == "b"
    assert config.choose("cuda", 7168, 2048, 4096, a_major="k", b_major="k", gran_n=128)["multicast"] == "b"
    for m, variant in ((256, {}), (4096 + 128, {}), (4096, dict(b_major="mn"))):
        cfg = config.choose_dense("cuda", 7168, 2048, m, **variant)
        assert cfg["cluster"] == 2 and "multicast" not in cfg, (m, variant)
    assert "cluster" not in config.choose_dense("cpu", 7168, 2048, 4096)
    assert SPEC.problems["bench"].params["multicast"] == "b" and FP8.problems["bench"].params["multicast"] == "b"


def test_factory_rejects_an_unknown_operand():
    with pytest.raises(ValueError, match="multicast"):
        SPEC.factory(N=128, K=64, multicast="c")
    with pytest.raises(ValueError, match="multicast"):
        FP8.factory(N=128, K=128, multicast="ab")


# ---------------------------------------------------------------- cuda-emu against float64


@pytest.mark.parametrize("M,N,K,extra,sm_count", [
    (150, 160, 192, {}, None),                                # 3 M blocks: a padded 4th CTA; ragged N
    (40, 128, 64, {}, None),                                  # one M block: a padded CTA beside it
    (150, 160, 192, {"persistent": 2}, 4),                    # persistent: 3 N x 2 M units on 2 clusters
    (150, 160, 320, {"persistent": 2, "num_stages": 3}, 2),   # one cluster walks every unit; 5 K steps
])
def test_b_multicast_matches_float64(M, N, K, extra, sm_count):
    params = {**TILES, "M": M, "N": N, "K": K, **extra}
    out, ref, emu = _run(params, sm_count)
    program = emu.launcher.program
    assert program.cluster == 2 and program.cluster_axis == 1 and emu.launcher.last_variant == "tma"
    src = program.source
    if extra.get("persistent"):
        assert "__cluster_dims__(2, 1, 1)" in src and "kf_tby = kf_tby * 2 + (int32_t)kf_cta_rank;" in src
        assert emu.launcher.last_grid == (2 * min(sm_count // 2, 3 * 2),)
    else:
        assert "__cluster_dims__(1, 2, 1)" in src
        assert emu.launcher.last_grid == (-(-N // 64), -(-(-(-M // 64)) // 2) * 2)
    assert _close(out, ref), (out.double() - ref).abs().max()


def test_generated_protocol():
    """B's map boxes half its rows and is the multicast one (rank's slice: rows and stage offset);
    A is the CTA's own load; the full barrier expects the whole B tile plus A."""
    program = render_cuda(SPEC.factory(**{**TILES, "N": 160, "K": 192}).ir, "sm_90a")
    src = program.source
    maps = {m.buffer: m for m in program.tensor_maps}
    assert maps["B"].box == (32, 64) and maps["A"].box == (64, 64)
    assert "kf::tma_load_2d_multicast(kf_dst, &kf_tmap_B_1" in src and "kf::tma_load_2d(kf_dst, &kf_tmap_A_0" in src
    assert "kf_cta_rank * 2048u" in src and "(int32_t)kf_cta_rank * 32" in src
    assert "kf::mbarrier_arrive_expect_tx(kf_bars0 + kf_j2 % 2, 16384u)" in src
    assert "kf::mbarrier_init(kf_bars0 + 2 + kf_s, 256)" in src and src.count("kf::cluster_sync();") == 4


def test_fp8_b_multicast_matches_the_interpreter():
    """The FP8 dense GEMM's promotion ring with B shared across M blocks, persistent, a padded unit."""
    params = dict(M=150, N=384, K=384, block_M=64, block_N=128, num_stages=2, threads=128, cluster=2, multicast="b",
                  persistent=2)
    inputs = FP8.make_inputs(params, 0, "cpu")
    oracle = [t.clone() for t in inputs]
    for t in (inputs[4], oracle[4]):
        t.fill_(float("nan"))
    emu = kernforge.compile(FP8.factory, backend="cuda-emu", arch="sm_90a", **params)
    emu.launcher.sm_count = 4
    emu(*inputs)
    kernforge.compile(FP8.factory, backend="interp", **params)(*oracle)
    assert emu.launcher.program.cluster_axis == 1 and "tma_load_2d_multicast(kf_dst, &kf_tmap_B_1" in (
        emu.launcher.program.source)
    got, want = inputs[4].float().numpy(), oracle[4].float().numpy()
    assert not np.isnan(want).any()
    np.testing.assert_allclose(got, want, rtol=2.0 ** -7, atol=1e-3)


def test_a_ring_behind_a_branch_on_by_is_not_clustered():
    """A cluster along y needs every CTA to run the ring: a ring inside ``if by < 2`` falls back."""
    program = render_cuda(gated_ring_gemm("by", N=128, multicast="b").ir, "sm_90a")
    assert "setmaxnreg" in program.source, "the ring is no longer warp-specialized: the test lost its point"
    assert program.cluster == 1 and "depend on by" in program.cluster_reason


@pytest.mark.parametrize("arch", ["sm_80", "sm_100a"])
def test_archs_without_a_cluster_render_as_before(arch):
    asked = {**TILES, "N": 160, "K": 192}
    program = render_cuda(SPEC.factory(**asked).ir, arch)
    assert program.cluster == 1 and program.cluster_axis == 0
    assert program.source.replace("_c2b", "") == render_cuda(SPEC.factory(**dict(asked, cluster=0)).ir, arch).source


# ---------------------------------------------------------------- planted bugs

# each bug under the schedule that decides its race (tests/emu/planted.py, CLUSTER_SCHEDULES)
BUGS = {
    "cta_mask_own_only": ("consumer_late", lambda s: s.replace("(uint16_t)3u)", "(uint16_t)(1u << kf_cta_rank))")),
    "cta_mask_rank0_only": ("consumer_late", lambda s: s.replace("(uint16_t)3u)", "(uint16_t)1u)")),
    "peer_stage_offset_swapped": ("consumer_late",
                                  lambda s: s.replace("kf_cta_rank * 2048u", "(1u - kf_cta_rank) * 2048u")),
    "peer_row_offset_dropped": ("consumer_late", lambda s: s.replace(" + (int32_t)kf_cta_rank * 32", "")),
    "release_own_cta_only": ("consumer_late", lambda s: re.sub(r"(kf::mbarrier_arrive_cluster\([^;]*), kf_r\);",
                                                              r"\1, kf_cta_rank);", s)),
}
PLANTED = dict(TILES, M=150, N=160, K=192)


@pytest.fixture(scope="module")
def planted():
    ir = SPEC.factory(**{k: v for k, v in PLANTED.items() if k != "M"}).ir
    return cluster_planted("cluster_b_planted", ir, "sm_90a", BUGS)


@pytest.mark.parametrize("schedule", sorted(CLUSTER_SCHEDULES))
def test_perturbed_clean_copy_passes(planted, schedule):
    out, ref, _ = _run(PLANTED, kernel=planted.kernel(f"clean_{schedule}", timeout_ms=20_000))
    assert _close(out, ref)


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_planted_bug_fails(planted, bug):
    try:
        out, ref, _ = _run(PLANTED, kernel=planted.kernel(bug, timeout_ms=3_000))
    except EmulationError:
        return
    assert not _close(out, ref), f"planted {bug} went unnoticed"
