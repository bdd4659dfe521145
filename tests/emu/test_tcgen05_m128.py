"""sm_100a: ``M = 128`` tcgen05 MMAs (issue 21, item 6).

Where every accumulator of a kernel is a tcgen05 gemm's with 128-row blocks (and no online
softmax reads one), the plan gives them tcgen05's M = 128 row order (``AccumLayout.m128``: TMEM
lane r holds row r, warp w reads lanes 32 * (w % 4) ..) and each 128-row block is one
``M = 128`` MMA.  Checked here: the row order (a bijection in which every warp reads only its own
lane quarter), which kernels take it, the library GEMMs against the interpreter and an MN-major
dense GEMM against float64 torch on cuda-emu, and planted bugs (the read-back's lane offset, the
instruction descriptor's M, the read-back's block index) that must be caught.  "CUDA semantics
verified on host emulation", never GPU verified.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import kernforge
from kernforge.backends.cuda.layouts import AccumLayout
from kernforge.backends.cuda_emu.backend import CudaEmuBackend
from kernforge.codegen.renderer import Target
from kernforge.kernels.gemm.kernel import dense_gemm
from kernforge.kernels.registry import all_specs
from tests.emu.planted import agree, assert_caught, plant, run

SPECS = all_specs()
CASES = {
    "m_grouped_gemm_nt_contiguous": dict(group_rows=[5, 0, 130], alignment=128, num_groups=3, N=64, K=192,
                                         block_M=128, block_N=32, block_K=64),
    "m_grouped_gemm_nt_masked": dict(masked_rows=[20, 0, 128], max_m=128, num_groups=3, N=64, K=128, block_M=128,
                                     block_N=32, block_K=64),
    # e4m3 kind::f8f6f4 at M = 128, 8 warps (two warpgroups share each lane quarter)
    "m_grouped_fp8_gemm_nt_contiguous": dict(group_rows=[40, 0, 9], alignment=128, num_groups=3, N=128, K=256,
                                             block_M=128, block_N=64, threads=256),
    "fp8_gemm_nt": dict(M=140, N=64, K=264, block_M=128, block_N=64, threads=256),
    # FP4 B decoded into an e4m3 tile in shared memory, then the same M = 128 MMAs
    "fp8_fp4_gemm_nt": dict(M=140, N=64, K=256, block_M=128, block_N=64, threads=256),
    "m_grouped_fp8_gemm_nt_masked": dict(masked_rows=[40, 0, 128], max_m=128, num_groups=3, N=64, K=256,
                                         block_M=128, block_N=64, threads=256),
    "m_grouped_fp8_fp4_gemm_nt_contiguous": dict(group_rows=[40, 0, 9], alignment=128, num_groups=3, N=64, K=256,
                                                 block_M=128, block_N=64, threads=256),
    "m_grouped_fp8_fp4_gemm_nt_masked": dict(masked_rows=[40, 0, 128], max_m=128, num_groups=3, N=64, K=256,
                                             block_M=128, block_N=64, threads=256),
    # two 128-row blocks per tile
    "bf16_gemm_nt": dict(M=300, N=96, K=264, block_M=256, block_N=32, block_K=64, threads=128, dtype="bfloat16",
                         out_dtype="bfloat16"),
}


def _plan(ir):
    return CudaEmuBackend().renderer.lower(ir, Target("cuda-emu", "sm_100a"))[1]["layouts"]


@pytest.mark.parametrize("m, wm, warps", [(128, 4, 4), (256, 4, 4), (128, 8, 8), (256, 8, 8), (256, 4, 8)])
def test_m128_rows_are_a_bijection_within_each_warps_lane_quarter(m, wm, warps):
    lay = AccumLayout(m, 32, wm, warps // wm, warps, m128=True)
    owners: dict[int, set] = {}
    for tid in range(warps * 32):
        warp = tid // 32
        for r in range(lay.regs):
            row = eval(lay.coords(str(r), str(tid))[0].replace("/", "//"))  # noqa: S307 - our own C expression
            assert 32 * (warp % 4) <= row % 128 < 32 * (warp % 4) + 32, (tid, r, row)
            owners.setdefault(row, set()).add((warp, tid % 4, r % 4 // 2))
            assert eval(lay.rows.row(lay.row_reg(str(r)), str(tid)).replace("/", "//")) == row  # noqa: S307
    assert sorted(owners) == list(range(m))
    assert all(len(o) == 4 * (warps // wm) for o in owners.values())  # each row: 4 threads per warp column


@pytest.mark.parametrize("name", sorted(CASES))
def test_m128_library_kernel_matches_interp(name):
    spec, params = SPECS[name], CASES[name]
    plan = _plan(spec.factory(**params).ir)
    lays = [plan.registers[g.c.buffer] for g, k in plan.gemm_kind.items() if k == "tcgen05"]
    assert lays and all(lay.m128 for lay in lays), "the case no longer exercises M = 128"
    source = CudaEmuBackend().source(spec.factory(**params).ir, "sm_100a")
    idescs = re.findall(r"kf::tcgen05_mma_\w+\([^;]*?(0x[0-9a-f]{8})u", source)
    assert idescs and all((int(d, 16) >> 24) & 31 == 128 >> 4 for d in idescs)
    inputs = spec.make_inputs(params, 0, "cpu")
    oracle = [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]
    kernforge.compile(spec.factory, backend="cuda-emu", arch="sm_100a", **params)(*inputs)
    kernforge.compile(spec.factory, backend="interp", **params)(*oracle)
    for i in spec.outputs:
        assert not torch.isnan(oracle[i]).all(), "oracle wrote nothing"
        np.testing.assert_allclose(inputs[i].float().numpy(), oracle[i].float().numpy(), rtol=2.0 ** -7, atol=1e-3,
                                   err_msg=f"{name} output {i}")


def test_m128_cp_async_variant_matches_interp():
    """The variant a launch falls back to when its tensors break TMA's rules."""
    name = "m_grouped_gemm_nt_masked"
    spec, params = SPECS[name], CASES[name]
    launcher = CudaEmuBackend().build(spec.factory(**params).ir, Target("cuda-emu", "sm_100a", "cp.async"))
    assert not launcher.program.tensor_maps and "kf_l & 1" in launcher.program.source
    emu = kernforge.compile(spec.factory, backend="cuda-emu", arch="sm_100a", **params)
    emu.launcher.emulated, emu.launcher.tensor_maps = launcher.emulated, ()
    inputs = spec.make_inputs(params, 1, "cpu")
    oracle = [t.clone() if hasattr(t, "clone") else t for t in inputs]
    emu(*inputs)
    kernforge.compile(spec.factory, backend="interp", **params)(*oracle)
    for i in spec.outputs:
        np.testing.assert_allclose(inputs[i].float().numpy(), oracle[i].float().numpy(), rtol=2.0 ** -7, atol=1e-3)


def test_softmax_and_64_row_accumulators_keep_the_wgmma_order():
    mla = dict(batch=2, seqlens=[37, 5], heads=128, heads_kv=1, seq_q=1, dim=96, dim_v=64, page_size=16,
               causal=False, block_N=16, block_H=128)
    plan = _plan(SPECS["mla_decode"].factory(**mla).ir)
    assert "tcgen05" in plan.gemm_kind.values()
    assert not any(getattr(lay, "m128", False) for lay in plan.registers.values())
    small = dict(CASES["bf16_gemm_nt"], block_M=64)
    assert not any(getattr(lay, "m128", False) for lay in _plan(SPECS["bf16_gemm_nt"].factory(**small).ir)
                   .registers.values())


@pytest.mark.parametrize("a_major, b_major", [("mn", "mn"), ("mn", "k")])
def test_m128_mn_major_operands_match_float64(a_major, b_major):
    M, N, K = 140, 96, 200
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(M, K, generator=g).bfloat16(), torch.randn(N, K, generator=g).bfloat16()
    A = a if a_major == "k" else a.T.contiguous()
    B = b if b_major == "k" else b.T.contiguous()
    D = torch.full((M, N), float("nan"), dtype=torch.float32)
    kernel = kernforge.compile(dense_gemm, backend="cuda-emu", arch="sm_100a", N=N, K=K, a_major=a_major,
                               b_major=b_major, out_dtype="float32", block_M=128, block_N=32, block_K=64,
                               threads=256)
    assert "kf_l & 1" in kernel.launcher.program.source  # the M = 128 read-back
    kernel(A, B, D)
    torch.testing.assert_close(D.double(), a.double() @ b.double().T, rtol=1e-5, atol=1e-4)


# ---------------------------------------------------------------- planted bugs

GEMM = "bf16_gemm_nt"  # two 128-row blocks: the block index matters too


def _layout_f_lanes(src):  # read back as M = 64 would: the second 16 lanes of a quarter never read
    return src.replace(" + 16 * (kf_l & 1))", ")", 1)


def _idesc_m64(src):  # the MMA writes layout F (64 rows) while the read-back expects layout D
    def shrink(m):
        return m.group(0).replace(m.group(1), f"{int(m.group(1), 16) - (4 << 24):#010x}")
    return re.sub(r"kf::tcgen05_mma_f16\([^;]*?, (0x[0-9a-f]{8})u,", shrink, src, count=1)


def _block_index(src):  # every 16-row slice read from block L instead of L / 2
    return src.replace("kf_b = kf_l >> 1;", "kf_b = kf_l & 1;", 1)


BUGS = {"layout_f_lanes": (_layout_f_lanes, None), "idesc_m64": (_idesc_m64, None),
        "read_back_block_index": (_block_index, None)}


@pytest.fixture(scope="module")
def planted():
    return plant(SPECS[GEMM], CASES[GEMM], "sm_100a", BUGS, "emu_test_tcgen05_m128_planted", timeout_ms=5_000)


def test_unmutated_copy_passes_the_harness(planted):
    assert agree(run(planted, "clean"))


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_planted_m128_bug_is_caught(planted, bug):
    assert_caught(planted, bug, BUGS)
