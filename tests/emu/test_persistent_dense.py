"""The dense GEMMs under the persistent L2-grouped tile scheduler (issue 21 item 5;
``dense_gemm`` / ``fp8_gemm`` / ``fp8_fp4_gemm(persistent=G)``, ``kernforge/backends/cuda/persistent.py``)
on cuda-emu.

Their GPU configuration (``kernels/gemm/config``) asks for it, so the bench problems of
``bf16_gemm_nt``, ``fp8_gemm_nt`` and ``fp8_fp4_gemm_nt`` launch ``min(#tiles, #SMs)`` CTAs, each
walking output tiles in L2-grouped order.  Checked against the interpreter on ragged shapes (M and
N not multiples of the tile), with the SM count set below the tile count (every CTA runs several
tiles, so each ring's running stage/parity count crosses tile boundaries) and at the arch's own
count (fewer tiles than CTAs: one CTA per tile), on poisoned outputs (a tile no CTA runs shows),
and with ``accumulate`` (``D += A @ B^T``, so a tile run twice shows too: every tile exactly once).
sm_90a: warp-specialized bf16 (2-CTA clusters) and fp8 (promotion ring), FP8 x FP4 (cp.async);
sm_100a: tcgen05 bf16, fp8 and block-scaled UE8M0 fp8; sm_80: fp8 (cp.async).  Bugs planted in the generated source
must fail.  "CUDA semantics verified on host emulation", never GPU verified.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import kernforge
from kernforge.backends import registry as backends
from kernforge.backends.cuda import persistent
from kernforge.backends.cuda.renderer import render_cuda
from kernforge.backends.cuda_emu.backend import EmulationError
from kernforge.kernels.gemm import config, get_mn_major_tma_aligned_tensor, pack_ue8m0_to_int
from kernforge.kernels.registry import all_specs
from tests.emu.planted import plant

SPECS = all_specs()
BF16 = dict(dtype="bfloat16", out_dtype="bfloat16")
# (kernel, arch, params): ragged M and N, 3-4 row tiles x 3 N tiles, K steps not a multiple of the stages
CASES = {
    "bf16_sm90a_cluster": ("bf16_gemm_nt", "sm_90a", dict(M=200, N=160, K=192, block_M=64, block_N=64, block_K=64,
                                                           num_stages=2, cluster=2, persistent=2, **BF16)),
    # the bench configuration's shape, shrunk: two consumer warpgroups, 128x128 tiles, 3 stages
    "bf16_sm90a_2wg": ("bf16_gemm_nt", "sm_90a", dict(M=300, N=320, K=128, block_M=128, block_N=128, block_K=64,
                                                       num_stages=3, threads=256, persistent=2, **BF16)),
    "fp8_sm90a_acc": ("fp8_gemm_nt", "sm_90a", dict(M=150, N=160, K=384, block_M=64, block_N=64, accumulate=True,
                                                     persistent=2)),
    # opt-in (its configuration stays one CTA per tile): cp.async rings, no barrier state to carry
    "fp8_fp4_sm90a": ("fp8_fp4_gemm_nt", "sm_90a", dict(M=100, N=160, K=256, block_M=32, block_N=64, persistent=2)),
    "bf16_sm100a_acc": ("bf16_gemm_nt", "sm_100a", dict(M=200, N=160, K=192, block_M=64, block_N=64, block_K=64,
                                                         num_stages=2, accumulate=True, persistent=2, **BF16)),
    "fp8_sm100a": ("fp8_gemm_nt", "sm_100a", dict(M=150, N=160, K=384, block_M=64, block_N=64, persistent=2)),
    # sm_80: cp.async rings, mma.sync
    "fp8_sm80": ("fp8_gemm_nt", "sm_80", dict(M=150, N=160, K=384, block_M=64, block_N=64, persistent=2)),
    # tcgen05 block-scaled MMAs (the scales copied to tensor memory each K step), 128-row tiles
    "fp8_ue8m0_sm100a": ("fp8_gemm_nt", "sm_100a", dict(M=300, N=160, K=528, block_M=128, block_N=64, threads=256,
                                                         sf_format="ue8m0", gran_n=1, out_dtype="float32",
                                                         persistent=3)),
}
SM_COUNT = 4


def n_tiles(params: dict) -> int:
    return -(-params["N"] // params["block_N"]) * -(-params["M"] // params["block_M"])


def _inputs(name: str, params: dict):
    """Inputs (outputs poisoned; with ``accumulate`` the old D random, so a tile's second run
    adds its product twice) and an identical copy for the interpreter."""
    spec = SPECS[name]
    inputs = spec.make_inputs(params, 0, "cpu")
    if params.get("sf_format") == "ue8m0":  # packed power-of-two scales, 2^-6..2^6
        g = torch.Generator().manual_seed(2)
        kb, rows_b = -(-params["K"] // 128), -(-params["N"] // params["gran_n"])
        scales = lambda rows: torch.exp2(torch.randint(-6, 7, (rows, kb), generator=g).float())  # noqa: E731
        inputs[1] = get_mn_major_tma_aligned_tensor(pack_ue8m0_to_int(scales(params["M"])))
        inputs[3] = pack_ue8m0_to_int(scales(rows_b))
    for i in spec.outputs:
        inputs[i] = inputs[i].to(getattr(torch, params.get("out_dtype", "bfloat16")))
        if params.get("accumulate"):
            g = torch.Generator().manual_seed(1)
            inputs[i].copy_(torch.randn(inputs[i].shape, generator=g))
        else:
            inputs[i].fill_(float("nan"))
    return inputs, [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]


def _agree(got: torch.Tensor, want: torch.Tensor) -> bool:
    return bool(np.allclose(got.float().numpy(), want.float().numpy(), rtol=2.0 ** -7, atol=1e-3))


def _check(emu, ref, name: str, params: dict, M: int) -> None:
    params = dict(params, M=M)
    inputs, oracle = _inputs(name, params)
    emu(*inputs)
    ref(*oracle)
    for i in SPECS[name].outputs:
        assert not torch.isnan(oracle[i]).any(), "the interpreter left outputs unwritten"
        assert _agree(inputs[i], oracle[i]), f"{name} M={M}: max |diff| " \
            f"{(inputs[i].double() - oracle[i].double()).abs().max().item():.3g}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_interp_with_more_and_fewer_tiles_than_ctas(case):
    name, arch, params = CASES[case]
    emu = kernforge.compile(SPECS[name].factory, backend="cuda-emu", arch=arch, **params)
    ref = kernforge.compile(SPECS[name].factory, backend="interp", **params)
    program = emu.launcher.program
    assert program.persistent and "kf::next_tile(" in program.source and "blockIdx.y" not in program.source
    c = program.cluster
    # more tiles than CTAs: SM_COUNT CTAs (whole clusters), each running at least two tiles
    emu.launcher.sm_count = SM_COUNT
    _check(emu, ref, name, params, params["M"])
    assert emu.launcher.last_grid == (SM_COUNT,) and n_tiles(params) >= 2 * SM_COUNT
    # fewer tiles than the arch's SMs (M is a runtime size: two row tiles, the second ragged): one
    # CTA per tile, or per CTA of a cluster unit (c adjacent N tiles, the last one padded)
    emu.launcher.sm_count = persistent.DEFAULT_SM_COUNT[arch]
    _check(emu, ref, name, params, params["block_M"] + 5)
    units = -(-params["N"] // (params["block_N"] * c)) * 2
    assert emu.launcher.last_grid == (c * units,)
    if arch == "sm_90a" and name != "fp8_fp4_gemm_nt":
        assert emu.launcher.last_variant == "tma" and "setmaxnreg_dec" in program.source
        assert program.source.count("kf::mbarrier_inval(") == 1  # rings set up once per CTA, not per tile
    if arch == "sm_100a":
        assert "kf::tcgen05_mma" in program.source and "kf_ring0 += " in program.source
    assert (c == 2) == (case == "bf16_sm90a_cluster")


def test_bench_configurations_are_persistent_on_gpus_only():
    """The GPU choosers ask for the L2-grouped loop for bf16 and FP8 x FP8 (not FP8 x FP4, whose
    persistent sm_100a build spills, nor float32's FMA kernel); the host choosers do not, and the
    factories' default is off."""
    for name in ("bf16_gemm_nt", "fp8_gemm_nt"):
        assert SPECS[name].problems["bench"].params["persistent"] == config.L2_GROUP == 16
        assert "persistent" not in SPECS[name].problems["small"].params
    for name in ("fp8_fp4_gemm_nt", "fp32_gemm_nt"):
        assert "persistent" not in SPECS[name].problems["bench"].params
    for backend in ("cpu", "interp"):
        assert "persistent" not in config.choose_dense(backend, 7168, 2048, 4096)
        assert "persistent" not in config.choose(backend, 7168, 2048, 4096)
    assert config.choose_dense("cuda", 7168, 2048, 16)["persistent"] == config.L2_GROUP
    assert config.choose("cuda", 7168, 2048, 16, a_major="k", accumulate=True)["persistent"] == config.L2_GROUP


@pytest.mark.parametrize("name", ["bf16_gemm_nt", "fp8_gemm_nt", "fp8_fp4_gemm_nt"])
def test_host_backends_see_the_same_program(name):
    """``persistent`` only records a request: the CPU backend's source is the same but for the
    kernel's name, and without the request the CUDA source has no tile loop."""
    params = dict(SPECS[name].problems["small"].params)
    params.pop("M")
    asked, plain = SPECS[name].factory(**params, persistent=4).ir, SPECS[name].factory(**params).ir
    assert asked.attrs["persistent_schedule"] == "l2_group=4" and "persistent_schedule" not in plain.attrs
    assert asked.name == plain.name + "_p4"
    cpu = backends.get("cpu")

    def code(kernel):  # the source past its leading comment (which lists the factory's parameters)
        return [line for line in cpu.source(kernel).replace(asked.name, plain.name).splitlines()
                if not line.startswith("// Specialisation:")]

    assert code(asked) == code(plain)
    assert "next_tile" not in render_cuda(plain, "sm_90a").source


# ---------------------------------------------------------------- planted bugs

def _sub(pattern, repl, count):
    def mutate(src):
        out, n = re.subn(pattern, repl, src, count=count)
        assert n == count, (pattern, n)
        return out
    return mutate


BUGS = {
    # CTAs overlap (stride gridDim.x - 1): CTA c's later tiles are CTA c+1's, so some tiles run twice
    # and every tile at least once -- only the accumulating output (D += twice) shows it
    "tiles_run_twice": _sub(r"kf_tile \+= \(int32_t\)gridDim.x\)", "kf_tile += (int32_t)gridDim.x - 1)", 2),
    # CTAs stride past tiles (2 x gridDim.x): half the tiles never run
    "tiles_skipped": _sub(r"kf_tile \+= \(int32_t\)gridDim.x\)", "kf_tile += 2 * (int32_t)gridDim.x)", 2),
    # the producer's running ring count is not carried over: its fills restart at stage 0, phase 0
    "ring_count_reset": _sub(r"\n\s*kf_ring0 \+= kf_end\d+ - 0;", "", 1),
}
PLANTED = "fp8_sm90a_acc"


@pytest.fixture(scope="module")
def planted():
    """One emulated module holding the clean generated source and each mutant."""
    name, arch, params = CASES[PLANTED]
    p = plant(SPECS[name], params, arch, {bug: (mutate, None) for bug, mutate in BUGS.items()},
              "emu_test_persistent_dense_planted", timeout_ms=3_000)
    p.emu.launcher.sm_count = SM_COUNT
    return p


def _run(p, tag: str) -> bool:
    """Whether copy ``tag`` agrees with the interpreter (an emulation error -- a barrier protocol
    violation or a bounded wait's timeout -- counts as disagreement)."""
    p.emu.launcher.emulated = p.module.kernel(tag, timeout_ms=p.timeout_ms)
    try:
        _check(p.emu, p.ref, p.spec.name, p.params, p.params["M"])
    except (AssertionError, EmulationError):
        return False
    return True


def test_unmutated_copy_passes_the_harness(planted):
    assert _run(planted, "clean")


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_planted_bug_is_caught(planted, bug):
    assert not _run(planted, bug), f"planted bug {bug} went unnoticed"
