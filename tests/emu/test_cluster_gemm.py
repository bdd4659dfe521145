"""The generated dense bf16 GEMM with 2-CTA clusters and TMA multicast (``dense_gemm(cluster=2)``,
``kernforge/backends/cuda/cluster.py``: ``plan_kernel``, ``apply``; the warp-specialized ring of
``warp_specialize.py``; ``tma.render_issue``) on cuda-emu, sm_90a.

The CTAs of adjacent N blocks share each A tile: CTA r loads rows ``[r * BM / 2, (r + 1) * BM / 2)``
and multicasts them into both CTAs' stage; every CTA's full barrier expects the whole A tile plus
its own B tile; a stage is released to both CTAs' empty barriers; cluster barriers at ring entry
and exit; the grid's x extent is padded to whole clusters (an odd N block count leaves a padded
CTA that loads, multicasts and takes part in every barrier, storing nothing).  Checked against
float64 torch on poisoned outputs, the fallbacks (one N block, sm_80, sm_100a, persistent), and
bugs planted in the generated source under a perturbed schedule (CTA 0's consumers read each stage
late, CTA 1's producer issues late), each of which must fail while the same perturbed clean copy
passes.  "CUDA semantics verified on host emulation", never GPU verified."""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import kernforge
from kernforge.backends.cuda import cluster
from kernforge.backends.cuda.renderer import render_cuda
from kernforge.backends.cuda_emu.backend import CudaEmuBackend, EmulatedModule, EmulationError, cluster_smem_bytes
from kernforge.kernels.registry import all_specs
from tests.emu.dsl_kernels import gated_ring_gemm
from tests.emu.planted import CLUSTER_SCHEDULES, cluster_planted, renamed

SPEC = all_specs()["bf16_gemm_nt"]
TILES = dict(block_M=64, block_N=64, block_K=64, num_stages=2, threads=128, dtype="bfloat16", out_dtype="bfloat16")


def _params(M: int, N: int, K: int, **kw) -> dict:
    return {**TILES, "M": M, "N": N, "K": K, "cluster": 2, **kw}


def _run(params: dict, launcher_emulated=None) -> tuple[torch.Tensor, torch.Tensor, object]:
    """(the emulated output, float64 A @ B^T, the compiled kernel) on poisoned outputs."""
    emu = kernforge.compile(SPEC.factory, backend="cuda-emu", arch="sm_90a", **params)
    if launcher_emulated is not None:
        emu.launcher.emulated = launcher_emulated
    A, B, D = SPEC.make_inputs(params, 0, "cpu")[:3]
    D.fill_(float("nan"))
    emu(A, B, D)
    b = B.double() if params.get("b_major", "k") == "k" else B.double().T
    a = A.double() if params.get("a_major", "k") == "k" else A.double().T
    return D, a @ b.T, emu


def _close(out: torch.Tensor, ref: torch.Tensor) -> bool:
    """bf16 output rounding (2^-8 relative) over a float32 sum."""
    return bool(not torch.isnan(out).any() and ((out.double() - ref).abs() <= 2.0 ** -8 * ref.abs() + 1e-2).all())


@pytest.mark.parametrize("M,N,K,extra", [
    (100, 160, 192, {}),                 # 3 N blocks: a padded 4th CTA; ragged M; K wraps the 2-stage ring
    (64, 128, 64, {}),                   # exactly one cluster, one K step
    (70, 192, 320, {"num_stages": 3}),   # ragged M, 3 N blocks, 5 K steps on 3 stages
    # the bench configuration's shape, shrunk: two consumer warpgroups, 128-row A tiles (64-row slices)
    (136, 256, 128, {"block_M": 128, "block_N": 128, "num_stages": 3, "threads": 256}),
])
def test_cluster_gemm_matches_float64(M, N, K, extra):
    params = _params(M, N, K, **extra)
    out, ref, emu = _run(params)
    program = emu.launcher.program
    assert program.cluster == 2 and "__cluster_dims__(2, 1, 1)" in program.source
    assert emu.launcher.last_variant == "tma"
    n_blocks = -(-N // params["block_N"])
    assert emu.launcher.last_grid == (-(-n_blocks // 2) * 2, -(-M // params["block_M"]))
    assert _close(out, ref), (out.double() - ref).abs().max()


def test_generated_protocol():
    """What the ring looks like: the shared A map boxes half the rows, the multicast goes to both
    CTAs, the full barrier expects the whole A tile plus B, empty barriers count both CTAs'
    consumers, releases go to both CTAs, and the ring meets at cluster barriers (entry, exit)."""
    program = render_cuda(SPEC.factory(**{k: v for k, v in _params(100, 160, 192).items() if k != "M"}).ir,
                          "sm_90a")
    src = program.source
    a_map = next(m for m in program.tensor_maps if m.buffer == "A")
    assert a_map.box == (32, 64)  # 32 of the 64 rows: one CTA's slice
    assert src.count("kf::tma_load_2d_multicast(") == 1 and "(uint16_t)3u)" in src
    assert "kf_cta_rank * 2048u" in src and "(int32_t)kf_cta_rank * 32" in src
    assert "kf::mbarrier_arrive_expect_tx(kf_bars0 + kf_j2 % 2, 16384u)" in src  # 64x64 A + 64x64 B, bf16
    assert "kf::mbarrier_init(kf_bars0 + 2 + kf_s, 256)" in src  # 128 consumers x 2 CTAs
    assert src.count("kf::mbarrier_arrive_cluster(") == 1 and "kf::mbarrier_arrive(" not in src
    assert src.count("kf::cluster_sync();") == 4  # entry and exit, in each role
    assert "KF_CTA_SMEM(kf_smem);" in src and "extern __shared__" not in src


@pytest.mark.parametrize("arch,N", [("sm_90a", 64), ("sm_80", 160), ("sm_100a", 160)])
def test_shapes_and_archs_without_a_cluster_render_as_before(arch, N):
    """A request that cannot be honoured renders the kernel exactly as without it (its name aside)."""
    asked = dict(TILES, N=N, K=192, cluster=2)
    plain = dict(asked, cluster=0)
    program = render_cuda(SPEC.factory(**asked).ir, arch)
    assert program.cluster == 1
    before = render_cuda(SPEC.factory(**plain).ir, arch).source
    assert program.source.replace("_c2", "") == before


@pytest.mark.parametrize("arch,N,why", [("sm_90a", 64, "one CTA along grid x"),
                                        ("sm_100a", 160, "warp-specialized"), ("sm_80", 160, "warp-specialized")])
def test_fallback_reasons(arch, N, why):
    program = render_cuda(SPEC.factory(**dict(TILES, N=N, K=192, cluster=2)).ir, arch)
    assert program.cluster == 1 and why in program.cluster_reason
    assert render_cuda(SPEC.factory(**dict(TILES, N=N, K=192)).ir, arch).cluster_reason == ""


def test_launch_grid_rounds_x_only():
    assert cluster.launch_grid((3, 5), 2) == (4, 5) and cluster.launch_grid((4, 1, 7), 2) == (4, 1, 7)
    assert cluster.launch_grid((3, 5), 1) == (3, 5)


# ---------------------------------------------------------------- planted bugs

# each bug under the schedule that decides its race (tests/emu/planted.py, CLUSTER_SCHEDULES)
BUGS = {
    "release_own_cta_only": ("consumer_late", lambda s: re.sub(r"(kf::mbarrier_arrive_cluster\([^;]*), kf_r\);",
                                                              r"\1, kf_cta_rank);", s)),
    "expect_tx_own_half_only": ("producer_late", lambda s: s.replace(", 16384u);", ", 12288u);")),
}


@pytest.fixture(scope="module")
def planted():
    params = _params(100, 160, 192)
    ir = SPEC.factory(**{k: v for k, v in params.items() if k != "M"}).ir
    return params, cluster_planted("cluster_gemm_planted", ir, "sm_90a", BUGS)


@pytest.mark.parametrize("schedule", sorted(CLUSTER_SCHEDULES))
def test_perturbed_clean_copy_passes(planted, schedule):
    params, module = planted
    out, ref, _ = _run(params, module.kernel(f"clean_{schedule}", timeout_ms=20_000))
    assert _close(out, ref)


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_planted_bug_fails(planted, bug):
    params, module = planted
    try:
        out, ref, _ = _run(params, module.kernel(bug, timeout_ms=3_000))
    except EmulationError:
        return
    assert not _close(out, ref), f"planted {bug} went unnoticed"


# ---------------------------------------------------------------- the persistent grouped GEMM

GROUPED = all_specs()["m_grouped_gemm_nt_contiguous"]
# the masked layout: A is 3-D ([group, max_m, K]: a 3-D multicast) and the persistent walk visits
# each group's live row tiles only
MASKED = all_specs()["m_grouped_gemm_nt_masked"]
LAYOUTS = {"contiguous": dict(group_rows=[5, 0, 70, 130], alignment=64),
           "masked": dict(masked_rows=[40, 0, 128, 70], max_m=128)}


def _grouped(N: int, sm_count: int, source=None, layout: str = "contiguous") -> tuple[list, list, object]:
    """(emulated outputs, interpreter outputs, kernel) of the persistent clustered grouped GEMM:
    four experts (:data:`LAYOUTS`), 64-row tiles, 32-column N tiles, ``sm_count`` SMs."""
    spec = GROUPED if layout == "contiguous" else MASKED
    params = dict(LAYOUTS[layout], num_groups=4, N=N, K=192, block_M=64, block_N=32,
                  block_K=64, num_stages=2, persistent=2, cluster=2)
    inputs = spec.make_inputs(params, 0, "cpu")
    oracle = [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]
    emu = kernforge.compile(spec.factory, backend="cuda-emu", arch="sm_90a", **params)
    emu.launcher.sm_count = sm_count
    if source is not None:
        emu.launcher.emulated = source
    for i in spec.outputs:  # poisoned: a tile no CTA runs shows
        inputs[i].fill_(float("nan"))
        oracle[i].copy_(inputs[i])
    emu(*inputs)
    kernforge.compile(spec.factory, backend="interp", **params)(*oracle)
    outs = [inputs[i].float().numpy() for i in spec.outputs]
    return outs, [oracle[i].float().numpy() for i in spec.outputs], emu


@pytest.mark.parametrize("N,sm_count,grid,layout", [
    (64, 3, (2,), "contiguous"),  # 2 N tiles: one cluster walks every (row tile, N pair); an SM idles
    (96, 4, (4,), "contiguous"),  # 3 N tiles: the second tile of each row's last pair is padding
    (96, 2, (2,), "contiguous"),  # one cluster, every unit
    (96, 4, (4,), "masked"),      # live row tiles only, padded pairs, 3-D A
])
def test_persistent_clusters_pair_adjacent_n_tiles(N, sm_count, grid, layout):
    got, want, emu = _grouped(N, sm_count, layout=layout)
    program = emu.launcher.program
    assert program.persistent and program.cluster == 2 and emu.launcher.last_grid == grid
    src = program.source
    rank = 2 if layout == "contiguous" else 3
    assert "kf_tbx = kf_tbx * 2 + (int32_t)kf_cta_rank;" in src and f"kf::tma_load_{rank}d_multicast(" in src
    assert src.count("kf::cluster_sync();") == 2  # after the init, before the invalidation
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=2.0 ** -7, atol=1e-3)


def test_persistent_launch_is_whole_clusters():
    from kernforge.backends.cuda import persistent

    assert persistent.launch_grid((3, 5), 132, 2) == (20,)  # 2 x 5 units, 10 clusters
    assert persistent.launch_grid((3, 5), 7, 2) == (6,)      # 3 clusters fit 7 SMs
    assert persistent.launch_grid((3, 5), 7) == (7,)
    with pytest.raises(ValueError, match="sm_count"):
        persistent.launch_grid((3, 5), 1, 2)


def test_persistent_planted_bug_same_tile_for_both_ctas():
    """Both CTAs of a cluster on the same N tile: the odd N tiles are never written."""
    params = dict(num_groups=4, N=96, K=192, block_M=64, block_N=32, block_K=64, num_stages=2, persistent=2,
                  cluster=2)
    ir = GROUPED.factory(**params).ir
    clean = CudaEmuBackend().source(ir, "sm_90a")
    mutated = clean.replace("kf_tbx = kf_tbx * 2 + (int32_t)kf_cta_rank;", "kf_tbx = kf_tbx * 2;")
    assert mutated != clean
    module = EmulatedModule("cluster_grouped_planted", renamed(mutated, "bug", ir.name),
                            dynamic_smem=cluster_smem_bytes(render_cuda(ir, "sm_90a").dynamic_smem, 2), arch="sm_90a")
    got, want, _ = _grouped(96, 4, module.kernel("bug", timeout_ms=5_000))
    assert not all(np.allclose(g, w, rtol=2.0 ** -7, atol=1e-3) for g, w in zip(got, want))


def test_a_ring_behind_a_branch_on_bx_is_not_clustered():
    """A cluster's CTAs must run the same ring iterations (every barrier and multicast takes both):
    a ring inside ``if bx < 2`` (or with bounds on bx) falls back, with the reason."""
    program = render_cuda(gated_ring_gemm("bx", N=192).ir, "sm_90a")
    assert "setmaxnreg" in program.source, "the ring is no longer warp-specialized: the test lost its point"
    assert program.cluster == 1 and "depend on bx" in program.cluster_reason


def test_a_launch_tma_cannot_read_runs_the_unclustered_cp_async_variant():
    """K = 68: A's rows are 136 bytes, not a multiple of 16, so the launch runs the cp.async
    variant (no cluster, the logical grid) and still matches."""
    out, ref, emu = _run(_params(70, 192, 68))
    assert emu.launcher.program.cluster == 2 and emu.launcher.last_variant == "cp.async"
    assert _close(out, ref), (out.double() - ref).abs().max()
