"""The STSM + TMA-store epilogue primitives (kf/tma_store.cuh) build for sm_90a with nvcc and no
GPU: a warpgroup's 64 x 128 accumulator goes out as bf16 (stmatrix, 128-byte swizzle, two TMA
boxes) and as fp32 (st.shared.v2, four boxes) with no spills, and the SASS holds ``STSM`` and
``UTMASTG`` (the bulk tensor store) with no per-element ``STG``.  One small build: CPU is scarce."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from kernforge.backends.cuda import backend as cuda_backend, sass_report
from kernforge.backends.cuda.renderer import INCLUDE_DIR

KERNEL = r'''
#include "kf/tma_store.cuh"
extern "C" __global__ void __launch_bounds__(128, 1) epi(const __grid_constant__ CUtensorMap map_bf16,
                                                         const __grid_constant__ CUtensorMap map_f32, const float* in) {
  extern __shared__ __align__(1024) unsigned char kf_smem[];
  float d[64];
  for (int i = 0; i < 64; ++i) d[i] = in[threadIdx.x * 64 + i];
  kf::epilogue_stsm_bf16<128, 128>(d, kf_smem);
  kf::fence_proxy_async();
  __syncthreads();
  if (threadIdx.x == 0) {
    kf::epilogue_tma_store<128, 128, 2>(&map_bf16, kf_smem, blockIdx.x * 128, 0);
    kf::bulk_wait_group_read<0>();
  }
  __syncthreads();
  kf::epilogue_st_f32<128, 128>(d, kf_smem);
  kf::fence_proxy_async();
  __syncthreads();
  if (threadIdx.x == 0) {
    kf::epilogue_tma_store<128, 128, 4>(&map_f32, kf_smem, blockIdx.x * 128, 0);
    kf::bulk_wait_group_read<0>();
  }
}
'''


def _report(kernel, arch: str) -> dict:
    """``build_report(report=True)`` (SASS counts); the test is skipped when cuobjdump is missing."""
    try:
        return cuda_backend.build_report(kernel, arch, report=True)
    except Exception as e:  # noqa: BLE001 - cuobjdump missing
        if "cuobjdump" not in str(e):
            raise
        pytest.skip(f"cuobjdump unavailable: {e}")


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_epilogue_primitives_build_to_stsm_and_tma_stores(tmp_path):
    src, cubin = tmp_path / "epi.cu", tmp_path / "epi.cubin"
    src.write_text(KERNEL)
    proc = subprocess.run(["nvcc", "-arch=sm_90a", "-cubin", "-Xptxas", "-v", f"-I{INCLUDE_DIR}", "-o", str(cubin),
                           str(src)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"0 bytes spill stores, 0 bytes spill loads", proc.stderr), proc.stderr
    try:
        sass = cuda_backend.disassemble(str(cubin))
    except Exception as e:  # noqa: BLE001 - cuobjdump missing: the build check above still ran
        pytest.skip(f"cuobjdump unavailable: {e}")
    (k,) = sass_report.parse(sass)
    c = sass_report.counts(k.instrs)
    # 128 bf16 columns = 8 stmatrix.x4; boxes: 2 bf16 slabs + 4 fp32 slabs of 128 bytes
    assert (c["stsm"], c["tma_store"], c["stg"]) == (8, 6, 0), c


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_mla_decode_output_leaves_by_tma_store_with_fast_reciprocals():
    """MLA decode (dense, 64 heads in one block) on sm_90a: the output tile goes out as STSM + rank-4
    UTMASTG boxes (only the log-sum-exp rows remain as STG), the row normalisation is one MUFU.RCP per
    T.rcp with no division slow path (no CALL), and ptxas serializes no wgmma (no C7519/C7520)."""
    from kernforge.kernels.mla_decode import mla_decode

    kernel = mla_decode(heads=64, dim=96, dim_v=64, page_size=16, block_N=16, block_H=64).ir
    report = _report(kernel, "sm_90a")
    assert report["advisories"] == [] and report["spill_stores"] == 0, report
    c = report["sass"]
    (k,) = sass_report.parse(cuda_backend.disassemble(report["path"]))
    rcp = sum(i.opcode.startswith("MUFU.RCP") for i in k.instrs)
    # 64 x 64 bf16 over 4 x 2 warps: 2 warp columns of 32 unswizzled columns, one box each; each
    # warp's 64 x 32 block = 2 stmatrix.x4; a row's two T.rcp (sum, sink) per RowLayout register
    assert (c["tma_store"], c["stsm"], c["calls"]) == (2, 2, 0), c
    assert 2 <= rcp <= 8 and c["stg"] <= 2, (rcp, c)


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_sm100a_persistent_grouped_gemm_stores_by_tma():
    """sm_100a (tcgen05, M = 128 row order, persistent with the deferred store wait): the 128 x 128
    bf16 tile leaves as 16 STSM per thread and 4 UTMASTG boxes (2 row blocks x 2 swizzled slabs),
    no STG; no spills, shared memory within sm_100a's 232448-byte limit."""
    from kernforge.kernels.registry import all_specs

    params = dict(group_rows=[128, 0, 256], alignment=128, num_groups=3, N=256, K=128, block_M=128, block_N=128,
                  block_K=64, num_stages=3, persistent=2)
    kernel = all_specs()["m_grouped_gemm_nt_contiguous"].factory(**params).ir
    report = _report(kernel, "sm_100a")
    assert report["spill_stores"] == 0 and report["local_bytes"] == 0, report
    assert report["shared_bytes"] <= 232448, report
    c = report["sass"]
    assert (c["stsm"], c["tma_store"], c["stg"]) == (16, 4, 0) and c["mma_utc"] > 0, c
