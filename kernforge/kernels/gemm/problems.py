"""The dense block-scaled GEMM catalogue entries: problems, inputs, references and error bounds."""
from __future__ import annotations

import torch

from kernforge.kernels.gemm import config
from kernforge.kernels.gemm.kernel import dense_gemm, fp8_fp4_gemm, fp8_gemm
from kernforge.kernels.gemm.reference import (calc_diff, dequantize, dequantize_fp4, get_mn_major_tma_aligned_tensor,
                                              per_block_cast_to_fp8, per_token_cast_to_fp4, per_token_cast_to_fp8,
                                              reference)
from kernforge.kernels.registry import KernelSpec, Problem, register

_RUNTIME_SIZES = ("M",)
# DeepGEMM's test_fp8_fp4.py acceptance thresholds on calc_diff
FP8_DIFF, FP4_DIFF = 0.001, 0.01


def error_bound(a: torch.Tensor, b: torch.Tensor, expected: torch.Tensor, rounding_steps: int = 3) -> torch.Tensor:
    """Elementwise bound on ``|D - reference|`` for dequantized float64 ``a [M, K]``,
    ``b [N, K]``: e4m3 and e2m1 products are exact in float32; the K-slice sums, their
    promotion (two scale multiplies and an add, ``rounding_steps``) and the running sum err
    by at most ``(K + rounding_steps + 1) 2^-24 sum|a_i b_i|``; the bf16 store adds ``2^-8 |d|``."""
    absprod = a.abs().double() @ b.abs().double().T
    return 2.0 ** -8 * expected.abs() + (a.shape[-1] + rounding_steps + 1) * 2.0 ** -24 * absprod + 1e-30


def assert_close(d: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor, max_diff: float = FP8_DIFF) -> None:
    """No NaN (unwritten elements), every element within its bound, and DeepGEMM's
    ``calc_diff`` under ``max_diff``."""
    got = d.cpu().double()
    assert not torch.isnan(got).any(), "D has NaN (unwritten or poisoned elements)"
    if got.numel() == 0:
        return
    excess = (got - expected.cpu()).abs() - bound.cpu()
    worst = excess.max().item()
    where = tuple(int(i) for i in torch.unravel_index(excess.argmax(), excess.shape))
    assert worst <= 0, f"D exceeds its error bound by {worst:.3g} at {where}"
    diff = calc_diff(got, expected.cpu())
    assert diff < max_diff, f"calc_diff {diff:.3g} >= {max_diff}"


def _operands(params: dict, seed: int):
    g = torch.Generator().manual_seed(seed)
    m, n, k = params["M"], params["N"], params["K"]
    return torch.randn(m, k, generator=g), torch.randn(n, k, generator=g) * 2, \
        torch.full((m, n), float("nan"), dtype=torch.bfloat16)


def make_inputs(params: dict, seed: int, device: str = "cpu") -> list:
    """``[A, SFA, B, SFB, D]``: SFA in DeepGEMM's MN-major TMA-aligned layout, D poisoned."""
    a, b, d = _operands(params, seed)
    (a8, sfa), (b8, sfb) = per_token_cast_to_fp8(a), per_block_cast_to_fp8(b)
    return [a8.to(device), get_mn_major_tma_aligned_tensor(sfa.to(device)), b8.to(device), sfb.to(device),
            d.to(device)]


def _dequantized(inputs: list) -> tuple[torch.Tensor, torch.Tensor]:
    a8, sfa, b8, sfb = (t.cpu() for t in inputs[:4])
    return dequantize(a8, sfa, (1, 128)), dequantize(b8, sfb, (128, 128))


def _check(outputs: list, expected: list, inputs: list, params: dict) -> None:
    a, b = _dequantized(inputs)
    assert_close(outputs[0], expected[0], error_bound(a, b, expected[0]))


def _flops(p: dict) -> float:
    return 2.0 * p["M"] * p["N"] * p["K"]


SPEC = register(KernelSpec(
    name="fp8_gemm_nt",
    family="gemm",
    description="DeepGEMM-style dense FP8 GEMM, 1x128 / 128x128 float32 scales, fp32 promotion per K block",
    factory=fp8_gemm,
    runtime_sizes=_RUNTIME_SIZES,
    # "small" and "demo" pin small tiles on purpose (several N tiles per scale block, ragged
    # M/N/K edges in "small", odd multiples of 128 in "demo"); "bench" takes the op's CUDA tiles
    problems={
        "small": Problem("small", dict(M=37, N=160, K=264, block_M=32, block_N=64)),
        "demo": Problem("demo", dict(M=200, N=384, K=640, block_M=64, block_N=64)),
        # a DeepSeek-V3 projection shape of DeepGEMM's dense test (N=7168, K=2048 is its
        # o-proj-like (7168, 16384) shortened), prefill-sized M; a_major names the FP8 x FP8
        # kernel to the shared chooser (its cluster request)
        "bench": Problem("bench", dict(M=4096, **config.choose.heuristic("cuda", 7168, 2048, 4096, a_major="k"))),
    },
    make_inputs=make_inputs,
    outputs=(4,),
    reference=lambda inputs, params: [reference(*_dequantized(inputs))],
    check=_check,
    flops=_flops,
    bytes=lambda p: p["M"] * p["K"] + p["N"] * p["K"] + 2.0 * p["M"] * p["N"],
    tags=("gemm", "fp8"),
))


def make_inputs_fp4(params: dict, seed: int, device: str = "cpu") -> list:
    """``[A, SFA, B (FP4), SFB (1x32), D]``."""
    a, b, d = _operands(params, seed)
    (a8, sfa), (b4, sfb) = per_token_cast_to_fp8(a), per_token_cast_to_fp4(b)
    return [a8.to(device), get_mn_major_tma_aligned_tensor(sfa.to(device)), b4.to(device), sfb.to(device),
            d.to(device)]


def _dequantized_fp4(inputs: list) -> tuple[torch.Tensor, torch.Tensor]:
    a8, sfa, b4, sfb = (t.cpu() for t in inputs[:4])
    return dequantize(a8, sfa, (1, 128)), dequantize_fp4(b4, sfb)


def _check_fp4(outputs: list, expected: list, inputs: list, params: dict) -> None:
    a, b = _dequantized_fp4(inputs)
    assert_close(outputs[0], expected[0], error_bound(a, b, expected[0]), FP4_DIFF)


SPEC_FP4 = register(KernelSpec(
    name="fp8_fp4_gemm_nt",
    family="gemm",
    description="DeepGEMM-style dense FP8 x FP4 GEMM (e2m1 B, one scale per 1x32), decoded in the kernel",
    factory=fp8_fp4_gemm,
    runtime_sizes=_RUNTIME_SIZES,
    problems={
        "small": Problem("small", dict(M=37, N=160, K=256, block_M=32, block_N=64)),
        "demo": Problem("demo", dict(M=200, N=384, K=640, block_M=64, block_N=64)),
        "bench": Problem("bench", dict(M=4096, **config.choose.heuristic("cuda", 7168, 2048, 4096))),
    },
    make_inputs=make_inputs_fp4,
    outputs=(4,),
    reference=lambda inputs, params: [reference(*_dequantized_fp4(inputs))],
    check=_check_fp4,
    flops=_flops,
    bytes=lambda p: p["M"] * p["K"] + p["N"] * p["K"] / 2 + 2.0 * p["M"] * p["N"],
    tags=("gemm", "fp8", "fp4"),
))


def dense_error_bound(a: torch.Tensor, b: torch.Tensor, expected: torch.Tensor, out_dtype: str) -> torch.Tensor:
    """Elementwise bound on ``|D - a @ b^T|`` for the unscaled GEMM's float64 ``a``, ``b``
    (the operands as given, so bf16 inputs are exact): float32 products and sums err by at
    most ``(K + 1) 2^-24 sum|a_i b_i|``; the store adds half an ulp of ``out_dtype``."""
    store = 2.0 ** -8 if out_dtype == "bfloat16" else 2.0 ** -24
    absprod = a.abs().double() @ b.abs().double().T
    return store * expected.abs() + (a.shape[-1] + 1) * 2.0 ** -24 * absprod + 1e-30


def _dense_factory(dtype: str):
    def make(params: dict, seed: int, device: str = "cpu") -> list:
        """``[A, B, D]`` of ``dtype``, D poisoned."""
        a, b, d = _operands(params, seed)
        t = getattr(torch, dtype)
        return [a.to(t).to(device), b.to(t).to(device), d.to(t).to(device)]
    return make


def _dense_reference(inputs: list, params: dict) -> list:
    return [reference(inputs[0].cpu().double(), inputs[1].cpu().double())]


def _dense_check(outputs: list, expected: list, inputs: list, params: dict) -> None:
    a, b = (t.cpu().double() for t in inputs[:2])
    assert_close(outputs[0], expected[0], dense_error_bound(a, b, expected[0], params.get("out_dtype", "bfloat16")))


def _dense_spec(name: str, dtype: str) -> KernelSpec:
    size = torch.empty(0, dtype=getattr(torch, dtype)).element_size()
    return KernelSpec(
        name=name,
        family="gemm",
        description=f"DeepGEMM-style unscaled dense GEMM on {dtype} operands (bf16_gemm_nt), float32 accumulation",
        factory=dense_gemm,
        runtime_sizes=_RUNTIME_SIZES,
        problems={
            "small": Problem("small", dict(M=37, N=160, K=264, block_M=32, block_N=64, block_K=64,
                                           dtype=dtype, out_dtype=dtype)),
            # tiny()'s vocabulary head at a 256-token prefill, tiles that build without spills
            # on CUDA for both dtypes (the cpu chooser's 64-deep K spills float32 on sm_90a)
            "demo": Problem("demo", dict(M=256, N=512, K=128, block_M=64, block_N=64, block_K=32, num_stages=2,
                                         dtype=dtype, out_dtype=dtype)),
            "bench": Problem("bench", dict(M=4096, **config.choose_dense.heuristic(
                "cuda", 7168, 2048, 4096, dtype=dtype, out_dtype=dtype))),
        },
        make_inputs=_dense_factory(dtype),
        outputs=(2,),
        reference=_dense_reference,
        check=_dense_check,
        flops=_flops,
        bytes=lambda p: size * (p["M"] * p["K"] + p["N"] * p["K"] + p["M"] * p["N"]),
        tags=("gemm", dtype),
    )


SPEC_BF16 = register(_dense_spec("bf16_gemm_nt", "bfloat16"))
SPEC_FP32 = register(_dense_spec("fp32_gemm_nt", "float32"))
