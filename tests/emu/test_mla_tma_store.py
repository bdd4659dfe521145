"""MLA decode's output through the STSM + TMA-store epilogue, and its ``T.rcp`` normalisation,
under CUDA host emulation against the float64 reference and the interpreter.

On sm_90a a block's ``block_H x dim_v`` output tile leaves through shared memory and rank-4
(rank-5 for split-KV partials) TMA stores whenever its rows are consecutive heads of one token
(:func:`kernforge.kernels.mla_decode.kernel.rows_are_tiles`); the cases cover a tile that
overhangs ``heads`` (TMA must clip at the heads dimension: the next token's heads follow in
memory), per-token tiles of MTP rows, the sparse kernel, the balanced schedule (whole requests
by TMA, cut ones as float32 partials) and the 5-D float32 partials of uniform split-KV.  sm_100a
(tcgen05 accumulators read back from TMEM into the same fragment) takes the same epilogue and
runs the same cases.  Outputs start poisoned (NaN), so a row or column the epilogue misses shows."""
import numpy as np
import pytest
import torch

from kernforge.backends.cuda.renderer import render_cuda
from kernforge.kernels.mla_decode import kernel as K
from kernforge.kernels.registry import all_specs

SPECS = all_specs()
SMALL = dict(dim=96, dim_v=64, block_H=64)

CASES = {
    # 8 heads in a 64-row block: the box overhangs heads and must be clipped there
    "dense_clip": ("mla_decode", dict(batch=2, seqlens=[37, 5], heads=8, seq_q=1, page_size=16, block_N=16, **SMALL),
                   [(1, 1, 64, 32)]),
    # MTP: 2 tokens x 64 heads, one tile per token (group % block_H == 0), causal
    "dense_mtp": ("mla_decode", dict(batch=1, seqlens=[40], heads=64, seq_q=2, causal=True, page_size=16,
                                     block_N=16, **SMALL), [(1, 1, 64, 32)]),
    "sparse": ("mla_decode_sparse", dict(batch=2, num_tokens=90, topk_lengths=[24, 11], heads=8, topk=24, seq_q=2,
                                         block_N=16, **SMALL), [(1, 1, 64, 32)]),
    # request 0 is cut across the two partitions (float32 partials + combine), 1 and 2 are whole:
    # a bf16 map for Out and a float32 one for O_accum
    "scheduled": ("mla_decode_scheduled", dict(batch=3, seqlens=[300, 5, 0], num_sm_parts=2, heads=8, seq_q=1,
                                               page_size=16, block_N=16, **SMALL), [(1, 1, 64, 32)] * 2),
    # float32 partials [batch, splits, seq_q, heads, dim_v]: a rank-5 map, 32-column swizzled slabs
    "splitkv": ("mla_decode_splitkv", dict(batch=2, pages=5, heads=8, seq_q=1, page_size=16, block_N=16,
                                           num_splits=2, **SMALL), [(1, 1, 1, 64, 32)]),
    # FlashMLA's d_v = 512: the 64 x 512 float32 partial tile (128 KiB) is staged and stored one warp
    # column (64 x 256) per round through a 64 KiB staging tile (tma_store.TmaStore.rounds)
    "splitkv_rounds": ("mla_decode_splitkv", dict(batch=1, pages=3, heads=8, seq_q=1, dim=576, dim_v=512,
                                                  page_size=16, block_N=16, num_splits=2, block_H=64),
                       [(1, 1, 1, 64, 32)]),
}


def _split_kernel(name, params):
    """The kernel of the case that holds the tile store (the split kernel of a split + combine)."""
    spec = SPECS[name]
    if name == "mla_decode_splitkv":
        return K.mla_decode(**{k: v for k, v in params.items() if k not in spec.runtime_sizes})
    return spec.factory(**params)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("case", list(CASES))
def test_mla_output_tile_matches_reference_and_interp(case, arch):
    name, params, boxes = CASES[case]
    spec = SPECS[name]
    source = render_cuda(_split_kernel(name, params).ir, arch)
    stores = [m for m in source.tensor_maps if m.name.startswith("kf_tmap_store")]
    # the planner must take the TMA path on both arches (a silent fallback fails here)
    assert [m.box for m in stores] == boxes, stores
    assert "kf::epilogue_tma_store<" in source.source
    assert "kf_rcp_approx(" in source.source and " / l[" not in source.source
    inputs = spec.make_inputs(params, 3, "cpu")
    ref_inputs = [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]
    # Out is the leading requests of a longer poisoned buffer: a tile that is not clipped at the
    # heads dimension writes past the last request, into the guard, which must stay NaN
    out = inputs[spec.outputs[0]]
    guarded = torch.full((out.shape[0] + params["block_H"] // params["heads"] + 1, *out.shape[1:]), float("nan"),
                         dtype=out.dtype)
    inputs[spec.outputs[0]] = guarded[:out.shape[0]]
    emu = spec.compile("cuda-emu", arch=arch, **params)
    emu(*inputs)
    assert torch.isnan(guarded[out.shape[0]:]).all(), "the epilogue wrote past the output"
    assert getattr(emu, "split", emu).launcher.last_variant == "tma"  # the split kernel's (split + combine hold both)
    spec.compile("interp", **params)(*ref_inputs)
    outputs = [inputs[i] for i in spec.outputs]
    spec.check(outputs, spec.reference(inputs, params), inputs, params)  # float64 reference, poison-free
    for got, want in zip(outputs, (ref_inputs[i] for i in spec.outputs)):
        np.testing.assert_allclose(got.float().numpy(), want.float().numpy(), rtol=2.0 ** -7, atol=1e-3)


def test_dense_rows_that_are_not_tiles_are_scattered():
    """8 heads x 2 MTP tokens in one 64-row block are not one tile of Out (the next token's heads
    are not the block's next rows): the epilogue scatters rows, no TMA store is planned."""
    assert not K.rows_are_tiles(8, 2, 1, 64) and K.rows_are_tiles(8, 1, 1, 64) and K.rows_are_tiles(128, 2, 1, 64)
    assert not K.rows_are_tiles(8, 1, 2, 64)  # a second latent head's rows would follow
    source = render_cuda(K.mla_decode(heads=8, seq_q=2, dim=96, dim_v=64, page_size=16, block_N=16,
                                      block_H=64).ir, "sm_90a")
    assert "epilogue_tma_store" not in source.source and "kf_rcp_approx(" in source.source
