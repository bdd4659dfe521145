"""Where the renderer lowers a GEMM epilogue to STSM + TMA stores (kernforge/backends/cuda/tma_store.py),
and where it keeps the plain per-thread stores: the plan is a property of the kernel, the arch and the
variant, and the emitted protocol is stage -> fence + barrier -> one thread stores and waits -> barrier.
Rendering only (fast); cuda-emu runs these kernels in tests/emu/test_tma_store_kernels.py."""
from __future__ import annotations

import pytest

from kernforge.backends.cuda.renderer import CudaRenderer, render_cuda
from kernforge.codegen.renderer import Target
from tests.backends.test_cuda_semantics import gemm


def _stores(program):
    return [(t.buffer, t.box, t.swizzle, t.elem_bytes) for t in program.tensor_maps
            if t.name.startswith("kf_tmap_store_")]


def test_sm_90a_epilogue_protocol_in_order():
    program = render_cuda(gemm().ir, "sm_90a")
    assert _stores(program) == [("C", (64, 64), 128, 2)]
    src = program.source
    assert "kf::store_pair" not in src
    steps = ["kf::epilogue_stsm_bf16<64, 128>(", "kf::fence_proxy_async();", "if (kf_tid == 0) {",
             "kf::epilogue_tma_store<64, 128, 2>(&kf_tmap_store_C_0", "kf::bulk_wait_group_read<0>();",
             "kf::fence_proxy_async();"]
    at = src.index(steps[0])
    for step in steps[1:]:
        nxt = src.index(step, at + 1)
        assert nxt > at, step
        at = nxt
    # the staging tile is 1024-byte aligned inside a 1024-byte aligned arena, and fits the count
    assert "__align__(1024)" in src
    offset = int(src.split("kf::epilogue_stsm_bf16<64, 128>(")[1].split("(kf_smem + ")[1].split(")")[0])
    assert offset % 1024 == 0 and offset + 64 * 64 * 2 <= program.dynamic_smem


def test_narrow_blocks_stage_unswizzled():
    """A 64 x 32 bf16 block is 64-byte rows: one unswizzled box of the whole block."""
    program = render_cuda(gemm(N=64, bn=32).ir, "sm_90a")
    assert _stores(program) == [("C", (64, 32), 0, 2)]
    assert "kf::epilogue_stsm_bf16<32, 0>(" in program.source


@pytest.mark.parametrize("arch, tma", [("sm_80", True), ("sm_90a", False), ("sm_100a", False)])
def test_other_targets_and_the_cp_async_variant_keep_the_plain_epilogue(arch, tma):
    program = render_cuda(gemm().ir, arch, tma=tma)
    assert not _stores(program) and "epilogue_" not in program.source and "kf/tma_store.cuh" not in program.source
    assert "kf::store_pair" in program.source


def test_sm_100a_stages_tcgen05_fragments_in_both_row_orders():
    """sm_100a reads the tcgen05 accumulator from TMEM into the same fragment and takes the same
    epilogue: 64-row tiles in the wgmma order (the helper's own slice), 128-row tiles in the M = 128
    order, where warp w's 16-row slice of block L lands in 64-row block 2 (L >> 1) + (w % 4) / 2."""
    small = render_cuda(gemm().ir, "sm_100a")
    assert _stores(small) == [("C", (64, 64), 128, 2)] and "kf::tcgen05_mma_f16(" in small.source
    assert "kf::epilogue_stsm_bf16<64, 128>(" in small.source and "const int kf_q = " not in small.source
    big = render_cuda(gemm(M=256, N=128, K=128, bm=128, bn=64).ir, "sm_100a").source
    assert "const int kf_q = (kf_tid >> 5) & 3;" in big
    assert "+ ((2 * ((0 + kf_wg) >> 1) + (kf_q >> 1)) * 1 + kf_wc) * 8192, 2 * (kf_q & 1) + ((0 + kf_wg) & 1));" in big


def test_small_tiles_on_mma_sync_keep_the_plain_epilogue():
    """32-row tiles are two warps of rows, not a warpgroup's 64: no wgmma fragment to stage."""
    program = render_cuda(gemm(bm=32, bn=64).ir, "sm_90a")
    assert not _stores(program) and "kf::store_pair" in program.source


def test_no_room_for_the_staging_tile_keeps_the_plain_epilogue():
    """4 stages of 128 x 64 + 64 x 256 bf16 tiles take 192 KiB: a 64 KiB staging tile would pass the
    227 KiB limit, so the epilogue stays per-thread and no output map is passed."""
    kernel = gemm(M=256, N=256, K=256, bm=128, bn=256, bk=64, stages=4).ir
    _, facts = CudaRenderer().lower(kernel, Target("cuda", "sm_90a", "", False))
    assert facts["tma_store"][0]  # planned: dropped for the budget alone
    program = render_cuda(kernel, "sm_90a")
    assert program.dynamic_smem <= 232448
    assert not _stores(program) and "kf::store_pair" in program.source
    assert [t.buffer for t in program.tensor_maps] == ["A", "B"]


def _batched_gemm(out_extent_rows=64):
    """D[e] = A[e] @ B^T written as one 64 x 64 tile of a rank-3 output ``D[e, m0, n0]``
    (``out_extent_rows`` < 64: a copy whose destination is not the whole tile)."""
    import kernforge.dsl as T

    @T.prim_func
    def main(A: T.Tensor((3, 64, 64), "bfloat16"), B: T.Tensor((64, 64), "bfloat16"),
             D: T.Tensor((3, 100, 64), "bfloat16")):
        with T.Kernel(3, 2, threads=128) as (e, by):
            A_s = T.alloc_shared((64, 64), "bfloat16")
            B_s = T.alloc_shared((64, 64), "bfloat16")
            C_l = T.alloc_fragment((64, 64), "float32")
            T.copy(A[e, 0, 0], A_s)
            T.copy(B[0, 0], B_s)
            T.gemm(A_s, B_s, C_l, transpose_B=True, clear_accum=True)
            if out_extent_rows == 64:
                T.copy(C_l, D[e, by * 64, 0])
            else:
                T.copy(C_l[0:out_extent_rows, :], D[e, by * 64:by * 64 + out_extent_rows, :])

    return main


def test_rank3_output_takes_a_rank3_box_with_outer_coordinates():
    """A tile in the last two dimensions of a rank-3 output: box {1, 64, 64} (IR order), and the
    store passes the outer coordinate (``e``) after the tile's (col, row)."""
    program = render_cuda(_batched_gemm().ir, "sm_90a")
    assert _stores(program) == [("D", (1, 64, 64), 128, 2)]
    src = program.source
    assert "const int32_t kf_o0 = (int32_t)(bx);" in src  # e is blockIdx.x
    assert "kf::epilogue_tma_store<64, 128, 2>(&kf_tmap_store_D_0, (kf_smem + " in src and ", kf_o0);" in src


def test_a_partial_tile_of_a_rank3_output_keeps_the_plain_epilogue():
    program = render_cuda(_batched_gemm(out_extent_rows=32).ir, "sm_90a")
    assert not _stores(program) and "epilogue_tma_store" not in program.source


def test_tiles_over_64_kib_are_staged_one_warp_column_per_round():
    """MLA decode's 64 x 512 float32 split partials (128 KiB) beside its KV pipeline: staged and stored
    one 64 x 256 warp column per round through a 64 KiB staging tile, each round fenced, stored,
    waited for and closed by a barrier; the column offset of each round's boxes is its own."""
    from kernforge.kernels.mla_decode import mla_decode

    kernel = mla_decode(heads=128, dim=576, dim_v=512, page_size=64, block_N=32, block_H=64, num_splits=2).ir
    program = render_cuda(kernel, "sm_90a")
    assert _stores(program) == [("Out", (1, 1, 1, 64, 32), 128, 4)]
    src = program.source
    rounds = [src.index(f"if (((kf_tid >> 5) / 4) == {r})") for r in (0, 1)]
    stores = [src.index(f"kf_c0 + {c}, kf_r0 + 0, kf_o0, kf_o1, kf_o2);") for c in (0, 256)]
    waits = [i for i in range(len(src)) if src.startswith("kf::bulk_wait_group_read<0>();", i)]
    assert rounds[0] < stores[0] < waits[0] < rounds[1] < stores[1] < waits[1]
    offset = int(src.split("kf::epilogue_st_f32<256, 128>(")[1].split("(kf_smem + ")[1].split(")")[0])
    assert offset + 64 * 256 * 4 <= program.dynamic_smem <= 232448
