"""Library kernels and DSL tiles on ascend-emu: the Ascend C source, compiled unchanged against
the CPU shim, must match the torch references (exactly for TopK, whose every path is integer
work) -- "verified on the Ascend C CPU shim".  Outputs are poisoned before each launch."""
from __future__ import annotations

import pytest
import torch

import kernforge
import kernforge.dsl as T
from kernforge import ops
from kernforge.backends.ascend.renderer import arch_info
from kernforge.kernels import topk as K
from kernforge.kernels.check import run_spec
from kernforge.kernels.registry import get
from tests.kernels.test_topk import rows, run

pytestmark = pytest.mark.usefixtures("shim_cxx")


def _name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


# every TopK path: both compactions, the mask append, the prescan start threshold, the
# rank sort, the bitonic network (k > 1024), the radix sort, values off, both key widths
@pytest.mark.parametrize("dtype,k,itype,sorted_values,return_value,params", [
    (torch.float32, 33, torch.int32, False, True, dict(compaction="tile_scan")),
    (torch.bfloat16, 33, torch.int64, True, False, dict(compaction="group_serial", mask_append=True)),
    (torch.float32, 16, torch.int64, True, True, dict(compaction="group_serial", group=8, prescan=8, sort="radix")),
    (torch.bfloat16, 1025, torch.int32, True, True, dict(compaction="tile_scan")),
], ids=["tile_scan", "mask_append_rank_sort", "prescan_radix_sort", "bitonic"])
def test_topk_paths_match_the_reference(dtype, k, itype, sorted_values, return_value, params):
    pf = K.topk_select(k=k, dtype=_name(dtype), index_dtype=_name(itype), sorted_values=sorted_values,
                       return_value=return_value, **dict(dict(tile=64, group=8, slack=64), **params))
    kernel = kernforge.compile(pf, backend="ascend-emu")
    x, end, offset = rows(dtype)
    if k > 1024:  # the bitonic network costs ~1.3 M checked scalar accesses a row on the shim: one row
        x, end, offset = x[4:5], end[4:5], offset[4:5]  # -inf and denormals: ties among 2/3 of the row
    nan, idx, val = run(kernel, x, end, offset, k, dtype, itype, rv=return_value)
    ref_v, ref_i, ref_nan = K.reference(x, k, end, sorted_values, offset, -9, -5.5, itype)
    assert torch.equal(nan, ref_nan)
    assert torch.equal(idx, ref_i)
    if return_value:
        bits = torch.int16 if dtype == torch.bfloat16 else torch.int32
        live = ref_nan == 0  # a NaN row's values are unspecified
        assert torch.equal(val[live].view(bits), ref_v[live].view(bits))


def test_the_registry_spec_runs_and_is_labelled_as_the_shim():
    res = run_spec(get("topk_fp32"), "ascend-emu", "small", repeat=1, seed=3)
    assert res.verified, res.error
    assert res.label == "verified on the Ascend C CPU shim"


def test_ops_topk_takes_ascend_emu_with_its_own_configuration():
    g = torch.Generator().manual_seed(2)
    x = torch.randn((3, 2500), generator=g).to(torch.bfloat16)
    end = torch.tensor([2500, 1999, 7], dtype=torch.int32)
    v, i = ops.topk(x, 64, end=end, indices_type=torch.int32, backend="ascend-emu")
    rv, ri, _ = K.reference(x, 64, end, False, torch.zeros(3, dtype=torch.int32), 2**31 - 1, float("-inf"),
                            torch.int32)
    assert torch.equal(i, ri) and torch.equal(v.view(torch.int16), rv.view(torch.int16))


# ---------------------------------------------------------------- the vector paths


def row_stats():
    """A softmax-style row kernel whose tiles take every vector lowering: DataCopyPad in with a
    ragged tail (zero-filled), Duplicate, a Muls/Adds/Exp chain, ReduceMax/ReduceSum per row and
    DataCopyPad out; and a scalar fallback map (row broadcast)."""
    M = T.symbolic("M")
    N = T.symbolic("N")

    @T.prim_func
    def stats(X: T.Tensor((M, N), "float32"), Y: T.Tensor((M, N), "float32"), R: T.Tensor((M, 2), "float32")):
        with T.Kernel(T.ceildiv(M, 4), threads=32) as bx:
            x = T.alloc_shared((4, 64), "float32")
            e = T.alloc_shared((4, 64), "float32")
            mx = T.alloc_fragment((4,), "float32")
            sm = T.alloc_fragment((4,), "float32")
            out = T.alloc_fragment((4, 2), "float32")
            T.clear(e)
            T.copy(X[bx * 4, 0], x)
            for i, j in T.Parallel(4, 64):
                e[i, j] = T.exp(x[i, j] * 0.5 + 0.25)
            T.reduce_max(x, mx, dim=1)
            T.reduce_sum(e, sm, dim=1)
            for i, j in T.Parallel(4, 64):
                e[i, j] = e[i, j] - mx[i]
            for i in T.Parallel(4):
                out[i, 0] = mx[i]
                out[i, 1] = sm[i]
            T.copy(e, Y[bx * 4, 0])
            T.copy(out, R[bx * 4, 0])
    return stats


@pytest.mark.parametrize("arch", ["dav-c220", "dav-3510"])
def test_vector_lowerings_match_float64(arch):
    kernel = kernforge.compile(row_stats(), backend="ascend-emu", arch=arch)
    src = kernel.get_kernel_source()
    assert f"__NPU_ARCH__ {arch_info(arch).npu_arch}" in src
    for op in ("AscendC::Muls(", "AscendC::Adds(", "AscendC::Exp(", "kf::vector_reduce<kf::VReduce::Max",
               "kf::vector_reduce<kf::VReduce::Sum", "kf::fill(", "kf::copy_in(", "kf::copy_out("):
        assert op in src, op
    g = torch.Generator().manual_seed(4)
    x = torch.randn((7, 50), generator=g)  # ragged: 7 rows (last block has 3), 50 of 64 columns
    y = torch.full((7, 50), float("nan"))
    r = torch.full((7, 2), float("nan"))
    kernel(x, y, r)
    xp = torch.cat([x.double(), torch.zeros(7, 14, dtype=torch.float64)], dim=1)  # the zero-filled tail
    mx = xp.max(dim=1).values
    e = torch.exp(xp * 0.5 + 0.25)
    torch.testing.assert_close(r[:, 0].double(), mx, rtol=0, atol=0)
    torch.testing.assert_close(r[:, 1].double(), e.sum(dim=1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y.double(), (e - mx[:, None])[:, :50], rtol=1e-6, atol=1e-6)
