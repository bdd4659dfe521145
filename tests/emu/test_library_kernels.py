"""Every kernel of the library (problem "small") under CUDA host emulation,
against the interpreter and against the kernel's own torch reference.

Integer and index outputs must match the interpreter exactly; floating outputs
within bf16 tolerance.  Results are "CUDA semantics verified on host
emulation", not GPU verified (docs/backends/cuda-emu.md).
"""
import numpy as np
import pytest
import torch

import kernforge
from kernforge.backends.cuda.renderer import render_cuda
from kernforge.kernels.registry import all_specs

SPECS = all_specs()
# kernels whose T.Pipelined copies must load through TMA + mbarriers on sm_90a (docs/backends/cuda.md);
# any other kernel the renderer gives tensor maps is held to the same launch rule
TMA_KERNELS = {"m_grouped_gemm_nt_contiguous", "m_grouped_fp8_gemm_nt_contiguous", "m_grouped_gemm_nt_masked",
               "mla_decode"}


def _expected_variant(name, arch, inputs):
    """TMA on sm_90a and sm_100a for the pipelined kernels, unless a TMA'd tensor's rows are not a multiple
    of 16 bytes (then the launch runs the cp.async variant)."""
    if arch not in ("sm_90a", "sm_100a"):
        return "cp.async"
    spec = SPECS[name]
    maps = render_cuda(spec.factory(**spec.problems["small"].params).ir, arch).tensor_maps
    assert maps or name not in TMA_KERNELS, f"{name}: no TMA loads rendered"
    if not maps:
        return "cp.async"
    tensors = [inputs[m.param_index] for m in maps]
    aligned = all(t.stride(i) * t.element_size() % 16 == 0 for t in tensors for i in range(t.dim() - 1))
    return "tma" if aligned else "cp.async"


def _as_float(t):
    return t.float().numpy() if t.dtype.is_floating_point else t.numpy()


@pytest.mark.parametrize("arch", ["sm_90a", "sm_80", "sm_100a"])  # wgmma + TMA; mma.sync + cp.async; TMA (+ mma.sync at these sizes)
@pytest.mark.parametrize("name", sorted(SPECS))
def test_library_kernel_matches_interp(name, arch):
    spec = SPECS[name]
    params = spec.problems["small"].params
    emu_inputs = spec.make_inputs(params, 0, "cpu")
    ref_inputs = [t.clone() if isinstance(t, torch.Tensor) else t for t in emu_inputs]
    emu = kernforge.compile(spec.factory, backend="cuda-emu", arch=arch, **params)
    emu(*emu_inputs)
    assert emu.launcher.last_variant == _expected_variant(name, arch, emu_inputs)
    kernforge.compile(spec.factory, backend="interp", **params)(*ref_inputs)
    for i in spec.outputs:
        got, want = emu_inputs[i], ref_inputs[i]
        if got.dtype.is_floating_point:
            assert not torch.isnan(want).all(), "oracle wrote nothing"
            np.testing.assert_allclose(_as_float(got), _as_float(want), rtol=2.0 ** -7, atol=1e-3,
                                       err_msg=f"{name} output {i}")
        else:
            np.testing.assert_array_equal(got.numpy(), want.numpy(), err_msg=f"{name} output {i}")
    spec.check([emu_inputs[i] for i in spec.outputs], spec.reference(emu_inputs, params), emu_inputs, params)


def test_cli_run_and_ops_reach_cuda_emu(capsys):
    """The backend name works wherever a backend is chosen: the CLI and the ops."""
    from kernforge import cli
    from kernforge.ops.topk import topk

    assert cli.main(["run", "topk_fp32", "--backend", "cuda-emu", "--problem", "small", "--repeat", "1"]) == 0
    row = capsys.readouterr().out
    assert "cuda-emu" in row and "verified" in row and "FAILED" not in row
    x = torch.randn(3, 500, generator=torch.Generator().manual_seed(7))
    values, indices = topk(x, 8, sorted=True, backend="cuda-emu")
    want_values, want_indices = torch.topk(x, 8)
    assert torch.equal(indices, want_indices)
    assert torch.equal(values, want_values)
