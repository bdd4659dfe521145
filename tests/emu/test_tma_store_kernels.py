"""Library GEMMs whose epilogue the renderer lowers to STSM + TMA stores on sm_90a and sm_100a
(kernforge/backends/cuda/tma_store.py), at small sizes on cuda-emu against the interpreter: the
plain and the warp-specialized variants, bf16 and fp32 outputs, tiles that overhang the output
(TMA clips them), and on sm_100a the tcgen05 accumulators in both row orders (64-row wgmma order
and the M = 128 order, whose warps stage 16-row slices of other 64-row blocks).  The sources are
checked to take the path (so a planner change that silently drops it fails here), and the launch
to run the TMA variant."""
import numpy as np
import pytest
import torch

import kernforge
from kernforge.backends.cuda.renderer import render_cuda
from kernforge.kernels.registry import all_specs

SPECS = all_specs()

CASES = {
    # one consumer warpgroup (+ producer), 64 x 64 tiles, M and N overhanging the last tile
    "bf16_ws": ("bf16_gemm_nt", dict(M=100, N=96, K=128, block_M=64, block_N=64, block_K=64, dtype="bfloat16",
                                     out_dtype="bfloat16")),
    # native fp8 wgmma with per-128-K promotion (a promotion ring) before the epilogue
    "fp8_ws": ("fp8_gemm_nt", dict(M=100, N=96, K=256, block_M=64, block_N=64)),
    # no producer warpgroup (the fp4 decode keeps its ring block-synchronised)
    "fp8_fp4_plain": ("fp8_fp4_gemm_nt", dict(M=100, N=96, K=256, block_M=64, block_N=64)),
    # fp32 output: st.shared.v2 staging, 128-byte swizzled slabs of 32 columns; a single-stage ring
    "f32_plain": ("bf16_gemm_nt", dict(M=72, N=64, K=64, block_M=64, block_N=64, block_K=64, num_stages=1,
                                       dtype="bfloat16", out_dtype="float32")),
    # producer warpgroup + two consumer warpgroups (the bench configuration's shape, shrunk)
    "bf16_2wg_ws": ("bf16_gemm_nt", dict(M=136, N=192, K=128, block_M=128, block_N=128, block_K=64, num_stages=3,
                                         threads=256, dtype="bfloat16", out_dtype="bfloat16")),
    "grouped_ws": ("m_grouped_gemm_nt_contiguous", dict(group_rows=[128, 0, 256], alignment=128, num_groups=3, N=128,
                                                        K=128, block_M=128, block_N=128, num_stages=3, block_K=64)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_tma_store_epilogue_matches_interp(case):
    name, params = CASES[case]
    spec = SPECS[name]
    program = render_cuda(spec.factory(**params).ir, "sm_90a")
    assert "kf::epilogue_tma_store<" in program.source and any("store" in t.name for t in program.tensor_maps)
    assert ("setmaxnreg" in program.source) == case.endswith("_ws")
    emu_inputs = spec.make_inputs(params, 0, "cpu")
    ref_inputs = [t.clone() if isinstance(t, torch.Tensor) else t for t in emu_inputs]
    for i in spec.outputs:  # poisoned, in the output dtype the case asks for: an element the epilogue misses shows
        dt = getattr(torch, params["out_dtype"]) if "out_dtype" in params else emu_inputs[i].dtype
        emu_inputs[i] = torch.full(emu_inputs[i].shape, float("nan"), dtype=dt)
        ref_inputs[i] = emu_inputs[i].clone()
    emu = kernforge.compile(spec.factory, backend="cuda-emu", arch="sm_90a", **params)
    emu(*emu_inputs)
    assert emu.launcher.last_variant == "tma"
    kernforge.compile(spec.factory, backend="interp", **params)(*ref_inputs)
    for i in spec.outputs:
        got, want = emu_inputs[i].float().numpy(), ref_inputs[i].float().numpy()
        np.testing.assert_allclose(got, want, rtol=2.0 ** -7, atol=1e-3, err_msg=f"{case} output {i}")


def test_two_warp_columns_fp32_epilogue_matches_interp():
    """softmax(Q K^T) written as fp32 by a 4 x 2 warp grid: each warp column's 64 x 32 block is its
    own staging block and TMA box (kf_wc > 0), after a row reduction across the warp columns."""
    from tests.backends.test_cuda_semantics import scores_softmax

    pf = scores_softmax()
    assert "kf::epilogue_st_f32<32, 128>" in render_cuda(pf.ir, "sm_90a").source
    g = torch.Generator().manual_seed(5)
    q, k = torch.randn(64, 64, generator=g).bfloat16(), torch.randn(64, 64, generator=g).bfloat16()
    got, want = torch.full((64, 64), float("nan")), torch.full((64, 64), float("nan"))
    emu = kernforge.compile(pf, backend="cuda-emu", arch="sm_90a")
    emu(q, k, got)
    assert emu.launcher.last_variant == "tma"
    kernforge.compile(pf, backend="interp")(q, k, want)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


def test_rank3_output_tiles_are_clipped_per_dimension():
    """D[e, m0:m0 + 64, :] of a rank-3 output (3 x 100 rows): the second row block overhangs the
    100 rows of each ``e`` and must be clipped there, not spill into ``e + 1``'s rows (which a
    rank-2 view of the same memory would allow); the TMA variant must have run."""
    from tests.codegen.test_cuda_tma_store import _batched_gemm

    pf = _batched_gemm()
    assert "kf::epilogue_tma_store<" in render_cuda(pf.ir, "sm_90a").source
    g = torch.Generator().manual_seed(9)
    a, b = torch.randn(3, 64, 64, generator=g).bfloat16(), torch.randn(64, 64, generator=g).bfloat16()
    got = torch.full((3, 100, 64), float("nan"), dtype=torch.bfloat16)
    emu = kernforge.compile(pf, backend="cuda-emu", arch="sm_90a")
    emu(a, b, got)
    assert emu.launcher.last_variant == "tma"
    want = torch.einsum("emk,nk->emn", a.double(), b.double())
    for e in range(3):  # rows 64..99 of every e come from its own tile (row 0..35 of block 1)
        np.testing.assert_allclose(got[e].float().numpy(), want[e, :, :].repeat(2, 1)[:100].numpy(),
                                   rtol=2.0 ** -7, atol=1e-2)


SM100_CASES = {
    # M = 128 order, four warps: 256-row tiles are two 128-row blocks (L = 0..3: both slices of both
    # lane-quarter halves), 128-byte swizzled slabs, M and N overhanging
    "m128_two_blocks": ("bf16_gemm_nt", dict(M=300, N=96, K=128, block_M=256, block_N=64, block_K=64, threads=128,
                                             dtype="bfloat16", out_dtype="bfloat16")),
    # M = 128 order with two warpgroups (kf_wg = 1 stages the odd 16-row slices), native e4m3
    "m128_8warps_fp8": ("fp8_gemm_nt", dict(M=140, N=96, K=256, block_M=128, block_N=64, threads=256)),
    # fp32 output in the M = 128 order: st.shared.v2 with the slice argument, 32-column slabs
    "m128_f32": ("bf16_gemm_nt", dict(M=136, N=64, K=64, block_M=128, block_N=64, block_K=64, threads=128,
                                      dtype="bfloat16", out_dtype="float32")),
    # 64-row tiles keep the wgmma order (M = 64 tcgen05 MMAs): the helpers' default slice
    "m64": ("bf16_gemm_nt", dict(M=100, N=96, K=128, block_M=64, block_N=64, block_K=64, dtype="bfloat16",
                                 out_dtype="bfloat16")),
    # M = 128 order in a persistent loop (3 CTAs, 8 tiles): the deferred wait before each restaging
    "m128_persistent": ("m_grouped_gemm_nt_contiguous", dict(group_rows=[5, 0, 130, 70], alignment=128,
                                                             num_groups=4, N=128, K=128, block_M=128, block_N=64,
                                                             block_K=64, num_stages=2, persistent=2)),
    # the persistent tile loop on 3 CTAs for 12 tiles: one staging tile reused by every tile of a CTA
    "persistent": ("m_grouped_gemm_nt_contiguous", dict(group_rows=[5, 0, 70, 130], alignment=64, num_groups=4,
                                                        N=128, K=192, block_M=64, block_N=64, block_K=64,
                                                        num_stages=2, persistent=2)),
}


def _guarded(shape, dtype, guard_rows=7):
    """A NaN output whose memory continues with NaN guard rows: a box that is not clipped at the
    output's last dimension-1 extent writes into them."""
    whole = torch.full((shape[0] + guard_rows, *shape[1:]), float("nan"), dtype=dtype)
    return whole[:shape[0]], whole[shape[0]:]


@pytest.mark.parametrize("case", list(SM100_CASES))
def test_sm100a_tma_store_epilogue_matches_interp(case):
    """sm_100a (tcgen05: TMEM -> registers -> stmatrix / st.shared -> TMA store), poisoned outputs
    with guard rows after them, against the interpreter."""
    name, params = SM100_CASES[case]
    spec = SPECS[name]
    program = render_cuda(spec.factory(**params).ir, "sm_100a")
    assert "kf::tcgen05_mma_" in program.source and "kf::epilogue_tma_store<" in program.source
    assert ("const int kf_q = " in program.source) == case.startswith("m128"), "row order of the case changed"
    assert "kf::store_pair" not in program.source
    emu_inputs = spec.make_inputs(params, 1, "cpu")
    ref_inputs = [t.clone() if isinstance(t, torch.Tensor) else t for t in emu_inputs]
    guards = []
    for i in spec.outputs:
        dt = getattr(torch, params["out_dtype"]) if "out_dtype" in params else emu_inputs[i].dtype
        emu_inputs[i], guard = _guarded(emu_inputs[i].shape, dt)
        guards.append(guard)
        ref_inputs[i] = torch.full(emu_inputs[i].shape, float("nan"), dtype=dt)
    emu = kernforge.compile(spec.factory, backend="cuda-emu", arch="sm_100a", **params)
    assert bool(emu.launcher.program.persistent) == ("persistent" in params)
    if "persistent" in params:  # the deferred wait (tma_store.lazy) and the final one
        assert "kf::bulk_wait_group_read<0>();  // the last tile's TMA stores" in program.source
    emu.launcher.sm_count = 3
    emu(*emu_inputs)
    assert emu.launcher.last_variant == "tma"
    assert all(torch.isnan(g).all() for g in guards), "the epilogue wrote past the output"
    kernforge.compile(spec.factory, backend="interp", **params)(*ref_inputs)
    for i in spec.outputs:
        got, want = emu_inputs[i].float().numpy(), ref_inputs[i].float().numpy()
        assert not np.isnan(want).all(), "the interpreter wrote nothing"
        np.testing.assert_allclose(got, want, rtol=2.0 ** -7, atol=1e-3, err_msg=f"{case} output {i}")
