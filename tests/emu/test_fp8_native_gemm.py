"""The fp8 grouped GEMM on its native sm_90a path (fp8 ``wgmma`` m64nNk32 straight from the
TMA'd / cp.async'd fp8 tiles, no bf16 shadow) under host emulation, against the interpreter
and the kernel's own float64-bounded check; and bugs planted in that path must be caught.

The library's "small" problems use tiles under 64 rows (mma.sync, bf16 shadow), so these cases
pin 64-row tiles: one TMA case (K = 256: 256-byte rows) and one cp.async case (K = 200: rows
not a multiple of 16 bytes, the launch falls back), both with a ragged last K block and an
expert without rows.  Both tiles are 128-byte swizzled (128-element fp8 K blocks): written by
the swizzled TMA map in one case and by cp.async chunks at the swizzled offsets in the other.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

import kernforge
from kernforge.backends.cuda.renderer import render_cuda
from kernforge.backends.cuda_emu.backend import CudaEmuBackend, EmulatedModule, EmulationError
from kernforge.kernels.registry import get

SPEC = get("m_grouped_fp8_gemm_nt_contiguous")
CASES = {
    "tma": dict(group_rows=[70, 0, 33], alignment=64, num_groups=3, N=128, K=256, block_M=64, block_N=64,
                num_stages=2),
    "cp.async": dict(group_rows=[64, 5], alignment=64, num_groups=2, N=64, K=200, block_M=64, block_N=64,
                     num_stages=2),
}


def _agree(got, want):
    return all(np.allclose(g, w, rtol=2 ** -7, atol=1e-2, equal_nan=False) for g, w in zip(got, want))


def _run(params, emulated=None):
    emu = kernforge.compile(SPEC.factory, backend="cuda-emu", arch="sm_90a", **params)
    ref = kernforge.compile(SPEC.factory, backend="interp", **params)
    if emulated is not None:
        emu.launcher.emulated = emulated
    inputs = SPEC.make_inputs(params, 0, "cpu")
    oracle = [t.clone() for t in inputs]
    emu(*inputs)
    ref(*oracle)
    got = [inputs[i] for i in SPEC.outputs]
    return emu, inputs, got, [oracle[i] for i in SPEC.outputs]


@pytest.mark.parametrize("variant", sorted(CASES))
def test_native_fp8_path_matches_interpreter_and_reference(variant):
    params = CASES[variant]
    src = render_cuda(SPEC.factory(**params).ir, "sm_90a").source
    assert "kf::wgmma_m64nNk32_f32_e4m3<64>" in src and "_bf16[" not in src and "wgmma_m64nNk16" not in src
    emu, inputs, got, want = _run(params)
    assert emu.launcher.last_variant == variant
    assert _agree([g.float().numpy() for g in got], [w.float().numpy() for w in want])
    SPEC.check(got, SPEC.reference(inputs, params), inputs, params)


def _swap_k_halves(src):
    # each k32 descriptor starts at the wrong 16-byte piece of its 128-byte row: K halves exchanged
    return src.replace("((kf_kk * 32) & 127)", "(((kf_kk * 32) & 127) ^ 16)")


def _k16_steps(src):
    # a k16-style step (16 bytes of K per instruction instead of 32): half of K never read
    return src.replace("(kf_kk * 32)", "(kf_kk * 16)")


def _wrong_sbo(src):
    # 8-row groups 128 bytes too close: rows 8.. read the wrong (and unswizzled) rows
    return re.sub(r"(make_smem_desc\(B_shared[^;]*, 16, )(\d+)(, 1\);)",
                  lambda m: f"{m.group(1)}{int(m.group(2)) - 128}{m.group(3)}", src)


BUGS = {"swap_k_halves": _swap_k_halves, "k16_steps": _k16_steps, "wrong_sbo": _wrong_sbo}


@pytest.fixture(scope="module")
def planted():
    params = CASES["tma"]
    ir = SPEC.factory(**params).ir
    clean = CudaEmuBackend().source(ir, "sm_90a")
    parts = []
    for bug, mutate in BUGS.items():
        mutated = mutate(clean)
        assert mutated != clean, f"planting {bug} changed nothing: the generated code moved"
        parts.append(mutated.replace(f"kf_emu_{ir.name}(", f"kf_emu_{bug}(").replace(f"kf_{ir.name}(",
                                                                                     f"kf_{ir.name}_{bug}("))
    return EmulatedModule("emu_test_fp8_native_planted", "\n".join(parts),
                          dynamic_smem=render_cuda(ir, "sm_90a").dynamic_smem, arch="sm_90a")


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_planted_bug_in_native_fp8_path_is_caught(planted, bug):
    try:
        _, _, got, want = _run(CASES["tma"], planted.kernel(bug, timeout_ms=5_000))
    except EmulationError:
        return
    assert not _agree([g.float().numpy() for g in got], [w.float().numpy() for w in want]), \
        f"planted bug {bug} in the native fp8 gemm went unnoticed"
