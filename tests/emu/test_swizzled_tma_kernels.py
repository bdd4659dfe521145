"""Library kernels whose sm_90a wgmma operand tiles are 128-byte swizzled -- loaded by whole-tile
TMA boxes, or written by cp.async chunks and plain stores -- under CUDA host emulation, against
the interpreter.

The library's ``small`` problems use tiles under 64 rows or 64-byte rows (core-matrix order, see
test_library_kernels.py); these parameters are the smallest that make ``layout_plan`` swizzle:
K-major A and B (GEMMs, MLA's QK), MN-major B with two 128-byte chunks per warp column (MLA's
PV), K tiles of two 128-byte chunks (the masked GEMM, fp8), fp8 rows of 128 bytes.  The emulated
TMA writes the XOR pattern of the tensor map and the emulated wgmma reads through the
descriptor's layout type, so a disagreement anywhere gives wrong numbers here.
"""
import numpy as np
import pytest
import torch

import kernforge
from kernforge.backends.cuda.renderer import CudaRenderer, render_cuda
from kernforge.codegen.renderer import Target
from kernforge.kernels.registry import get

CASES = {  # name -> (parameters, whether TMA fills the swizzled tiles)
    "m_grouped_gemm_nt_contiguous": (dict(group_rows=[64, 0, 40], alignment=64, num_groups=3, N=64, K=128,
                                          block_M=64, block_N=64, block_K=64), True),
    "m_grouped_gemm_nt_masked": (dict(masked_rows=[20, 0, 64], max_m=64, num_groups=3, N=128, K=256, block_M=64,
                                      block_N=128, block_K=128), True),
    "m_grouped_fp8_gemm_nt_contiguous": (dict(group_rows=[64, 0, 40], alignment=64, num_groups=3, N=64, K=256,
                                              block_M=64, block_N=64), True),
    "bf16_gemm_nt": (dict(M=70, N=64, K=192, block_M=64, block_N=64, block_K=64, num_stages=2, dtype="bfloat16",
                          out_dtype="bfloat16"), True),
    "fp8_gemm_nt": (dict(M=70, N=64, K=256, block_M=64, block_N=64), True),
    "mla_decode": (dict(batch=1, seqlens=[70], heads=64, heads_kv=1, seq_q=1, dim=576, dim_v=512, page_size=64,
                        causal=False, block_N=32, block_H=64), True),
    "mla_decode_splitkv": (dict(batch=1, pages=2, heads=64, heads_kv=1, seq_q=1, dim=576, dim_v=512, page_size=64,
                                causal=False, block_N=32, block_H=64), True),
    # swizzled tiles written by cp.async chunks and plain stores at the swizzled offsets
    "m_grouped_fp8_fp4_gemm_nt_contiguous": (dict(group_rows=[64, 0, 40], alignment=64, num_groups=3, N=64,
                                                  K=256, block_M=64, block_N=64), False),
    "mla_decode_sparse": (dict(batch=1, num_tokens=128, topk_lengths=[40], heads=64, topk=64, seq_q=1, dim=576,
                               dim_v=512, fp8_kv=False, block_N=32, block_H=64), False),
}


def _plan(ir):
    """The renderer's layout plan and TMA loops for ``ir`` on sm_90a."""
    _, facts = CudaRenderer().lower(ir, Target("cuda", "sm_90a", "", False))
    return facts["layouts"], facts["tma"][0]


@pytest.mark.parametrize("name", sorted(CASES))
def test_swizzled_tiles_match_interp(name):
    spec, (params, tma) = get(name), CASES[name]
    ir = spec.factory(**params).ir
    layouts, loops = _plan(ir)
    tiles = [t for ts in loops.values() for t in ts]
    assert layouts.swizzled and bool(tiles) == tma
    assert all(t.layout == "swizzled" for t in tiles), [(t.copy.dst.buffer.name, t.layout) for t in tiles]
    assert all(t.boxes == t.cols * t.spec.elem_bytes // 128 for t in tiles)  # one box per 128-byte chunk
    program = render_cuda(ir, "sm_90a")
    loads = [m for m in program.tensor_maps if not m.name.startswith("kf_tmap_store_")]  # not the epilogue's
    assert {m.swizzle for m in loads} == ({128} if tma else set())
    assert "__align__(1024)" in program.source
    inputs = spec.make_inputs(params, 0, "cpu")
    oracle = [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]
    for i in spec.outputs:  # poisoned outputs: a block that writes nothing shows
        inputs[i].fill_(float("nan") if inputs[i].dtype.is_floating_point else -7)
    emu = kernforge.compile(spec.factory, backend="cuda-emu", arch="sm_90a", **params)
    emu(*inputs)
    assert emu.launcher.last_variant == ("tma" if program.tensor_maps else "cp.async")
    kernforge.compile(spec.factory, backend="interp", **params)(*oracle)
    for i in spec.outputs:
        got, want = inputs[i].float().numpy(), oracle[i].float().numpy()
        assert not np.isnan(want).all(), "oracle wrote nothing"
        np.testing.assert_allclose(got, want, rtol=2.0 ** -7, atol=1e-3, err_msg=f"{name} output {i}")
    spec.check([inputs[i] for i in spec.outputs], spec.reference(inputs, params), inputs, params)


def test_cache_hints_follow_the_block_indices():
    """MLA's KV (each CTA reads its own pages once) is EVICT_FIRST; a GEMM's operands, which other
    CTAs read again (A across N blocks, the expert weights B across M blocks), keep the default."""
    for name, hints in (("mla_decode", [True, True]), ("mla_decode_splitkv", [True, True]),
                        ("m_grouped_gemm_nt_contiguous", [False, False]), ("m_grouped_gemm_nt_masked", [False, False]),
                        ("bf16_gemm_nt", [False, False])):
        loops = _plan(get(name).factory(**CASES[name][0]).ir)[1]
        assert [t.evict_first for ts in loops.values() for t in ts] == hints, name
    src = render_cuda(get("mla_decode").factory(**CASES["mla_decode"][0]).ir, "sm_90a").source
    assert "kf::l2_policy_evict_first()" in src and src.count("kf::tma_load_2d(") == src.count(", kf_pol")
