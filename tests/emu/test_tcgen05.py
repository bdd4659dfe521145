"""sm_100a tcgen05.mma + tensor memory on host emulation (issue 21, item 6).

The library GEMMs and MLA decode, at small sizes whose gemms the layout planner sends to
tcgen05 (64-row warpgroup blocks), must match the interpreter on cuda-emu for sm_100a; the
instruction descriptor must follow the PTX table; and bugs planted in the generated source
(a descriptor declaring no swizzle over a 128B-swizzled tile, a wrong N in the instruction
descriptor, a missing MMA-completion wait, an over-allocation of tensor memory) must make the
emulated run disagree with the interpreter or stop with an error.  "CUDA semantics verified
on host emulation", never GPU verified.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import kernforge
from kernforge import dtypes
from kernforge.backends.cuda import tcgen05
from kernforge.backends.cuda_emu.backend import CudaEmuBackend
from kernforge.codegen.renderer import Target
from kernforge.kernels.registry import all_specs
from tests.emu.planted import agree, assert_caught, plant, run

SPECS = all_specs()
# small problems whose gemms take the tcgen05 path (block_M / block_H = 64)
CASES = {
    "m_grouped_gemm_nt_contiguous": dict(group_rows=[5, 0, 70], alignment=64, num_groups=3, N=64, K=128,
                                         block_M=64, block_N=32, block_K=64),
    "m_grouped_gemm_nt_masked": dict(masked_rows=[20, 0, 64], max_m=64, num_groups=3, N=64, K=64, block_M=64,
                                     block_N=32, block_K=64),
    # e4m3 K-major tiles: tcgen05.mma kind::f8f6f4 on the fp8 tiles themselves (no bf16 shadow)
    "m_grouped_fp8_gemm_nt_contiguous": dict(group_rows=[40, 0, 9], alignment=64, num_groups=3, N=128, K=256,
                                             block_M=64, block_N=64),
    "fp8_gemm_nt": dict(M=70, N=64, K=264, block_M=64, block_N=64),
    # the dense bf16 GEMM: its accumulator stays in TMEM across a ragged K loop (5 tiles, the last
    # one 8 deep)
    "bf16_gemm_nt": dict(M=70, N=96, K=264, block_M=64, block_N=32, block_K=64, dtype="bfloat16",
                         out_dtype="bfloat16"),
    "mla_decode": dict(batch=2, seqlens=[37, 5], heads=64, heads_kv=1, seq_q=1, dim=96, dim_v=64, page_size=16,
                       causal=False, block_N=16, block_H=64),
}


def _lowered(name, params):
    kernel = SPECS[name].factory(**params).ir
    return CudaEmuBackend().renderer.lower(kernel, Target("cuda-emu", "sm_100a"))[1]


@pytest.mark.parametrize("name", sorted(CASES))
def test_tcgen05_kernel_matches_interp(name):
    spec, params = SPECS[name], CASES[name]
    facts = _lowered(name, params)
    assert set(facts["layouts"].gemm_kind.values()) == {"tcgen05"}, "the case no longer exercises tcgen05"
    fp8 = any(b.dtype == dtypes.float8_e4m3 for b in SPECS[name].factory(**params).ir.params
              if hasattr(b, "dtype") and hasattr(b, "shape"))
    source = CudaEmuBackend().source(SPECS[name].factory(**params).ir, "sm_100a")
    # fp8: the fp8 tiles feed kind::f8f6f4 directly, no bf16 shadow tile (`A_shared_bf16`) is allocated
    assert ("kf::tcgen05_mma_f8f6f4(" in source) == fp8
    assert not (fp8 and "_bf16 = reinterpret_cast" in source)
    emu_inputs = spec.make_inputs(params, 0, "cpu")
    ref_inputs = [t.clone() if isinstance(t, torch.Tensor) else t for t in emu_inputs]
    emu = kernforge.compile(spec.factory, backend="cuda-emu", arch="sm_100a", **params)
    emu(*emu_inputs)
    kernforge.compile(spec.factory, backend="interp", **params)(*ref_inputs)
    for i in spec.outputs:
        got, want = emu_inputs[i], ref_inputs[i]
        assert not torch.isnan(want).all(), "oracle wrote nothing"
        np.testing.assert_allclose(got.float().numpy(), want.float().numpy(), rtol=2.0 ** -7, atol=1e-3,
                                   err_msg=f"{name} output {i}")


def test_cp_async_variant_feeds_tcgen05_too():
    """The variant a launch falls back to when its tensors break TMA's rules (sm_100a too)."""
    name = "m_grouped_gemm_nt_masked"
    spec, params = SPECS[name], CASES[name]
    kernel = spec.factory(**params).ir
    launcher = CudaEmuBackend().build(kernel, Target("cuda-emu", "sm_100a", "cp.async"))
    assert not launcher.program.tensor_maps and "kf::tcgen05_mma_f16(" in launcher.program.source
    emu = kernforge.compile(spec.factory, backend="cuda-emu", arch="sm_100a", **params)
    emu.launcher.emulated = launcher.emulated
    emu.launcher.tensor_maps = ()
    inputs = spec.make_inputs(params, 1, "cpu")
    oracle = [t.clone() if hasattr(t, "clone") else t for t in inputs]
    emu(*inputs)
    kernforge.compile(spec.factory, backend="interp", **params)(*oracle)
    for i in spec.outputs:
        np.testing.assert_allclose(inputs[i].float().numpy(), oracle[i].float().numpy(), rtol=2.0 ** -7, atol=1e-3)


def test_instruction_descriptor_follows_the_ptx_table():
    # PTX ISA "Instruction descriptor format for .kind::f16", field by field
    fields = {"dtype": (4, 2), "atype": (7, 3), "btype": (10, 3), "trans_a": (15, 1), "trans_b": (16, 1),
              "n": (17, 6), "m": (24, 5)}

    def get(word, f):
        lo, width = fields[f]
        return (word >> lo) & ((1 << width) - 1)

    for m, n, dt, ta, tb in ((64, 8, dtypes.bfloat16, 0, 0), (64, 256, dtypes.float16, 1, 0),
                             (128, 144, dtypes.bfloat16, 0, 1)):
        d = tcgen05.instr_desc(m, n, dt, bool(ta), bool(tb))
        assert (get(d, "dtype"), get(d, "m") * 16, get(d, "n") * 8) == (1, m, n)
        assert get(d, "atype") == get(d, "btype") == (1 if dt == dtypes.bfloat16 else 0)
        assert (get(d, "trans_a"), get(d, "trans_b")) == (ta, tb)
        assert d & 0b1111 == 0 and not d >> 29 and not (d >> 23) & 1  # dense, reserved bits clear
    for bad in ((64, 4), (128, 8), (96, 64), (64, 264)):
        with pytest.raises(ValueError):
            tcgen05.instr_desc(*bad, dtypes.bfloat16, False, False)
    with pytest.raises(ValueError):
        tcgen05.instr_desc(64, 64, dtypes.float32, False, False)


# ---------------------------------------------------------------- planted bugs

GEMM = "m_grouped_gemm_nt_contiguous"


def _no_swizzle_descriptor(src):
    return re.sub(r"(make_umma_desc\([^;]*), 2\);", r"\1, 0);", src, count=1)


def _idesc_n_minus_8(src):
    def shrink(m):
        return m.group(0).replace(m.group(1), f"{int(m.group(1), 16) - (1 << 17):#010x}")
    return re.sub(r"kf::tcgen05_mma_f16\([^;]*?, (0x[0-9a-f]{8})u,", shrink, src, count=1)


def _drop_mma_wait(src):
    return re.sub(r"\n\s*kf::mbarrier_wait_parity\(kf_mma_bar[^;]*;", "", src, count=1)


def _over_allocate(src):
    return re.sub(r"(kf::tmem_alloc\(kf_tmem_slot, \d+\);)", r"\1\n    kf::tmem_alloc(kf_tmem_slot, 512);", src,
                  count=1)


# bug -> (mutation, the error it must stop with; None: a wrong result or any emulation error)
BUGS = {"no_swizzle_descriptor": (_no_swizzle_descriptor, None),
        "idesc_n_minus_8": (_idesc_n_minus_8, None),
        # the K loop keeps its sum in TMEM (test_tcgen05_resident.py): the next tile's commit then
        # arrives on a barrier phase nobody completed
        "missing_commit_wait": (_drop_mma_wait, "more arrivals than the count"),
        "tmem_over_allocation": (_over_allocate, "over-allocated")}


@pytest.fixture(scope="module")
def planted():
    """One module holding the clean source and every mutation (one compile)."""
    return plant(SPECS[GEMM], CASES[GEMM], "sm_100a", BUGS, "emu_test_tcgen05_planted", timeout_ms=5_000)


def test_unmutated_copy_passes_the_harness(planted):
    assert agree(run(planted, "clean"))


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_planted_tcgen05_bug_is_caught(planted, bug):
    assert_caught(planted, bug, BUGS)