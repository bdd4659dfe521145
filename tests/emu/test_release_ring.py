"""sm_90a TMA rings released by wgmma completion (issue 21, item 5, first part): full + empty
mbarriers per stage and ``wgmma_wait<1>`` instead of a block barrier per iteration
(``pipeline_plan.plan_release_rings``, ``ops.render_release_ring``).  These library kernels now also
get a producer warpgroup (``tests/emu/test_warp_specialized.py``), so the source checks read the
consumers' loop and the producer's empty wait.

The bf16 dense and grouped GEMMs at small sizes whose gemms take wgmma (64-row blocks, K spanning several
ring wraps) must take the path and match the interpreter on cuda-emu; kernels it does not apply
to keep the old ring; and bugs planted in the generated source must stop the emulated run or
make it disagree: a consumer that never arrives on the empty barrier (a hang, reported as a
deadlock error), a wrong phase bit on the producer's empty wait, a missing final
``wgmma_wait<0>`` (the last group is read before it completed).  "CUDA semantics verified on
host emulation", never GPU verified.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import kernforge
from kernforge.backends.cuda.renderer import render_cuda
from kernforge.backends.cuda_emu.backend import CudaEmuBackend, EmulationError
from kernforge.codegen.renderer import Target
from kernforge.kernels.registry import all_specs
from tests.emu.planted import agree, assert_caught, plant, run

SPECS = all_specs()
# K = 4 block_K: the 2- and 3-stage rings wrap, so every parity of both barriers is exercised
CASES = {
    # two consumer warpgroups (256 threads), M not a multiple of the block, a 3-stage ring
    "bf16_gemm_nt": dict(M=130, N=128, K=256, block_M=128, block_N=64, block_K=64, num_stages=3, threads=256,
                         dtype="bfloat16", out_dtype="bfloat16"),
    "m_grouped_gemm_nt_contiguous": dict(group_rows=[5, 0, 70], alignment=64, num_groups=3, N=64, K=256,
                                         block_M=64, block_N=32, block_K=64, num_stages=2),
    "m_grouped_gemm_nt_masked": dict(masked_rows=[20, 0, 64], max_m=64, num_groups=3, N=64, K=256, block_M=64,
                                     block_N=32, block_K=64, num_stages=3),
}
# the loop body is more than one accumulating wgmma gemm: the per-iteration block barrier stays
# (the fp8 GEMMs' promotion rings are released by a producer warpgroup instead:
# tests/emu/test_warp_specialized.py)
UNCHANGED = {
    "mla_decode": dict(batch=2, seqlens=[37, 5], heads=64, heads_kv=1, seq_q=1, dim=96, dim_v=64, page_size=16,
                       causal=False, block_N=16, block_H=64),
}


def _facts(name, params):
    return CudaEmuBackend().renderer.lower(SPECS[name].factory(**params).ir, Target("cuda-emu", "sm_90a"))[1]


@pytest.mark.parametrize("name", sorted(CASES))
def test_release_ring_matches_interp(name):
    spec, params = SPECS[name], CASES[name]
    facts = _facts(name, params)
    assert len(facts["release"]) == 1 and set(facts["layouts"].gemm_kind.values()) == {"wgmma"}
    source = render_cuda(spec.factory(**params).ir, "sm_90a").source
    # these rings are warp-specialized (tests/emu/test_warp_specialized.py): the consumers' loop
    consumer = source[source.index("kf::setmaxnreg_inc"):]
    loop = consumer[consumer.index("for (int32_t k = "):consumer.index("kf::wgmma_wait<0>();")]
    # no block barrier and no wgmma_wait<0> inside the loop; consumers release, the producer refills
    assert "__syncthreads" not in loop and "kf::wgmma_wait<1>();" in loop and "kf::mbarrier_arrive(" in loop
    S = params["num_stages"]
    threads = spec.factory(**params).ir.threads
    assert f"kf::mbarrier_init(kf_bars0 + {S} + kf_s, {threads});" in source  # every consumer releases
    inputs = spec.make_inputs(params, 0, "cpu")
    oracle = [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]
    emu = kernforge.compile(spec.factory, backend="cuda-emu", arch="sm_90a", **params)
    emu(*inputs)
    assert emu.launcher.last_variant == "tma"
    kernforge.compile(spec.factory, backend="interp", **params)(*oracle)
    for i in spec.outputs:
        assert not torch.isnan(oracle[i]).all(), "oracle wrote nothing"
        np.testing.assert_allclose(inputs[i].float().numpy(), oracle[i].float().numpy(), rtol=2.0 ** -7, atol=1e-3)


@pytest.mark.parametrize("name", sorted(UNCHANGED))
def test_other_rings_keep_the_block_barrier(name):
    assert not _facts(name, UNCHANGED[name])["release"]
    source = render_cuda(SPECS[name].factory(**UNCHANGED[name]).ir, "sm_90a").source
    assert "kf::wgmma_wait<1>" not in source and "kf::mbarrier_arrive(" not in source


def test_sm80_and_cp_async_variant_have_no_release_ring():
    name, params = "m_grouped_gemm_nt_contiguous", CASES["m_grouped_gemm_nt_contiguous"]
    kernel = SPECS[name].factory(**params).ir
    for target in (Target("cuda-emu", "sm_80"), Target("cuda-emu", "sm_90a", "cp.async")):
        assert not CudaEmuBackend().renderer.lower(kernel, target)[1]["release"]


# ---------------------------------------------------------------- planted bugs

GEMM = "m_grouped_gemm_nt_contiguous"


def _no_empty_arrive(src):
    return re.sub(r"\n\s*kf::mbarrier_arrive\(kf_bars0[^;]*;", "", src, count=1)


def _flipped_empty_parity(src):
    return re.sub(r"(mbarrier_wait_parity\(kf_bars0 \+ 2 \+ [^;]*?)\(\((kf_j\d+) / 2 - 1\) & 1\)",
                  r"\1((\2 / 2) & 1)", src, count=1)


def _no_final_wait(src):
    return re.sub(r"\n\s*kf::wgmma_wait<0>\(\);", "", src, count=1)


# bug -> (mutation, the error it must stop with; None: a wrong result or any emulation error)
BUGS = {"consumer_never_releases": (_no_empty_arrive, "deadlock"),
        "wrong_empty_phase_bit": (_flipped_empty_parity, None),
        "last_group_read_unwaited": (_no_final_wait, None)}


@pytest.fixture(scope="module")
def planted():
    """One module holding the clean source and every mutation (one compile)."""
    return plant(SPECS[GEMM], CASES[GEMM], "sm_90a", BUGS, "emu_test_release_ring_planted", timeout_ms=2_000)


def test_unmutated_copy_passes_the_harness(planted):
    assert agree(run(planted, "clean"))


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_planted_release_ring_bug_is_caught(planted, bug):
    assert_caught(planted, bug, BUGS)


# ---------------------------------------------------------------- the emulator's phase-bit check

PHASES = r'''
#include "kf/emu/tma.h"
// a0 phases of a one-arrival barrier complete, thread 0 waits on parity p0, a1 more complete, it
// waits on parity p1 (kf/emu/mbarrier.h: a wait may not return before phase 0 completed, nor
// again on a phase the thread already waited for).
extern "C" __global__ void mbar_phases(int* done, int a0, int p0, int a1, int p1) {
  extern __shared__ __align__(128) unsigned char kf_smem[];
  uint64_t* bar = reinterpret_cast<uint64_t*>(kf_smem);
  if (threadIdx.x == 0) {
    kf_emu::mbarrier_init(bar, 1);
    for (int i = 0; i < a0; ++i) kf_emu::mbarrier_arrive(bar);
    kf_emu::mbarrier_wait_parity(bar, p0);
    for (int i = 0; i < a1; ++i) kf_emu::mbarrier_arrive(bar);
    kf_emu::mbarrier_wait_parity(bar, p1);
    done[0] = 1;
  }
}
'''


@pytest.fixture(scope="module")
def phases():
    from .conftest import CudaTestKernel, build_emu_module
    i32 = ("int", "scalar")
    return build_emu_module("emu_test_release_phases", [
        CudaTestKernel("mbar_phases", PHASES, [("int*", "buffer"), i32, i32, i32, i32], 32)], dynamic_smem=1024)


@pytest.mark.parametrize("a0, p0, a1, p1, error", [
    (1, 0, 1, 1, None),  # phase 0, then phase 1
    (1, 0, 2, 0, None),  # phase 0, then phase 2 (phase 1 completed unobserved)
    (0, 1, 1, 0, "returned before any phase completed"),  # CUTLASS's skip-the-first-wait idiom
    (1, 0, 0, 0, "which this thread already waited for"),  # the ring's wrong parity at a wrap
])
def test_wrong_phase_bit_is_an_error(phases, a0, p0, a1, p1, error):
    k = phases["mbar_phases"]
    k.timeout_ms = 500
    done = np.zeros(1, np.int32)
    args = [done] + [np.array(x, np.int32) for x in (a0, p0, a1, p1)]
    if error is None:
        k(args, [], [1])
        assert done[0] == 1
    else:
        with pytest.raises(EmulationError, match=error):
            k(args, [], [1])
        assert done[0] == 0


def test_core_matrix_tiles_keep_the_block_barrier():
    """Core-matrix boxes are issued by every thread, and only thread 0 waits on the empty barrier:
    such a ring would refill a stage under a lagging consumer, so it keeps the old barrier."""
    from .dsl_kernels import gemm
    facts = CudaEmuBackend().renderer.lower(gemm(80, 72, 200, stages=3).ir, Target("cuda-emu", "sm_90a"))[1]
    (tiles,) = facts["tma"][0].values()
    assert any(t.layout == "core" for t in tiles) and not facts["release"]
