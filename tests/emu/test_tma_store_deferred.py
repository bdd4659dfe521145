"""The persistent GEMMs' deferred TMA-store wait (kernforge/backends/cuda/tma_store.py: ``lazy``):
a tile's store is issued and left in flight while the CTA runs its next tile's main loop; the
issuing thread waits for its read of the staging tile only right before the staging tile's next
write (then a barrier), and once after the tile loop before the CTA exits (DeepGEMM's order).

On cuda-emu (3 CTAs for 12 tiles, so every CTA restages its staging tile three times) the
warp-specialized sm_90a grouped GEMM matches the interpreter with poisoned outputs, and planted
bugs fail: the deferred wait dropped or one group behind (the staging tile is rewritten while the
previous store still reads it: kf/emu/tma_store.h's staging-write check), the final wait dropped
(the CTA exits with a store outstanding).  sm_100a's persistent case runs in
tests/emu/test_tma_store_kernels.py."""
import numpy as np
import pytest
import torch

from kernforge.backends.cuda.renderer import render_cuda
from kernforge.kernels.registry import all_specs
from tests.emu.planted import agree, assert_caught, plant, run

SPECS = all_specs()
NAME = "m_grouped_gemm_nt_contiguous"
# 6 row blocks x 2 column blocks = 12 tiles on 3 CTAs; the padding tiles of group 0 store zeros
PARAMS = dict(group_rows=[5, 0, 70, 130], alignment=64, num_groups=4, N=128, K=192, block_M=64, block_N=64,
              block_K=64, num_stages=2, persistent=2)
DEFERRED = "kf::bulk_wait_group_read<0>();\n"  # the wait before staging (the final one carries a comment)
DRAIN = "kf::bulk_wait_group_read<0>();  // the last tile's TMA stores"

BUGS = {
    "no_deferred_wait": (lambda s: s.replace(DEFERRED, "\n", 1), "still reading it"),
    "wait_one_behind": (lambda s: s.replace(DEFERRED, "kf::bulk_wait_group_read<1>();\n", 1), "still reading it"),
    "no_final_wait": (lambda s: s.replace(DRAIN, "//"), "not waited for"),
}


def test_persistent_epilogue_defers_the_wait_and_one_tile_kernels_do_not():
    """Order in the tile loop: wait (thread 0) -> barrier -> stage -> barrier -> issue, no wait
    after the issue; after the loop one final wait.  A one-tile-per-CTA launch keeps the wait
    right after its issue."""
    src = render_cuda(SPECS[NAME].factory(**PARAMS).ir, "sm_90a").source
    loop = src[src.index("for (int32_t kf_tile"):src.index(DRAIN)]
    steps = [DEFERRED, "kf::named_barrier_sync(1, 128);", "kf::epilogue_stsm_bf16<64, 128>(",
             "kf::named_barrier_sync(1, 128);", "kf::epilogue_tma_store<64, 128, 2>("]
    at = loop.index(steps[0])
    for step in steps[1:]:
        at = loop.index(step, at + 1)
    assert loop.count("bulk_wait_group_read") == 1 and "bulk_wait_group_read" not in loop[at:]
    assert src.count(DRAIN) == 1 and "mbarrier_inval" in src[src.index(DRAIN):]
    one_tile = render_cuda(SPECS[NAME].factory(**{**PARAMS, "persistent": 0}).ir, "sm_90a").source
    assert "kf::next_tile(" not in one_tile and DRAIN not in one_tile
    issue = one_tile.index("kf::epilogue_tma_store<")
    assert one_tile.index("kf::bulk_wait_group_read<0>();", issue) < one_tile.index("named_barrier_sync", issue)


@pytest.fixture(scope="module")
def planted():
    p = plant(SPECS[NAME], PARAMS, "sm_90a", BUGS, "emu_test_tma_store_deferred", timeout_ms=5_000)
    p.emu.launcher.sm_count = 3  # several tiles per CTA: the staging tile is rewritten
    return p


def test_unmutated_persistent_kernel_matches_interp(planted):
    """The clean copy of the harness's module, outputs poisoned (NaN): a tile never stored shows."""
    planted.emu.launcher.emulated = planted.module.kernel("clean", timeout_ms=planted.timeout_ms)
    spec = planted.spec
    inputs = spec.make_inputs(PARAMS, 2, "cpu")
    for i in spec.outputs:
        inputs[i] = torch.full(inputs[i].shape, float("nan"), dtype=inputs[i].dtype)
    oracle = [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]
    planted.emu(*inputs)
    assert planted.emu.launcher.last_grid == (3,) and planted.emu.launcher.last_variant == "tma"
    planted.ref(*oracle)
    for i in spec.outputs:
        assert not torch.isnan(oracle[i]).any()
        np.testing.assert_allclose(inputs[i].float().numpy(), oracle[i].float().numpy(), rtol=2.0 ** -7, atol=1e-3)
    assert agree(run(planted, "clean"))  # the harness's own inputs too


@pytest.mark.parametrize("bug", list(BUGS))
def test_planted_deferred_wait_bug_is_caught(planted, bug):
    assert_caught(planted, bug, BUGS)
