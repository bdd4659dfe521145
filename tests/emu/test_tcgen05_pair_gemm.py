"""The generated sm_100a 2-CTA GEMM (``dense_gemm(cta_pair=True)``, ``kernforge.backends.cuda.tcgen05_pair``)
on cuda-emu, against float64 torch on NaN-poisoned outputs.

A cluster of two CTAs along grid y computes a 256-row tile: each CTA loads its 128 rows of A and half
of the B tile into its own stage, the odd CTA arrives on the even CTA's ``ready`` barrier, the even
CTA issues ``tcgen05.mma.cta_group::2`` (M = 256) and commits with multicast 0b11 to both CTAs'
MMA barrier, each CTA reads its own rows from its own TMEM (the protocol of the hand-written
``PAIR_RING`` in tests/emu/test_tcgen05_pair.py, here rendered by the backend).  Ragged shapes: an
odd number of M blocks (the last pair's odd CTA has no rows), N not a multiple of the tile, K
tails; persistent kernels (the library's bench configuration among them), the scaled FP8 GEMM
(``fp8_gemm(cta_pair=True)``, read back every K step) against the interpreter, and the cp.async
fallback.  The plan's refusals, and bugs planted in the generated source of a persistent pair
under a perturbed schedule (the odd CTA issuing too, the commit without multicast or to one CTA,
the leader not waiting for the peer's half or waiting the wrong phase, each CTA loading the same
B half, the expect-tx of the whole B tile, a cta_group::1 alloc) must fail.  "CUDA semantics verified on host emulation", never GPU verified."""
from __future__ import annotations

import re

import pytest
import torch

import kernforge
from kernforge.backends.cuda.renderer import render_cuda
from kernforge.backends.cuda_emu.backend import CudaEmuBackend, EmulationError, cluster_smem_bytes
from kernforge.kernels.registry import all_specs
from tests.emu.planted import copies_module, mutants

SPEC = all_specs()["bf16_gemm_nt"]
FP8 = all_specs()["fp8_gemm_nt"]
TILES = dict(block_M=128, block_N=128, block_K=64, num_stages=2, threads=128, dtype="bfloat16",
             out_dtype="bfloat16", cta_pair=True)


def _run(params: dict, kernel=None, sm_count=None) -> tuple[torch.Tensor, torch.Tensor, object]:
    """(the emulated output, float64 A @ B^T [+ D], the compiled kernel) on a NaN-poisoned output
    (an accumulating kernel starts from random D instead)."""
    emu = kernforge.compile(SPEC.factory, backend="cuda-emu", arch="sm_100a", **params)
    if sm_count:
        emu.launcher.sm_count = sm_count
    if kernel is not None:
        emu.launcher.emulated = kernel
    A, B, D = SPEC.make_inputs(params, 0, "cpu")[:3]
    ref = A.double() @ B.double().T
    if params.get("accumulate"):
        D.copy_(torch.randn(D.shape, generator=torch.Generator().manual_seed(5)))
        ref = ref + D.double()
    else:
        D.fill_(float("nan"))
    emu(A, B, D)
    return D, ref, emu


def _close(out: torch.Tensor, ref: torch.Tensor) -> bool:
    """bf16 output rounding (2^-8 relative) over a float32 sum."""
    return bool(not torch.isnan(out).any() and ((out.double() - ref).abs() <= 2.0 ** -8 * ref.abs() + 1e-2).all())


# ---------------------------------------------------------------- the plan


def test_generated_pair_protocol():
    program = render_cuda(SPEC.factory(**{**TILES, "N": 256, "K": 192}).ir, "sm_100a")
    src = program.source
    assert program.cluster == 2 and program.cluster_axis == 1 and program.cluster_reason == ""
    assert "__cluster_dims__(1, 2, 1)" in src
    maps = {m.buffer: m for m in program.tensor_maps}
    assert maps["B"].box == (64, 64) and maps["A"].box == (128, 64)  # B: the CTA's half
    for pair_form in ("tmem_alloc_cg2(", "tmem_relinquish_alloc_permit_cg2(", "tcgen05_mma_f16_cg2(",
                      "tcgen05_commit_cg2_multicast(kf_mma_bar, 0x3)", "tmem_dealloc_cg2(",
                      "mbarrier_arrive_cluster(kf_pair_ready, kf_cta_rank & ~1u)"):
        assert pair_form in src, pair_form
    # PTX: one .cta_group per kernel -- no single-CTA tcgen05 form is left
    assert not re.search(r"tcgen05_mma_f16\(|tcgen05_commit\(|tmem_alloc\(|tmem_dealloc\(", src)
    assert src.count("tcgen05_mma_f16_cg2(") == 1 and "0x10200490u" in src  # M = 256, N = 128 over the pair
    # each CTA's full barrier: its A box (128 x 64) + its B half (64 x 64), bf16
    assert "kf::mbarrier_arrive_expect_tx(kf_bars0 + (0), 24576u)" in src
    assert "(int32_t)kf_cta_rank * 64" in src and "kf_cta_rank * 4096u" not in src  # own stage start
    assert src.count("kf::cluster_sync();") == 2  # after the setup, before the dealloc


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_archs_without_tcgen05_render_as_before(arch):
    asked = {**TILES, "N": 256, "K": 192}
    program = render_cuda(SPEC.factory(**asked).ir, arch)
    assert program.cluster == 1 and "sm_" in program.cluster_reason
    assert program.source.replace("_t128_pair", "_t128") == render_cuda(SPEC.factory(**dict(asked, cta_pair=False)).ir,
                                                               arch).source


@pytest.mark.parametrize("change,why", [
    (dict(block_M=64), "not one M = 128 block"),
    (dict(block_M=256, threads=256), "not one M = 128 block"),
    (dict(dtype="float32", block_K=32), "tcgen05 gemm"),
    (dict(block_N=64, num_stages=1), "statement of a TMA ring's body"),  # one stage: no ring
])
def test_unpaired_shapes_keep_the_single_cta_kernel(change, why):
    asked = {**TILES, "N": 256, "K": 192, **change}
    program = render_cuda(SPEC.factory(**asked).ir, "sm_100a")
    assert program.cluster == 1 and why in program.cluster_reason, program.cluster_reason
    assert "_cg2" not in program.source


def test_block_scaled_fp8_is_not_paired():
    """UE8M0 scales fold into block-scaled MMAs, whose pair form (scale factors per CTA) is not done."""
    kernel = FP8.factory(N=256, K=512, block_M=128, block_N=128, num_stages=2, threads=256, sf_format="ue8m0",
                         cta_pair=True).ir
    program = render_cuda(kernel, "sm_100a")
    assert program.cluster == 1 and "block-scaled" in program.cluster_reason, program.cluster_reason
    assert "block_scale" in program.source and "_cg2" not in program.source


# ---------------------------------------------------------------- cuda-emu against float64


@pytest.mark.parametrize("M,N,K,extra,sm_count", [
    (300, 200, 200, {}, None),                  # 3 M blocks: the last pair's odd CTA has no rows; N, K ragged
    (256, 128, 320, {}, None),                  # one pair, five K tiles over two stages
    (40, 64, 72, dict(block_N=64), None),       # one M block: a padded odd CTA; BN = 64 (32-row halves)
    (520, 256, 136, dict(threads=256, num_stages=3, accumulate=True), None),  # 8 warps, 3 stages, D += A B^T
    (300, 200, 200, dict(persistent=2), 4),     # persistent: 2 N x 2 M units on 2 clusters, a padded odd CTA
    (520, 200, 328, dict(persistent=2, num_stages=3), 2),  # one cluster walks all 6 units; 6 K steps
    # the library's bench configuration (choose_dense: B multicast asked too; the pair wins on sm_100a)
    (520, 256, 192, dict(threads=256, num_stages=3, persistent=16, cluster=2, multicast="b"), 4),
])
def test_pair_gemm_matches_float64(M, N, K, extra, sm_count):
    params = {**TILES, "M": M, "N": N, "K": K, **extra}
    out, ref, emu = _run(params, sm_count=sm_count)
    program = emu.launcher.program
    assert program.cluster == 2 and program.cluster_axis == 1 and emu.launcher.last_variant == "tma"
    units = -(-N // params["block_N"]) * -(-(-(-M // 128)) // 2)
    if extra.get("persistent"):
        assert "kf_tby = kf_tby * 2 + (int32_t)kf_cta_rank;" in program.source
        assert emu.launcher.last_grid == (2 * min(sm_count // 2, units),)
    else:
        assert emu.launcher.last_grid == (-(-N // params["block_N"]), -(-(-(-M // 128)) // 2) * 2)
    assert _close(out, ref), (out.double() - ref).abs().max()


@pytest.mark.parametrize("M,N,K,extra,sm_count", [
    (300, 256, 384, {}, None),                                # 3 M blocks, 2 N blocks, 3 scale blocks of K
    (200, 128, 320, dict(persistent=2, num_stages=3), 2),     # persistent, a K tail in the last scale block
])
def test_fp8_pair_matches_the_interpreter(M, N, K, extra, sm_count):
    """The scaled FP8 GEMM (``fp8_gemm(cta_pair=True)``): its gemm is read back every 128-K block
    (cleared, promoted by the scales in registers), so each K step's pair MMAs
    (``kind::f8f6f4``) overwrite both TMEMs only once both CTAs' previous read-backs are done."""
    params = {**dict(M=M, N=N, K=K, block_M=128, block_N=128, num_stages=2, threads=256, cta_pair=True), **extra}
    inputs = FP8.make_inputs(params, 0, "cpu")
    oracle = [t.clone() for t in inputs]
    for t in (inputs[4], oracle[4]):
        t.fill_(float("nan"))
    emu = kernforge.compile(FP8.factory, backend="cuda-emu", arch="sm_100a", **params)
    if sm_count:
        emu.launcher.sm_count = sm_count
    emu(*inputs)
    kernforge.compile(FP8.factory, backend="interp", **params)(*oracle)
    program = emu.launcher.program
    assert program.cluster == 2 and "tcgen05_mma_f8f6f4_cg2(" in program.source and emu.launcher.last_variant == "tma"
    got, want = inputs[4].float(), oracle[4].float()
    assert not torch.isnan(want).any()
    torch.testing.assert_close(got, want, rtol=2.0 ** -7, atol=1e-3)


# ---------------------------------------------------------------- planted bugs

# the odd CTA's tiles land late (its thread 0 issues each stage's TMA 3 ms late), so an MMA that does
# not wait for the peer's half reads a stage that is not there yet; the clean copy runs the same way
PERTURB = (re.compile(r"(\n(\s*))(kf::mbarrier_arrive_expect_tx\()"), r"\1if (kf_cta_rank == 1) usleep(3000);\2\3")
BUGS = {
    "odd_cta_issues_too": lambda s: s.replace(
        "else if (kf_tid == 0) {\n", "if (kf_tid == 0) {\n").replace(
        "kf::mbarrier_wait_parity(kf_pair_ready, kf_mma_phase);", "if (!(kf_cta_rank & 1u)) "
        "kf::mbarrier_wait_parity(kf_pair_ready, kf_mma_phase);"),
    "commit_without_multicast": lambda s: s.replace("tcgen05_commit_cg2_multicast(kf_mma_bar, 0x3)",
                                                    "tcgen05_commit_cg2(kf_mma_bar)"),
    "commit_to_leader_only": lambda s: s.replace("tcgen05_commit_cg2_multicast(kf_mma_bar, 0x3)",
                                                 "tcgen05_commit_cg2_multicast(kf_mma_bar, 0x1)"),
    "leader_skips_ready_wait": lambda s: s.replace("kf::mbarrier_wait_parity(kf_pair_ready, kf_mma_phase);", ""),
    "ready_wait_wrong_phase": lambda s: s.replace("kf::mbarrier_wait_parity(kf_pair_ready, kf_mma_phase);",
                                                  "kf::mbarrier_wait_parity(kf_pair_ready, kf_mma_phase ^ 1u);"),
    "same_b_half": lambda s: s.replace(" + (int32_t)kf_cta_rank * 64", ""),
    "expect_whole_b_tile": lambda s: s.replace("24576u)", "32768u)"),
    "single_cta_alloc": lambda s: s.replace("tmem_alloc_cg2(", "tmem_alloc(").replace(
        "tmem_relinquish_alloc_permit_cg2(", "tmem_relinquish_alloc_permit("),
}
# persistent, one cluster walking both M units: a tile's MMAs also race the previous tile's read-back
PLANTED = dict(TILES, M=300, N=128, K=192, persistent=2)
PLANTED_SMS = 2



@pytest.fixture(scope="module")
def planted():
    ir = SPEC.factory(**{k: v for k, v in PLANTED.items() if k != "M"}).ir
    clean, n = PERTURB[0].subn(PERTURB[1], CudaEmuBackend().source(ir, "sm_100a"))
    assert n == 2, "the perturbation no longer matches the generated code"
    clean = "#include <unistd.h>\n" + clean
    return copies_module("tcgen05_pair_gemm_planted", ir.name, {"clean": clean, **mutants(clean, BUGS)}, "sm_100a",
                         cluster_smem_bytes(render_cuda(ir, "sm_100a").dynamic_smem, 2))


def test_perturbed_clean_copy_passes(planted):
    out, ref, _ = _run(PLANTED, kernel=planted.kernel("clean", timeout_ms=20_000), sm_count=PLANTED_SMS)
    assert _close(out, ref)


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_planted_bug_fails(planted, bug):
    try:
        out, ref, _ = _run(PLANTED, kernel=planted.kernel(bug, timeout_ms=3_000), sm_count=PLANTED_SMS)
    except EmulationError:
        return
    assert not _close(out, ref), f"planted {bug} went unnoticed"


def test_unaligned_operands_fall_back_to_the_single_cta_cp_async_variant():
    """K = 100 bf16 rows are not 16-byte strides: no tensor map, so the launcher runs the cp.async
    variant, which has no TMA ring to pair (one CTA per tile), with the same result."""
    out, ref, emu = _run({**TILES, "M": 300, "N": 200, "K": 100})
    assert emu.launcher.last_variant == "cp.async" and "16 bytes" in emu.launcher.last_fallback_reason
    assert render_cuda(SPEC.factory(**{**TILES, "N": 200, "K": 100}).ir, "sm_100a", tma=False).cluster == 1
    assert _close(out, ref), (out.double() - ref).abs().max()
