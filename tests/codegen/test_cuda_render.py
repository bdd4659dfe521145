"""The CUDA renderer without a compiler: mapping choices, launch ABI, emulation rules, errors."""
from __future__ import annotations

import re

import pytest

import kernforge.dsl as T
from kernforge import dtypes
from kernforge.backends.cuda import tcgen05
from kernforge.backends.cuda.layouts import AccumLayout, RowLayout
from kernforge.backends.cuda.arch import ARCHS
from kernforge.backends.cuda.renderer import CudaRenderer, CudaRenderError, render_cuda
from kernforge.codegen.renderer import Target
from kernforge.kernels import registry
from tests.backends.test_cuda_semantics import gemm, row_softmax, scan_and_total, scores_softmax

ALL_ARCHS = sorted(ARCHS)


class _Plans:
    """The CUDA pipeline's analyses for one kernel, as the emitter reads them."""

    def __init__(self, pf, arch):
        _, facts = CudaRenderer().lower(pf.ir, Target("cuda", arch))
        self.plan, self.pipes = facts["layouts"], facts["pipelines"]


_plan = _Plans


@pytest.mark.parametrize("arch", ALL_ARCHS)
def test_generated_text_has_no_inline_asm_and_includes_only_the_device_library(arch):
    for pf in (gemm(), scores_softmax(), row_softmax(), scan_and_total()):
        src = render_cuda(pf.ir, arch).source
        assert "asm" not in src
        assert set(re.findall(r'#include "([^"]+)"', src)) <= {
            "kf/common.cuh", "kf/atomic.cuh", "kf/cp_async.cuh", "kf/reduce.cuh", "kf/mma.cuh", "kf/wgmma.cuh",
            "kf/tma.cuh", "kf/tcgen05.cuh", "kf/tma_store.cuh"}


def test_launch_abi_params_in_order_then_one_int64_per_symbol():
    M = T.symbolic("M")

    @T.prim_func
    def k(X: T.Tensor((M, 8), "bfloat16"), n: T.int32, s: T.float32, b: T.bfloat16, Y: T.Tensor((M, 8), "float32")):
        with T.Kernel(T.ceildiv(M, 4), threads=32) as bx:
            for i, j in T.Parallel(4, 8):
                if bx * 4 + i < M:
                    Y[bx * 4 + i, j] = X[bx * 4 + i, j] * s + n + b

    prog = render_cuda(k.ir, "sm_80")
    assert prog.entry == "kf_" + k.ir.name
    assert prog.params == [("X", "kf_bf16*"), ("n", "int32_t"), ("s", "float"), ("b_arg", "float"),
                           ("Y", "float*"), ("kf_dim_M", "int64_t")]
    assert f'extern "C" __global__ void __launch_bounds__(32, 1) {prog.entry}(' in prog.source
    assert "kf_from_float<kf_bf16>(b_arg)" in prog.source  # a bf16 scalar is rounded once, on entry
    assert prog.threads == 32 and prog.dynamic_smem == 0


def test_gemm_accumulator_lives_in_registers_with_the_instruction_of_the_target():
    pf = gemm(256, 256, 256, bm=128, bn=128, bk=32, stages=3)
    for arch, kind in (("sm_90a", "wgmma"), ("sm_80", "mma"), ("sm_100a", "tcgen05")):
        r = _plan(pf, arch)
        (g, chosen), = r.plan.gemm_kind.items()
        assert chosen == kind
        assert isinstance(r.plan.registers[g.c.buffer], AccumLayout)
        assert not r.plan.staged
        assert {b.name for b in r.plan.core_tiles} == {g.a.buffer.name, g.b.buffer.name}
    src = render_cuda(pf.ir, "sm_90a").source
    assert "kf::wgmma_m64nNk16_f32_bf16<128, 0, 1>" in src  # B stored K x N: transposed (MN-major) operand
    assert "kf::mma_m16n8k16_f32_bf16" in render_cuda(pf.ir, "sm_80").source
    # sm_100a: M = 128 MMAs (128-row tile) of one warp column (N = 128), bf16, B MN-major; the
    # accumulator in TMEM
    blackwell = render_cuda(pf.ir, "sm_100a").source
    assert "kf::tcgen05_mma_f16(" in blackwell and "kf::tmem_ld_16x256b<8>(" in blackwell
    assert f"{tcgen05.instr_desc(128, 128, dtypes.bfloat16, False, True):#010x}u" in blackwell
    assert "kf::mma_m16n8k16" not in blackwell


def test_sm_100a_keeps_mma_sync_for_gemms_tcgen05_does_not_take():
    # 32-row accumulator: no 64-row warpgroup block
    (kind,) = _plan(gemm(64, 64, 64, bm=32, bn=64, bk=32), "sm_100a").plan.gemm_kind.values()
    assert kind == "mma"


def test_pipelined_copies_become_a_ring_of_stages():
    pf = gemm(256, 256, 256, bm=128, bn=128, bk=32, stages=3)
    r = _plan(pf, "sm_80")
    assert sorted(r.pipes.stages.values()) == [3, 3]
    prog = render_cuda(pf.ir, "sm_80")
    assert prog.dynamic_smem == 3 * (128 * 32 + 32 * 128) * 2
    assert prog.source.count("kf::cp_async_wait<1>()") == 1  # one wait per iteration, S - 2 groups in flight
    assert "kf::cp_async_cg_16" in prog.source


def test_row_reductions_of_accumulators_stay_in_registers():
    r = _plan(scores_softmax(threads=256), "sm_90a")
    regs = {b.name: lay for b, lay in r.plan.registers.items()}
    assert isinstance(regs["S"], AccumLayout) and regs["S"].wn == 2  # two warp columns share each row
    assert regs["mx"] == regs["sm"] == regs["S"].rows and isinstance(regs["mx"], RowLayout)
    assert not r.plan.staged
    src = render_cuda(scores_softmax(threads=256).ir, "sm_90a").source
    assert "kf::quad_allreduce<kf::MaxOp>" in src and "kf_scratch" in src


def test_fragments_other_threads_read_are_staged_in_shared_memory():
    r = _plan(row_softmax(), "sm_80")
    staged = {b.name for b in r.plan.staged}
    assert staged == {"x", "mx", "sm"}  # the copied tile is reduced along rows by other threads
    assert render_cuda(row_softmax().ir, "sm_80").dynamic_smem >= 8 * 100 * 4


def test_block_statements_run_once_and_barriers_separate_shared_writes_from_reads():
    src = render_cuda(scan_and_total().ir, "sm_80").source
    assert re.search(r"if \(kf_tid == 0\) \{ kf::atomic_add\(&total\[0\]", src)
    body = src[src.index("kf_test_scan("):]
    # the scan reads what the copy wrote, the copy back reads what the scan wrote
    assert body.count("__syncthreads();") >= 2


def test_too_much_shared_memory_is_a_clear_error():
    @T.prim_func
    def big(X: T.Tensor((64,), "float32")):
        with T.Kernel(1, threads=32) as bx:
            s = T.alloc_shared((200 * 1024 // 4,), "float32")
            T.copy(X[0], s[0:64])

    with pytest.raises(CudaRenderError, match="shared memory"):
        render_cuda(big.ir, "sm_80")
    assert render_cuda(big.ir, "sm_90a").dynamic_smem > 48 * 1024


def test_unknown_arch_is_rejected():
    with pytest.raises(CudaRenderError, match="sm_90a"):
        render_cuda(gemm().ir, "sm_75")


def _library():
    for name, spec in sorted(registry.all_specs().items()):
        for label in ("small", "demo"):
            if label in spec.problems:
                yield name, label, spec


@pytest.mark.parametrize("name,label,spec", list(_library()), ids=lambda x: x if isinstance(x, str) else "")
def test_every_library_kernel_renders_for_every_arch(name, label, spec):
    pf = spec.factory(**spec.problems[label].params)
    for arch in ALL_ARCHS:
        try:
            prog = render_cuda(pf.ir, arch)
        except CudaRenderError as e:  # only a shared-memory budget may refuse a target
            assert "shared memory" in str(e) and ARCHS[arch].max_smem < 227 * 1024, e
            continue
        assert "asm" not in prog.source and prog.dynamic_smem <= ARCHS[arch].max_smem
