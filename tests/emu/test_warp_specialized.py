"""Warp-specialized release rings on sm_90a (issue 21, item 5): a producer warpgroup with
``setmaxnreg.dec`` issues every TMA, the consumer warpgroups (``setmaxnreg.inc``) only wait on
the full barriers, run the wgmmas and release stages (``pipeline_plan.plan_warp_specialization``,
``cuda/warp_specialize.py``).

On cuda-emu every GPU thread is a host thread, so the producer and the consumers really run
concurrently: with K spanning more than two ring wraps the producer must block on an empty
barrier until the consumers release it, and a sequential model would deadlock.  Checked here:
the plan and the launch ABI (block = consumers + 128), the library kernels against the
interpreter, the emulator's setmaxnreg accounting and named barriers on hand-written kernels,
and bugs planted in the generated source (wrong register counts, a producer that does not wait
on the empty barrier or waits on the wrong phase, a consumer without its full wait), each of
which must stop the run (bounded waits) or make it disagree.  "CUDA semantics verified on host
emulation", never GPU verified.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import kernforge
from kernforge.backends.cuda.pipeline_plan import PRODUCER_THREADS, REGISTER_FILE
from kernforge.backends.cuda.renderer import render_cuda
from kernforge.backends.cuda_emu.backend import CudaEmuBackend, EmulationError
from kernforge.codegen.renderer import Target
from kernforge.kernels.registry import all_specs
from tests.emu.planted import assert_caught, agree, plant, run

SPECS = all_specs()
# K = 4 block_K (2- and 3-stage rings): the producer's empty waits see every parity
CASES = {
    "bf16_gemm_nt": dict(M=130, N=128, K=256, block_M=128, block_N=64, block_K=64, num_stages=3, threads=256,
                         dtype="bfloat16", out_dtype="bfloat16"),
    "m_grouped_gemm_nt_contiguous": dict(group_rows=[5, 0, 70], alignment=64, num_groups=3, N=64, K=256,
                                         block_M=64, block_N=32, block_K=64, num_stages=2),
    "m_grouped_gemm_nt_masked": dict(masked_rows=[20, 0, 64], max_m=64, num_groups=3, N=64, K=256, block_M=64,
                                     block_N=32, block_K=64, num_stages=3),
}


def _facts(name, params, target=Target("cuda-emu", "sm_90a")):
    return CudaEmuBackend().renderer.lower(SPECS[name].factory(**params).ir, target)[1]


@pytest.mark.parametrize("name", sorted(CASES))
def test_plan_and_launch_abi(name):
    params = CASES[name]
    kernel = SPECS[name].factory(**params).ir
    facts = _facts(name, params)
    ws = facts["warpspec"]
    assert ws is not None and ws.consumers == kernel.threads and ws.rings == frozenset(facts["release"])
    assert ws.threads == kernel.threads + PRODUCER_THREADS and ws.leader == kernel.threads
    # counts: multiples of 8 in [24, 256] whose block total fits the register file
    for n in (ws.producer_regs, ws.consumer_regs):
        assert 24 <= n <= 256 and n % 8 == 0
    assert PRODUCER_THREADS * ws.producer_regs + ws.consumers * ws.consumer_regs <= REGISTER_FILE
    program = render_cuda(kernel, "sm_90a")
    src = program.source
    assert program.threads == ws.threads and f"__launch_bounds__({ws.threads}, 1)" in src
    assert program.main_loop_threads == kernel.threads  # the cycle model's warps: the consumers
    assert f"kf::setmaxnreg_dec<{ws.producer_regs}>();" in src and f"kf::setmaxnreg_inc<{ws.consumer_regs}>();" in src
    producer, consumer = src.split("} else {\n    kf::setmaxnreg_inc")
    # only the producer issues TMA (its leader), only the consumers run wgmma and release stages
    assert "tma_load" in producer and "tma_load" not in consumer and f"kf_tid == {ws.leader}" in producer
    assert "wgmma" not in producer.split("setmaxnreg_dec")[1] and "kf::mbarrier_arrive(" not in producer
    assert "kf::wgmma_wait<1>();" in consumer and "kf::mbarrier_arrive(" in consumer
    # block-wide barriers only at the ring's entry and exit, in both roles; the consumers' own are named
    assert producer.count("__syncthreads();") == 2 and consumer.count("__syncthreads();") == 2
    assert f"kf::mbarrier_init(kf_bars0 + {params['num_stages']} + kf_s, {kernel.threads});" in producer


def test_other_targets_are_unchanged():
    name, params = "m_grouped_gemm_nt_contiguous", CASES["m_grouped_gemm_nt_contiguous"]
    kernel = SPECS[name].factory(**params).ir
    for arch, variant in (("sm_80", ""), ("sm_90a", "cp.async"), ("sm_100a", "")):
        assert _facts(name, params, Target("cuda-emu", arch, variant))["warpspec"] is None
        src = render_cuda(kernel, arch, tma=variant != "cp.async").source
        assert "setmaxnreg" not in src and "named_barrier_sync" not in src


def test_mla_rings_are_not_specialized():
    mla = dict(batch=2, seqlens=[37, 5], heads=64, heads_kv=1, seq_q=1, dim=96, dim_v=64, page_size=16,
               causal=False, block_N=16, block_H=64)
    assert _facts("mla_decode", mla)["warpspec"] is None


# fp8 GEMMs with the per-128-K promotion (promotion rings): K = 5 x 128, 2- and 3-stage rings
FP8_CASES = {
    "fp8_gemm_nt": dict(M=100, N=128, K=640, block_M=64, block_N=64),
    "m_grouped_fp8_gemm_nt_contiguous": dict(group_rows=[40, 0, 70], alignment=64, num_groups=3, N=128, K=640,
                                             block_M=64, block_N=64, num_stages=3),
    "m_grouped_fp8_gemm_nt_masked": dict(masked_rows=[20, 0, 64], max_m=64, num_groups=3, N=128, K=640,
                                         block_M=64, block_N=128),
}


@pytest.mark.parametrize("name", sorted(FP8_CASES))
def test_fp8_promotion_ring_plan(name):
    """The consumers release a promotion ring's stage right after the gemm's ``wgmma_wait<0>``, before
    the promotion (same iteration), and still issue QGMMA (``wgmma m64nNk32 .e4m3``)."""
    params = FP8_CASES[name]
    kernel = SPECS[name].factory(**params).ir
    facts = _facts(name, params)
    ws = facts["warpspec"]
    assert not facts["release"] and ws is not None and ws.promoting == ws.rings == frozenset(facts["promotion"])
    src = render_cuda(kernel, "sm_90a").source
    consumer = src[src.index("kf::setmaxnreg_inc"):]
    loop = consumer[consumer.index("for (int32_t k = "):]
    wait, arrive = loop.index("kf::wgmma_wait<0>();"), loop.index("kf::mbarrier_arrive(")
    assert "wgmma_m64nNk32_f32_e4m3" in loop and wait < arrive < loop.index("SFA[")
    assert re.search(r"kf::mbarrier_arrive\(kf_bars0 \+ \d \+ kf_j\d+ % \d\);", loop)  # this iteration's stage
    assert "__syncthreads" not in loop[:loop.index("SFA[")] and "wgmma_wait<1>" not in src


@pytest.mark.parametrize("name", sorted(CASES) + sorted(FP8_CASES))
def test_matches_interp(name):
    spec, params = SPECS[name], {**CASES, **FP8_CASES}[name]
    inputs = spec.make_inputs(params, 0, "cpu")
    oracle = [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]
    emu = kernforge.compile(spec.factory, backend="cuda-emu", arch="sm_90a", **params)
    for i in spec.outputs:  # poisoned outputs: a tile nobody writes shows
        inputs[i].fill_(float("nan")) if inputs[i].is_floating_point() else None
        oracle[i].copy_(inputs[i])
    emu(*inputs)
    assert emu.launcher.last_variant == "tma" and emu.launcher.program.threads == SPECS[name].factory(
        **params).ir.threads + PRODUCER_THREADS
    kernforge.compile(spec.factory, backend="interp", **params)(*oracle)
    for i in spec.outputs:
        assert not torch.isnan(oracle[i]).all(), "oracle wrote nothing"
        np.testing.assert_allclose(inputs[i].float().numpy(), oracle[i].float().numpy(), rtol=2.0 ** -7, atol=1e-3)


# ---------------------------------------------------------------- planted bugs in the generated kernel

GEMM = "bf16_gemm_nt"  # two consumer warpgroups + the producer: 384 threads, 3 stages


def _sub(pattern, repl):
    def mutate(src):
        out, n = re.subn(pattern, repl, src, count=1)
        assert n == 1, pattern
        return out
    return mutate


BUGS = {
    # register counts: not a multiple of 8; more than the 64K pool (2 x 128 x 256 + 128 x 40); not uniform
    "consumer_regs_not_multiple_of_8": (_sub(r"setmaxnreg_inc<\d+>", "setmaxnreg_inc<236>"), "multiple of 8"),
    "consumer_regs_over_the_pool": (_sub(r"setmaxnreg_inc<\d+>", "setmaxnreg_inc<256>"), "setmaxnreg.inc"),
    "producer_regs_not_uniform": (_sub(r"kf::setmaxnreg_dec<(\d+)>\(\);", r"if (kf_tid % 128 == 5) "
                                       r"kf::setmaxnreg_dec<48>(); else kf::setmaxnreg_dec<\1>();"),
                                  "not warpgroup-uniform"),
    # the producer refills a stage without waiting for its release, or waits on the wrong phase
    "producer_skips_empty_wait": (_sub(r"\n\s*kf::mbarrier_wait_parity\(kf_bars0 \+ 3 \+[^;]*;", ""), None),
    "producer_wrong_empty_phase": (_sub(r"\((kf_j\d+) / 3 - 1\) & 1", r"(\1 / 3) & 1"), None),
    # a consumer reads its stage without waiting for the full barrier
    "consumer_skips_full_wait": (_sub(r"\n\s*kf::mbarrier_wait_parity\(kf_bars0 \+ (kf_j\d+) % 3, [^;]*;", ""), None),
    # a consumer never releases: the producer's empty wait must time out
    "consumer_never_releases": (_sub(r"\n\s*kf::mbarrier_arrive\(kf_bars0 \+ 3[^;]*;", ""), "deadlock"),
}


@pytest.fixture(scope="module")
def planted():
    return plant(SPECS[GEMM], CASES[GEMM], "sm_90a", BUGS, "emu_test_warp_specialized_planted", timeout_ms=2_000)


def test_unmutated_copy_passes_the_harness(planted):
    assert agree(run(planted, "clean"))


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_planted_bug_is_caught(planted, bug):
    assert_caught(planted, bug, BUGS)


# ---------------------------------------------------------------- the emulator's accounting, by hand

ACCOUNTING = r'''
// Warpgroup 0 waits `delay_us`, then executes setmaxnreg.dec `dec`; warpgroups 1.. execute
// setmaxnreg.inc `inc` (thread `odd` of warpgroup 1 asks `inc + 8` instead when odd >= 0); then
// everyone meets at a named barrier over the whole block and thread 0 records success.
#include <unistd.h>
#include "kf/fence.cuh"
extern "C" __global__ void regs(int* done, int dec, int inc, int delay_us, int odd) {
  const int tid = threadIdx.x;
  if (tid < 128) {
    if (delay_us) usleep(delay_us);
    kf_emu::setmaxnreg(false, dec);
  } else {
    kf_emu::setmaxnreg(true, tid == 128 + odd ? inc + 8 : inc);
  }
  kf::named_barrier_sync(1, blockDim.x);
  if (tid == 0) done[0] = 1;
}
'''
NAMED = r'''
// Threads below `split` meet at named barrier 2 with count `a`, the others with count `b`.
extern "C" __global__ void named(int* done, int split, int a, int b) {
  const int tid = threadIdx.x;
  kf::named_barrier_sync(2, tid < split ? a : b);
  if (tid == 0) done[0] = 1;
}
'''


@pytest.fixture(scope="module")
def accounting():
    from .conftest import CudaTestKernel, build_emu_module
    i32 = ("int", "scalar")
    buf = ("int*", "buffer")
    return build_emu_module("emu_test_setmaxnreg", [
        CudaTestKernel("regs", ACCOUNTING, [buf, i32, i32, i32, i32], 384),
        CudaTestKernel("named", NAMED, [buf, i32, i32, i32], 128)], timeout_ms=1_500)


@pytest.mark.parametrize("dec, inc, delay_us, odd, error", [
    (40, 232, 0, -1, None),  # DeepGEMM's counts: 128 x 40 + 256 x 232 = 64512
    (40, 232, 100_000, -1, None),  # the consumers' inc blocks until the producer's dec releases registers
    (40, 256, 0, -1, "setmaxnreg.inc"),  # 128 x 40 + 256 x 256 > 64K: the inc can never be served
    (36, 232, 0, -1, "multiple of 8"),
    (16, 232, 0, -1, "multiple of 8"),  # below 24
    (40, 264, 0, -1, "multiple of 8"),  # above 256
    (40, 224, 0, 3, "not warpgroup-uniform"),
])
def test_setmaxnreg_accounting(accounting, dec, inc, delay_us, odd, error):
    k = accounting["regs"]
    done = np.zeros(1, np.int32)
    args = [done] + [np.array(x, np.int32) for x in (dec, inc, delay_us, odd)]
    if error is None:
        k(args, [], [2])  # two blocks: the pool is reset per block
        assert done[0] == 1
    else:
        with pytest.raises(EmulationError, match=error):
            k(args, [], [1])
        assert done[0] == 0


@pytest.mark.parametrize("split, a, b, error", [
    (128, 128, 0, None),
    (64, 128, 96, "arrives with count"),
    (128, 48, 0, "multiple of 32"),
])
def test_named_barrier(accounting, split, a, b, error):
    k = accounting["named"]
    done = np.zeros(1, np.int32)
    args = [done] + [np.array(x, np.int32) for x in (split, a, b)]
    if error is None:
        k(args, [], [1])
        assert done[0] == 1
    else:
        with pytest.raises(EmulationError, match=error):
            k(args, [], [1])


# ---------------------------------------------------------------- a ring the producer cannot follow

def _gemm_local_row(M, N, K, BM=64, BN=64, BK=64, stages=2):
    """A bf16 gemm whose A rows come through a block-uniform local: the producer's slice could not
    compute that coordinate (it runs none of the consumers' statements), so the release ring keeps
    thread 0's issue (``ops.render_release_ring``), as before warp specialization."""
    import kernforge.dsl as T

    @T.prim_func
    def main(A: T.Tensor((M, K), "bfloat16"), B: T.Tensor((N, K), "bfloat16"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, BN), T.ceildiv(M, BM), threads=128) as (bx, by):
            A_s = T.alloc_shared((BM, BK), "bfloat16")
            B_s = T.alloc_shared((BN, BK), "bfloat16")
            C_l = T.alloc_fragment((BM, BN), "float32")
            row = T.alloc_var("int32", 0)
            row = by * BM
            T.clear(C_l)
            for k in T.Pipelined(T.ceildiv(K, BK), num_stages=stages):
                T.copy(A[row, k * BK], A_s)
                T.copy(B[bx * BN, k * BK], B_s)
                T.gemm(A_s, B_s, C_l, transpose_B=True)
            T.copy(C_l, C[by * BM, bx * BN])

    return main


def test_ring_the_producer_cannot_follow_keeps_thread_0_issue():
    kernel = _gemm_local_row(96, 64, 256)
    facts = CudaEmuBackend().renderer.lower(kernel.ir, Target("cuda-emu", "sm_90a"))[1]
    assert facts["release"] and facts["warpspec"] is None
    program = render_cuda(kernel.ir, "sm_90a")
    assert program.threads == 128 and "setmaxnreg" not in program.source
    rng = np.random.default_rng(7)
    a = torch.from_numpy(rng.standard_normal((96, 256), dtype=np.float32)).bfloat16()
    b = torch.from_numpy(rng.standard_normal((64, 256), dtype=np.float32)).bfloat16()
    c = torch.full((96, 64), float("nan"))
    emu = kernforge.compile(kernel, backend="cuda-emu", arch="sm_90a")
    emu(a, b, c)
    assert emu.launcher.last_variant == "tma"
    want = a.double() @ b.double().T
    np.testing.assert_allclose(c.numpy(), want.numpy(), rtol=1e-4, atol=1e-3)


FP8_GEMM = "m_grouped_fp8_gemm_nt_contiguous"  # 3 stages, K = 5 x 128
FP8_BUGS = {
    "fp8_consumer_never_releases": (_sub(r"\n\s*kf::mbarrier_arrive\(kf_bars0 \+ 3[^;]*;", ""), "deadlock"),
    "fp8_producer_wrong_empty_phase": (_sub(r"\((kf_j\d+) / 3 - 1\) & 1", r"(\1 / 3) & 1"), None),
    # the promotion reads the partial sum before the wgmmas that produce it have retired
    "fp8_promotes_before_the_wait": (_sub(r"\n\s*kf::wgmma_wait<0>\(\);", ""), None),
}


@pytest.fixture(scope="module")
def planted_fp8():
    return plant(SPECS[FP8_GEMM], FP8_CASES[FP8_GEMM], "sm_90a", FP8_BUGS, "emu_test_warp_specialized_fp8",
                 timeout_ms=2_000)


def test_fp8_unmutated_copy_passes_the_harness(planted_fp8):
    assert agree(run(planted_fp8, "clean"))


@pytest.mark.parametrize("bug", sorted(FP8_BUGS))
def test_fp8_planted_bug_is_caught(planted_fp8, bug):
    assert_caught(planted_fp8, bug, FP8_BUGS)


def _gemm_two_tiles_per_block(M, N, K, BM=64, BN=64, BK=64, stages=2):
    """Each block computes two row tiles in a serial loop: the ring is entered twice per block, so
    the producer's slice runs the outer loop too and both roles re-initialise the ring's barriers."""
    import kernforge.dsl as T

    @T.prim_func
    def main(A: T.Tensor((M, K), "bfloat16"), B: T.Tensor((N, K), "bfloat16"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, BN), T.ceildiv(M, 2 * BM), threads=128) as (bx, by):
            A_s = T.alloc_shared((BM, BK), "bfloat16")
            B_s = T.alloc_shared((BN, BK), "bfloat16")
            C_l = T.alloc_fragment((BM, BN), "float32")
            for t in T.serial(2):
                T.clear(C_l)
                for k in T.Pipelined(T.ceildiv(K, BK), num_stages=stages):
                    T.copy(A[(2 * by + t) * BM, k * BK], A_s)
                    T.copy(B[bx * BN, k * BK], B_s)
                    T.gemm(A_s, B_s, C_l, transpose_B=True)
                T.copy(C_l, C[(2 * by + t) * BM, bx * BN])

    return main


def test_ring_inside_a_loop_is_entered_by_both_roles():
    kernel = _gemm_two_tiles_per_block(200, 64, 320)
    ws = CudaEmuBackend().renderer.lower(kernel.ir, Target("cuda-emu", "sm_90a"))[1]["warpspec"]
    assert ws is not None
    src = render_cuda(kernel.ir, "sm_90a").source
    producer = src[src.index("kf::setmaxnreg_dec"):src.index("kf::setmaxnreg_inc")]
    assert re.search(r"for \(int32_t t = 0; t < 0 \+ 2; \+\+t\)", producer)  # the slice keeps the outer loop
    rng = np.random.default_rng(11)
    a = torch.from_numpy(rng.standard_normal((200, 320), dtype=np.float32)).bfloat16()
    b = torch.from_numpy(rng.standard_normal((64, 320), dtype=np.float32)).bfloat16()
    c = torch.full((200, 64), float("nan"))
    emu = kernforge.compile(kernel, backend="cuda-emu", arch="sm_90a")
    emu(a, b, c)
    assert emu.launcher.last_variant == "tma"
    np.testing.assert_allclose(c.numpy(), (a.double() @ b.double().T).numpy(), rtol=1e-4, atol=1e-3)
