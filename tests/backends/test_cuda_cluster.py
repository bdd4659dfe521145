"""Thread-block clusters on the CUDA backend: the multicast plan (kernforge.backends.cuda.cluster)
and the device primitives (kf/cluster.cuh) built with nvcc, no GPU.  The cluster GEMM of
tests/emu/cluster_kernels.py must compile for sm_90a and sm_100a with no spills, and its SASS must
hold the multicast TMA load (``UTMALDG.2D.MULTICAST``), the cluster barrier
(``UCGABAR_ARV``/``UCGABAR_WAIT``) and the remote mbarrier arrive (``SYNCS.ARRIVE...RED``).
Its results are checked on cuda-emu (tests/emu/test_cluster.py)."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from hypothesis import given, settings, strategies as st

from kernforge.backends.cuda import backend as cuda_backend, sass_report
from kernforge.backends.cuda.cluster import plan_multicast
from kernforge.backends.cuda.renderer import INCLUDE_DIR
from tests.emu.cluster_kernels import CLUSTER_GEMM


def test_odd_grid_is_padded_to_whole_clusters():
    plan = plan_multicast("sm_90a", (3, 5), 128, 128)
    assert (plan.size, plan.launch_grid, plan.slice_rows, plan.cta_mask) == (2, (4, 5), 64, 0b11)
    assert plan.dims == (2, 1, 1) and plan.attribute == "__cluster_dims__(2, 1, 1)"
    assert [plan.slice_offset(r) for r in range(2)] == [0, 64]
    assert plan.expect_tx(128 * 128, 64 * 128) == 128 * 128 + 64 * 128  # the whole shared tile lands in each CTA


@pytest.mark.parametrize("arch,grid,rows,row_bytes,swizzle,why", [
    ("sm_80", (4, 1), 128, 128, 0, "no thread-block clusters"),
    ("sm_90a", (1, 8), 128, 128, 0, "one CTA along grid x"),
    ("sm_90a", (4, 1), 63, 128, 0, "do not split"),
    ("sm_90a", (4, 1), 2, 64, 0, "128-byte TMA destination alignment"),  # a 1-row slice: 64 bytes
    ("sm_90a", (4, 1), 16, 64, 128, "1024-byte"),  # 8 rows x 64 bytes: fine unswizzled, not with a swizzle
    ("sm_100a", (4, 1), 1024, 128, 0, "256-row box"),
])
def test_shapes_that_cannot_share_fall_back_to_a_single_cta(arch, grid, rows, row_bytes, swizzle, why):
    plan = plan_multicast(arch, grid, rows, row_bytes, swizzle=swizzle)
    assert plan.size == 1 and plan.launch_grid == grid and plan.attribute == ""
    assert why in plan.reason


@pytest.mark.parametrize("kwargs,match", [
    (dict(grid=(0, 1), shared_rows=64, row_bytes=64), "grid"),
    (dict(grid=(2, 1), shared_rows=64, row_bytes=64, size=3), "cluster size"),
    (dict(grid=(2, 1), shared_rows=0, row_bytes=64), "shared tile"),
])
def test_bad_arguments_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        plan_multicast("sm_90a", **kwargs)
    with pytest.raises(ValueError, match="rank"):
        plan_multicast("sm_90a", (2, 1), 64, 64).slice_offset(2)


@settings(max_examples=60, deadline=None)
@given(gx=st.integers(1, 40), gy=st.integers(1, 4), rows=st.sampled_from([8, 16, 32, 64, 128, 256]),
       row_bytes=st.sampled_from([16, 32, 64, 128]), size=st.sampled_from([2, 4]))
def test_plan_covers_the_grid_and_the_shared_tile(gx, gy, rows, row_bytes, size):
    plan = plan_multicast("sm_90a", (gx, gy), rows, row_bytes, size=size)
    if plan.size == 1:
        assert plan.launch_grid == (gx, gy)
        return
    lx = plan.launch_grid[0]
    assert lx % size == 0 and gx <= lx < gx + size and plan.launch_grid[1:] == (gy,)
    covered = sorted(r for rank in range(size) for r in range(plan.slice_offset(rank),
                                                              plan.slice_offset(rank) + plan.slice_rows))
    assert covered == list(range(rows))  # the slices tile the shared rows exactly once
    assert (plan.slice_rows * row_bytes) % 128 == 0


def _sass(tmp_path, arch: str) -> list:
    src, cubin = tmp_path / "cgemm.cu", tmp_path / f"cgemm_{arch}.cubin"
    src.write_text(CLUSTER_GEMM)
    proc = subprocess.run(["nvcc", f"-arch={arch}", "-cubin", "-Xptxas", "-v", f"-I{INCLUDE_DIR}", "-o", str(cubin),
                           str(src)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"0 bytes spill stores, 0 bytes spill loads", proc.stderr), proc.stderr
    try:
        sass = cuda_backend.disassemble(str(cubin))
    except Exception as e:  # noqa: BLE001 - cuobjdump missing: the build check above still ran
        pytest.skip(f"cuobjdump unavailable: {e}")
    (k,) = sass_report.parse(sass)
    return k.instrs


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_cluster_gemm_sass_has_multicast_tma_and_cluster_barriers(tmp_path, arch):
    instrs = _sass(tmp_path, arch)
    ops = [i.opcode for i in instrs]
    # one multicast A slice and one own B tile per fill (prologue and steady state)
    assert ops.count("UTMALDG.2D.MULTICAST") == 2, ops
    assert ops.count("UTMALDG.2D") == 2, ops
    assert ops.count("UCGABAR_ARV") == 2 and ops.count("UCGABAR_WAIT") == 2, ops  # after init, before exit
    assert any(o.startswith("SYNCS.ARRIVE.TRANS64.RED") for o in ops), ops  # release to a peer's empty barrier


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("name,cluster_syncs,multicast", [
    ("bf16_gemm_nt", 2, "UTMALDG.2D.MULTICAST"),  # persistent: set-up and teardown
    ("m_grouped_gemm_nt_contiguous", 2, "UTMALDG.2D.MULTICAST"),
    ("m_grouped_gemm_nt_masked", 2, "UTMALDG.3D.MULTICAST"),
    ("fp8_gemm_nt", 2, "UTMALDG.2D.MULTICAST"),
    ("m_grouped_fp8_gemm_nt_contiguous", 2, "UTMALDG.2D.MULTICAST"),
    ("m_grouped_fp8_gemm_nt_masked", 2, "UTMALDG.3D.MULTICAST"),
])
def test_library_gemm_sass_has_multicast_tma_and_cluster_barriers(name, cluster_syncs, multicast):
    """The dense bf16 GEMM, the persistent grouped contiguous and masked (3-D A) bf16 GEMMs and their
    FP8 counterparts (QGMMA, the promotion ring releasing to both CTAs; the dense GEMMs persistent) at
    their bench configurations (whose configs ask for ``cluster=2``; the dense ones with ``multicast="b"``,
    clusters of adjacent M blocks), generated for sm_90a: one multicast slice (A's, the dense GEMMs' B) and
    one own load of the other operand per fill, the cluster barriers (the dense ring's entry and exit in
    both roles; the persistent kernel's set-up and teardown), the release to both CTAs' empty
    barriers, and no spills or serialized wgmma."""
    from kernforge.kernels.registry import all_specs

    spec = all_specs()[name]
    params = dict(spec.problems["bench"].params)
    assert params.get("cluster") == 2, "the bench configuration no longer asks for a cluster"
    report = cuda_backend.build_report(spec.factory(**params).ir, "sm_90a", report=True)
    assert not (report["spill_stores"] or report["spill_loads"] or report["local_bytes"]) and not report["advisories"]
    try:
        sass = cuda_backend.disassemble(report["path"])
    except Exception as e:  # noqa: BLE001 - cuobjdump missing: the build check above still ran
        pytest.skip(f"cuobjdump unavailable: {e}")
    ops = [i.opcode for k in sass_report.parse(sass) for i in k.instrs]
    # the grouped GEMM's B is 3-D ([expert, N, K]): its own load is a UTMALDG.3D
    own = [o for o in ops if o.startswith("UTMALDG.") and not o.endswith(".MULTICAST")]
    assert ops.count(multicast) == 1 and len(own) == 1, ops
    assert ops.count("UCGABAR_ARV") == cluster_syncs and ops.count("UCGABAR_WAIT") == cluster_syncs, ops
    assert any(o.startswith("SYNCS.ARRIVE.TRANS64.RED") for o in ops), ops
