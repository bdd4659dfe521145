"""Bugs planted in a copy of the generated CUDA must be caught by the emulation.

Each case mutates the renderer's output for one of the DSL kernels of
``dsl_kernels.py`` (a wrong fragment layout, a missing barrier, an off-by-one
edge mask, a wrong shuffle lane, a wrong wgmma descriptor, a descriptor that
declares no swizzle over a 128B-swizzled TMA tile, a swizzled stage off its
1024-byte alignment, a wrong TMA expect_tx byte count, a missing mbarrier wait) and
checks that the
emulated run disagrees with the interpreter or stops with an error.  The
unmutated copies run through the same harness first, so a failure can only
come from the planted bug.  All variants share one emulation module (one
compile).
"""
import re
from dataclasses import dataclass
from typing import Callable

import ml_dtypes
import numpy as np
import pytest

import kernforge
from kernforge.backends.cuda.renderer import render_cuda
from kernforge.backends.cuda_emu.backend import CudaEmuBackend, EmulatedModule, EmulationError
from kernforge.backends.cuda.tma import encode_args
from tests.emu.planted import renamed

from .dsl_kernels import gemm, masked_copy, row_stats

BF16 = ml_dtypes.bfloat16
GEMM_SHAPE = (80, 72, 72)
COPY_SHAPE = (37, 45)


def _swap_a_registers(src):
    helper = ("__device__ inline void kf_bug_mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],\n"
              "                               const float (&c)[4]) {\n"
              "  const uint32_t swapped[4] = {a[0], a[2], a[1], a[3]};  // A(g+8, .) and A(g, .+8) exchanged\n"
              "  kf::mma_m16n8k16_f32_bf16(d, swapped, b, c);\n}\n")
    return _before_kernel(src, helper).replace("kf::mma_m16n8k16_f32_bf16(kf_d,", "kf_bug_mma(kf_d,")


def _drop_pipeline_barrier(src):
    return re.sub(r"(kf::cp_async_wait<0>\(\);)\s*__syncthreads\(\);", r"\1", src, count=1)


def _wrong_expect_tx_bytes(src):
    # 128 bytes more than the stage's boxes bring: the phase can never complete.  (Fewer bytes
    # than delivered lets a phase complete early and spill the rest into the next phase, on the
    # GPU as here: whether that shows depends on thread timing, so it is not planted.)
    return re.sub(r"(mbarrier_arrive_expect_tx\([^;]*, )(\d+)u\)", lambda m: f"{m.group(1)}{int(m.group(2)) + 128}u)",
                  src, count=1)


def _drop_tma_wait(src):
    return re.sub(r"\n\s*kf::mbarrier_wait_parity\([^;]*;", "", src, count=1)


def _swap_a_descriptor_strides(src):
    # A_s (64 x 32 bf16: 64-byte rows) stays in core-matrix order: LBO 128 (next 8 K), SBO 512
    return re.sub(r"(make_smem_desc\(A_s[^;]*), 128, 512\);", r"\1, 512, 128);", src, count=1)


def _descriptor_declares_no_swizzle(src):
    # B_s (32 x 64, MN-major) is 128B-swizzled by its TMA map; its descriptor says layout type 0
    return re.sub(r"(make_smem_desc\(B_s[^;]*, 1024), 1\);", r"\1, 0);", src, count=1)


def _unaligned_swizzled_stage(src):
    # the swizzled ring 512 bytes off its 1024-byte atoms
    return re.sub(r"(B_s_ring = reinterpret_cast<kf_bf16\*>\(kf_smem \+ \d+)\)", r"\1 + 512)", src, count=1)


def _store_mask_off_by_one(src):
    return re.sub(r"< N\)\)\) \{\n(\s*)B\[", r"<= N))) {\n\1B[", src, count=1)


def _wrong_shuffle_lane(src):
    helper = ("__device__ inline float kf_bug_quad_sum(float v) {\n"
              "  v += __shfl_xor_sync(0xffffffffu, v, 1);\n"
              "  v += __shfl_xor_sync(0xffffffffu, v, 4);  // should be lane ^ 2: mixes another row in\n"
              "  return v;\n}\n")
    return _before_kernel(src, helper).replace("kf::quad_allreduce<kf::SumOp>(kf_v)", "kf_bug_quad_sum(kf_v)")


def _wrong_softmax_shuffle_lane(src):
    # the online softmax's row statistics live in kf::online_softmax_step (kf/softmax.cuh); the
    # planted copy hands each quad the running sum of the next row (lane ^ 4 instead of its own)
    helper = ("template <int MT, int NT, int WM, int WN, int WARPS>\n"
              "__device__ inline void kf_bug_online_softmax_step(float (&x)[MT * NT * 4], float (&m)[MT * 2],\n"
              "    float (&l)[MT * 2], float (&r)[MT * 2], float scale_log2, float* scratch) {\n"
              "  kf::online_softmax_step<MT, NT, WM, WN, WARPS>(x, m, l, r, scale_log2, scratch);\n"
              "  for (int s = 0; s < MT * 2; ++s) l[s] = __shfl_xor_sync(0xffffffffu, l[s], 4);\n"
              "}\n")
    return _before_kernel(src.replace("kf::online_softmax_step<", "kf_bug_online_softmax_step<"), helper)


def _before_kernel(src, text):
    i = src.index('extern "C" __global__')
    return src[:i] + text + src[i:]


@dataclass(frozen=True)
class Case:
    base: str
    mutate: Callable[[str], str]
    error: str = ""  # when set, the bug must stop the launch with a message matching this


BASES = {  # name -> (prim_func, arch)
    "gemm80": (lambda: gemm(*GEMM_SHAPE), "sm_80"),
    "gemm90": (lambda: gemm(*GEMM_SHAPE), "sm_90a"),
    "rowstats": (lambda: row_stats(80, 64), "sm_80"),
    "copy": (masked_copy, "sm_90a"),
}
BUGS = {
    "mma_fragment_layout": Case("gemm80", _swap_a_registers),
    "wgmma_descriptor_layout": Case("gemm90", _swap_a_descriptor_strides),
    "wgmma_descriptor_declares_no_swizzle": Case("gemm90", _descriptor_declares_no_swizzle),
    "tma_swizzled_stage_unaligned": Case("gemm90", _unaligned_swizzled_stage,
                                         r"shared destination must be .*1024 with a swizzle"),
    "missing_pipeline_barrier": Case("gemm80", _drop_pipeline_barrier),
    "tma_wrong_expect_tx_bytes": Case("gemm90", _wrong_expect_tx_bytes,
                                      r"deadlock: mbarrier wait .* tx bytes outstanding"),
    "tma_missing_stage_wait": Case("gemm90", _drop_tma_wait),
    "edge_mask_off_by_one": Case("copy", _store_mask_off_by_one),
    "wrong_shuffle_lane": Case("rowstats", _wrong_shuffle_lane),
}


@pytest.fixture(scope="module")
def module():
    parts, smem = [], 16
    for name, (make, arch) in BASES.items():
        ir = make().ir
        smem = max(smem, render_cuda(ir, arch).dynamic_smem)
        clean = CudaEmuBackend().source(ir, arch)
        parts.append(renamed(clean, f"clean_{name}", "main"))
        for bug, case in BUGS.items():
            if case.base == name:
                mutated = case.mutate(clean)
                assert mutated != clean, f"planting {bug} changed nothing: the generated code moved"
                parts.append(renamed(mutated, bug, "main"))
    return EmulatedModule("emu_test_planted_bugs", "\n".join(parts), dynamic_smem=smem, arch="sm_90a")


def _run(module, tag, base, rng):
    """Run variant ``tag`` of ``base``; return (outputs, oracle outputs)."""
    k = module.kernel(tag, timeout_ms=5_000)
    arch = BASES[base][1]
    if base in ("gemm80", "gemm90"):
        M, N, K = GEMM_SHAPE
        A = rng.standard_normal((M, K)).astype(BF16)
        B = rng.standard_normal((K, N)).astype(BF16)
        C = np.full((M, N), np.nan, np.float32).astype(BF16)
        specs = render_cuda(gemm(*GEMM_SHAPE).ir, arch).tensor_maps  # sm_90a: TMA pipeline
        maps = [encode_args(spec, (A, B, C)[spec.param_index]).packed() for spec in specs]
        k([A, B, C, *maps], [], [-(-N // 64), -(-M // 64)])
        want = np.full_like(C, np.nan)
        kernforge.compile(gemm(*GEMM_SHAPE), backend="interp")(A, B, want)
        return [C.astype(np.float32)], [want.astype(np.float32)]
    if base == "rowstats":
        A = rng.standard_normal((80, 64)).astype(BF16)
        B = rng.standard_normal((64, 64)).astype(BF16)
        outs = [np.full(80, np.nan, np.float32) for _ in range(2)]
        k([A, B, *outs], [], [2])
        want = [np.full(80, np.nan, np.float32) for _ in range(2)]
        kernforge.compile(row_stats(80, 64), backend="interp")(A, B, *want)
        return outs, want
    M, N = COPY_SHAPE
    A = rng.integers(-1000, 1000, size=(M, N)).astype(np.int32)
    storage = np.full(M * N + 64, -77, np.int32)  # poisoned guard after the tensor
    k([A, storage[: M * N]], [M, N], [-(-N // 32), -(-M // 16)])
    want = np.full(M * N + 64, -77, np.int32)
    want[: M * N] = (A + 1).ravel()
    return [storage], [want]


def _agree(got, want):
    return all(np.allclose(g, w, rtol=2.0 ** -7, atol=1e-3, equal_nan=False) for g, w in zip(got, want))


@pytest.mark.parametrize("base", sorted(BASES))
def test_unmutated_copies_pass_the_harness(module, base, rng):
    got, want = _run(module, f"clean_{base}", base, rng)
    assert _agree(got, want)


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_planted_bug_is_caught(module, bug, rng):
    try:
        got, want = _run(module, bug, BUGS[bug].base, rng)
    except EmulationError as e:
        assert re.search(BUGS[bug].error, str(e)), str(e)
        return  # caught as a deadlock / invalid access
    assert not BUGS[bug].error, f"planted bug {bug} ran to completion"
    assert not _agree(got, want), f"planted bug {bug} went unnoticed"


# ---- the same bugs planted in a library kernel (MLA decode: tensor cores, a cp.async
# pipeline and an online softmax whose row statistics go through quad shuffles) ----

LIBRARY_BUGS = {
    "mla_mma_fragment_layout": _swap_a_registers,
    "mla_missing_pipeline_barrier": _drop_pipeline_barrier,
    "mla_wrong_shuffle_lane": _wrong_softmax_shuffle_lane,
}


@pytest.fixture(scope="module")
def mla():
    from kernforge.kernels.registry import get

    spec = get("mla_decode")
    params = spec.problems["small"].params
    ir = spec.factory(**params).ir
    clean = CudaEmuBackend().source(ir, "sm_80")
    parts = [renamed(clean, "mla_clean", ir.name)]
    for bug, mutate in LIBRARY_BUGS.items():
        mutated = mutate(clean)
        assert mutated != clean, f"planting {bug} changed nothing: the generated code moved"
        parts.append(renamed(mutated, bug, ir.name))
    module = EmulatedModule("emu_test_planted_mla", "\n".join(parts), dynamic_smem=render_cuda(ir, "sm_80").dynamic_smem,
                            arch="sm_80")
    emu = kernforge.compile(spec.factory, backend="cuda-emu", arch="sm_80", **params)
    ref = kernforge.compile(spec.factory, backend="interp", **params)
    return spec, params, module, emu, ref


def _run_library_variant(mla, tag):
    """Launch variant ``tag`` through the compiled kernel's own argument checks and
    launcher; return (outputs, interpreter outputs)."""
    spec, params, module, emu, ref = mla
    emu.launcher.emulated = module.kernel(tag, timeout_ms=5_000)
    inputs = spec.make_inputs(params, 0, "cpu")
    oracle = [t.clone() if hasattr(t, "clone") else t for t in inputs]
    emu(*inputs)
    ref(*oracle)
    return [inputs[i].float().numpy() for i in spec.outputs], [oracle[i].float().numpy() for i in spec.outputs]


def test_library_clean_copy_passes_the_harness(mla):
    assert _agree(*_run_library_variant(mla, "mla_clean"))


@pytest.mark.parametrize("bug", sorted(LIBRARY_BUGS))
def test_library_planted_bug_is_caught(mla, bug):
    try:
        got, want = _run_library_variant(mla, bug)
    except EmulationError:
        return
    assert not _agree(got, want), f"planted bug {bug} in mla_decode went unnoticed"
