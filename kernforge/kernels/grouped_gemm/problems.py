"""The grouped GEMM catalogue entries: problems, layouts, inputs, references and error bounds."""
from __future__ import annotations

import torch

from kernforge.kernels.grouped_gemm import config
from kernforge.kernels.gemm.reference import (calc_diff, dequantize_fp4, get_mn_major_tma_aligned_tensor,
                                              per_token_cast_to_fp4)
from kernforge.kernels.grouped_gemm.kernel import (m_grouped_fp8_fp4_gemm_nt_contiguous,
                                                  m_grouped_fp8_fp4_gemm_nt_masked, m_grouped_fp8_gemm_nt_contiguous,
                                                  m_grouped_fp8_gemm_nt_masked, m_grouped_gemm_nt_contiguous,
                                                  m_grouped_gemm_nt_masked)
from kernforge.kernels.grouped_gemm.reference import (dequantize, per_block_cast_to_fp8, per_token_cast_to_fp8,
                                                     reference, reference_masked)
from kernforge.kernels.registry import KernelSpec, Problem, register


_RUNTIME_SIZES = ("group_rows", "alignment")


def contiguous_layout(group_rows: list[int], alignment: int, device="cpu") -> torch.Tensor:
    """``m_indices`` for experts with ``group_rows`` rows: each segment padded with ``-1``
    up to a multiple of ``alignment`` (DeepGEMM's contiguous layout)."""
    ids: list[int] = []
    for g, n in enumerate(group_rows):
        ids += [g] * n + [-1] * (-(-n // alignment) * alignment - n)
    return torch.tensor(ids, dtype=torch.int32, device=device)


def make_inputs(params: dict, seed: int, device: str = "cpu") -> list:
    g = torch.Generator().manual_seed(seed)
    m_indices = contiguous_layout(params["group_rows"], params.get("alignment", 128), device)
    m, n, k = m_indices.numel(), params["N"], params["K"]
    a = torch.randn(m, k, generator=g)
    a[m_indices.cpu() < 0] = torch.randn(int((m_indices < 0).sum()), k, generator=g) * 1e3  # padding: garbage
    b = torch.randn(params["num_groups"], n, k, generator=g)
    d = torch.full((m, n), float("nan"), dtype=torch.bfloat16)
    return [a.bfloat16().to(device), b.bfloat16().to(device), m_indices, d.to(device)]


def _reference(inputs: list, params: dict) -> list:
    a, b, m_indices = inputs[:3]
    return [reference(a, b, m_indices)]


#: the FP4 kernels fold B's 1x32 scales into a bf16 tile: one rounding of each B element,
#: relative error at most 2^-9 (none for power-of-two scales)
FP4_FOLD_ROUNDING = 2.0 ** -9


def error_bound(a: torch.Tensor, b: torch.Tensor, m_indices: torch.Tensor,
                expected: torch.Tensor, rounding_steps: int = 1, b_rounding: float = 0.0) -> torch.Tensor:
    """Elementwise bound on ``|D - reference|`` for float32 accumulation and a bf16 store.

    Products of bf16 (or e4m3) values are exact in float32; summing K of them errs by at
    most ``K * 2^-24 * sum|a_i b_i|`` (``rounding_steps`` more roundings per term for
    scaled partial sums), and the bf16 store adds ``2^-8 |d|``.  ``b_rounding``: each B
    element was rounded once with that relative error before the products (the FP4
    kernels' bf16 tile, :data:`FP4_FOLD_ROUNDING`), adding ``b_rounding * sum|a_i b_i|``."""
    absprod = reference(a.abs(), b.abs(), m_indices)
    k = a.shape[1]
    return 2.0 ** -8 * expected.abs() + ((k + rounding_steps + 1) * 2.0 ** -24 + b_rounding) * absprod + 1e-30


def assert_close(d: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor) -> None:
    got = d.cpu().double()
    assert not torch.isnan(got).any(), "D has NaN (unwritten or poisoned elements)"
    if got.numel() == 0:
        return
    excess = (got - expected.cpu()).abs() - bound.cpu()
    worst = excess.max().item()
    where = tuple(int(i) for i in torch.unravel_index(excess.argmax(), excess.shape))
    assert worst <= 0, f"D exceeds its error bound by {worst:.3g} at {where}"


def _check(outputs: list, expected: list, inputs: list, params: dict) -> None:
    a, b, m_indices = inputs[:3]
    assert_close(outputs[0], expected[0], error_bound(a, b, m_indices, expected[0]))


def _flops(p: dict) -> float:
    return 2.0 * sum(p["group_rows"]) * p["N"] * p["K"]


def _bytes(p: dict) -> float:
    m = sum(p["group_rows"])
    return 2.0 * (m * p["K"] + p["num_groups"] * p["N"] * p["K"] + m * p["N"])


SPEC = register(KernelSpec(
    name="m_grouped_gemm_nt_contiguous",
    family="grouped_gemm",
    description="DeepGEMM-style MoE grouped GEMM, contiguous layout (m_indices), bf16 in, fp32 accum",
    factory=m_grouped_gemm_nt_contiguous,
    runtime_sizes=_RUNTIME_SIZES,
    # "small" and "demo" pin their tiles on purpose (smaller than the chooser's 128x128, so
    # these shapes have several tiles per dimension and ragged N/K edges); "bench" takes the
    # CUDA configuration the op uses
    problems={
        # an expert with no rows, unaligned row counts, N/K not multiples of the tiles
        "small": Problem("small", dict(group_rows=[5, 0, 70, 32], alignment=32, num_groups=4,
                                       N=40, K=72, block_M=32, block_N=32, block_K=32)),
        "demo": Problem("demo", dict(group_rows=[200, 77, 0, 310], alignment=128, num_groups=4,
                                     N=256, K=512, block_M=64, block_N=64, block_K=64)),
        # DeepGEMM's contiguous test shape (G=4, 8192 rows each, N=4096, K=2048: V4 MoE dims)
        "bench": Problem("bench", dict(group_rows=[8192] * 4, alignment=128, **config.choose.heuristic(
            "cuda", num_groups=4, N=4096, K=2048, alignment=128))),
    },
    make_inputs=make_inputs,
    outputs=(3,),
    reference=_reference,
    check=_check,
    flops=_flops,
    bytes=_bytes,
    tags=("moe", "gemm"),
))


def make_inputs_fp8(params: dict, seed: int, device: str = "cpu") -> list:
    a, b, m_indices, d = make_inputs(params, seed, "cpu")
    a = a.float().masked_fill((m_indices < 0)[:, None], 0.0)   # amax of garbage rows would be inf in e4m3
    (a8, sfa), (b8, sfb) = per_token_cast_to_fp8(a), per_block_cast_to_fp8(b.float())
    return [t.to(device) for t in (a8, sfa, b8, sfb, m_indices, d)]


def _dequantized(inputs: list) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    a8, sfa, b8, sfb, m_indices = inputs[:5]
    return dequantize(a8, sfa, (1, 128)), dequantize(b8, sfb, (128, 128)), m_indices


def _reference_fp8(inputs: list, params: dict) -> list:
    return [reference(*_dequantized(inputs))]


def _check_fp8(outputs: list, expected: list, inputs: list, params: dict) -> None:
    assert_close(outputs[0], expected[0], error_bound(*_dequantized(inputs), expected[0],
                                                      rounding_steps=3))


SPEC_FP8 = register(KernelSpec(
    name="m_grouped_fp8_gemm_nt_contiguous",
    family="grouped_gemm",
    description="DeepGEMM-style MoE grouped GEMM, fp8 e4m3 with 1x128 / 128x128 float32 scales",
    factory=m_grouped_fp8_gemm_nt_contiguous,
    runtime_sizes=_RUNTIME_SIZES,
    # "small" and "demo" pin small tiles on purpose (several N tiles per 128-wide scale
    # block, ragged edges); "bench" takes the CUDA configuration the op uses
    problems={
        "small": Problem("small", dict(group_rows=[40, 0, 9], alignment=32, num_groups=3,
                                       N=160, K=200, block_M=32, block_N=64)),
        "demo": Problem("demo", dict(group_rows=[200, 77, 0, 310], alignment=128, num_groups=4,
                                     N=256, K=256, block_M=64, block_N=64)),
        "bench": Problem("bench", dict(group_rows=[8192] * 4, alignment=128, **config.choose_fp8.heuristic(
            "cuda", num_groups=4, N=4096, K=2048, alignment=128))),
    },
    make_inputs=make_inputs_fp8,
    outputs=(5,),
    reference=_reference_fp8,
    check=_check_fp8,
    flops=_flops,
    bytes=lambda p: _bytes(p) / 2 + 2.0 * sum(p["group_rows"]) * p["N"],
    tags=("moe", "gemm", "fp8"),
))


_MASKED_RUNTIME_SIZES = ("masked_rows", "max_m")


def make_inputs_masked(params: dict, seed: int, device: str = "cpu") -> list:
    g = torch.Generator().manual_seed(seed)
    groups, max_m, n, k = params["num_groups"], params["max_m"], params["N"], params["K"]
    a = torch.randn(groups, max_m, k, generator=g).bfloat16()
    b = torch.randn(groups, n, k, generator=g).bfloat16()
    masked_m = torch.tensor(params["masked_rows"], dtype=torch.int32)
    d = torch.full((groups, max_m, n), float("nan"), dtype=torch.bfloat16)
    return [t.to(device) for t in (a, b, masked_m, d)]


def _check_masked(outputs: list, expected: list, inputs: list, params: dict) -> None:
    """Rows below ``masked_m[g]`` within their bound; rows past it still hold the poison."""
    a, b, masked_m = inputs[:3]
    d, e = outputs[0], expected[0]
    for grp, rows in enumerate(masked_m.tolist()):
        assert_close(d[grp, :rows], e[grp, :rows],
                     error_bound(a[grp, :rows], b[grp:grp + 1],
                                 torch.zeros(rows, dtype=torch.int32, device=a.device), e[grp, :rows]))
        assert torch.isnan(d[grp, rows:].float()).all(), f"group {grp}: rows past masked_m were written"


SPEC_MASKED = register(KernelSpec(
    name="m_grouped_gemm_nt_masked",
    family="grouped_gemm",
    description="DeepGEMM-style MoE grouped GEMM, masked layout (decode): rows < masked_m[g]",
    factory=m_grouped_gemm_nt_masked,
    runtime_sizes=_MASKED_RUNTIME_SIZES,
    # "small" and "demo" pin their tiles on purpose (several row and N tiles per group, a
    # group with no rows, rows past masked_m inside a tile); "bench" takes the CUDA
    # configuration the op uses
    problems={
        "small": Problem("small", dict(masked_rows=[70, 0, 33], max_m=72, num_groups=3, N=36,
                                       K=40, block_M=32, block_N=32, block_K=32)),
        "demo": Problem("demo", dict(masked_rows=[20, 0, 64, 7, 33, 50], max_m=64, num_groups=6,
                                     N=512, K=512, block_M=64, block_N=128, block_K=128)),
        # DeepGEMM's masked test shape: 32 groups, expected_m 192, M_max 4096 (V4 MoE dims)
        "bench": Problem("bench", dict(masked_rows=[192] * 32, max_m=256, **config.choose_masked.heuristic(
            "cuda", num_groups=32, N=4096, K=2048, expected_m=192))),
    },
    make_inputs=make_inputs_masked,
    outputs=(3,),
    reference=lambda inputs, params: [reference_masked(*inputs[:3])],
    check=_check_masked,
    flops=lambda p: 2.0 * sum(p["masked_rows"]) * p["N"] * p["K"],
    tags=("moe", "gemm", "decode"),
))


# DeepGEMM's test_fp8_fp4.py acceptance thresholds on calc_diff (FP8 x FP8, one FP4 side)
FP8_DIFF, FP4_DIFF = 0.001, 0.01


def _check_diff(d: torch.Tensor, expected: torch.Tensor, max_diff: float) -> None:
    diff = calc_diff(d.cpu(), expected.cpu())
    assert diff < max_diff, f"calc_diff {diff:.3g} >= {max_diff}"


def make_inputs_fp4(params: dict, seed: int, device: str = "cpu") -> list:
    """``[A, SFA (MN-major), B (FP4 codes), SFB (1x32), m_indices, D]``."""
    a, b, m_indices, d = make_inputs(params, seed, "cpu")
    a = a.float().masked_fill((m_indices < 0)[:, None], 0.0)
    (a8, sfa), (b4, sfb) = per_token_cast_to_fp8(a), per_token_cast_to_fp4(b.float())
    return [t.to(device) for t in (a8, get_mn_major_tma_aligned_tensor(sfa), b4, sfb, m_indices, d)]


def _dequantized_fp4(inputs: list) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    a8, sfa, b4, sfb, m_indices = (t.cpu() for t in inputs[:5])
    return dequantize(a8, sfa, (1, 128)), dequantize_fp4(b4, sfb), m_indices


def _check_fp4(outputs: list, expected: list, inputs: list, params: dict) -> None:
    a, b, m_indices = _dequantized_fp4(inputs)
    assert_close(outputs[0], expected[0], error_bound(a, b, m_indices, expected[0], rounding_steps=3,
                                                      b_rounding=FP4_FOLD_ROUNDING))
    _check_diff(outputs[0], expected[0], FP4_DIFF)


SPEC_FP4 = register(KernelSpec(
    name="m_grouped_fp8_fp4_gemm_nt_contiguous",
    family="grouped_gemm",
    description="DeepGEMM-style MoE grouped GEMM, contiguous layout, fp8 A x FP4 (e2m1, 1x32 scales) B",
    factory=m_grouped_fp8_fp4_gemm_nt_contiguous,
    runtime_sizes=_RUNTIME_SIZES,
    problems={
        "small": Problem("small", dict(group_rows=[40, 0, 9], alignment=32, num_groups=3,
                                       N=160, K=256, block_M=32, block_N=64)),
        "demo": Problem("demo", dict(group_rows=[200, 77, 0, 310], alignment=128, num_groups=4,
                                     N=256, K=384, block_M=64, block_N=64)),
        "bench": Problem("bench", dict(group_rows=[8192] * 4, alignment=128, **config.choose_fp8_fp4.heuristic(
            "cuda", num_groups=4, N=4096, K=2048, alignment=128))),
    },
    make_inputs=make_inputs_fp4,
    outputs=(5,),
    reference=lambda inputs, params: [reference(*_dequantized_fp4(inputs))],
    check=_check_fp4,
    flops=_flops,
    bytes=lambda p: sum(p["group_rows"]) * (p["K"] + 2.0 * p["N"]) + p["num_groups"] * p["N"] * p["K"] / 2,
    tags=("moe", "gemm", "fp8", "fp4"),
))


def make_inputs_fp8_masked(params: dict, seed: int, device: str = "cpu", fp4: bool = False) -> list:
    """``[A, SFA (per-group MN-major), B, SFB, masked_m, D]`` with B as e4m3 (128x128
    scales) or, with ``fp4``, e2m1 codes (1x32 scales)."""
    a, b, masked_m, d = make_inputs_masked(params, seed, "cpu")
    a8, sfa = per_token_cast_to_fp8(a.float())
    b_q, sfb = per_token_cast_to_fp4(b.float()) if fp4 else per_block_cast_to_fp8(b.float())
    return [t.to(device) for t in (a8, get_mn_major_tma_aligned_tensor(sfa), b_q, sfb, masked_m, d)]


def _dequantized_masked(inputs: list, fp4: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    a8, sfa, b_q, sfb, masked_m = (t.cpu() for t in inputs[:5])
    b = dequantize_fp4(b_q, sfb) if fp4 else dequantize(b_q, sfb, (128, 128))
    return dequantize(a8, sfa, (1, 128)), b, masked_m


def _check_fp8_masked(outputs: list, expected: list, inputs: list, params: dict, fp4: bool = False) -> None:
    """Valid rows within their bound and DeepGEMM's calc_diff threshold; rows past
    ``masked_m[g]`` still hold the poison."""
    a, b, masked_m = _dequantized_masked(inputs, fp4)
    d, e = outputs[0].cpu(), expected[0]
    for grp, rows in enumerate(masked_m.tolist()):
        assert_close(d[grp, :rows], e[grp, :rows],
                     error_bound(a[grp, :rows], b[grp:grp + 1], torch.zeros(rows, dtype=torch.int32),
                                 e[grp, :rows], rounding_steps=3, b_rounding=FP4_FOLD_ROUNDING if fp4 else 0.0))
        assert torch.isnan(d[grp, rows:].float()).all(), f"group {grp}: rows past masked_m were written"
    valid = ~torch.isnan(e)
    _check_diff(d.double()[valid], e[valid], FP4_DIFF if fp4 else FP8_DIFF)


def _masked_flops(p: dict) -> float:
    return 2.0 * sum(p["masked_rows"]) * p["N"] * p["K"]


SPEC_FP8_MASKED = register(KernelSpec(
    name="m_grouped_fp8_gemm_nt_masked",
    family="grouped_gemm",
    description="DeepGEMM-style MoE grouped GEMM, masked layout, fp8 e4m3 with 1x128 / 128x128 scales",
    factory=m_grouped_fp8_gemm_nt_masked,
    runtime_sizes=_MASKED_RUNTIME_SIZES,
    # a group with no rows, rows past masked_m inside a tile, several N tiles per scale block
    problems={
        "small": Problem("small", dict(masked_rows=[40, 0, 17], max_m=40, num_groups=3, N=160,
                                       K=256, block_M=32, block_N=64)),
        "demo": Problem("demo", dict(masked_rows=[20, 0, 64, 7, 33, 50], max_m=64, num_groups=6,
                                     N=512, K=512, block_M=64, block_N=128)),
        "bench": Problem("bench", dict(masked_rows=[192] * 32, max_m=256, **config.choose_fp8_masked.heuristic(
            "cuda", num_groups=32, N=4096, K=2048, expected_m=192))),
    },
    make_inputs=make_inputs_fp8_masked,
    outputs=(5,),
    reference=lambda inputs, params: [reference_masked(*_dequantized_masked(inputs, False))],
    check=_check_fp8_masked,
    flops=_masked_flops,
    tags=("moe", "gemm", "decode", "fp8"),
))

SPEC_FP4_MASKED = register(KernelSpec(
    name="m_grouped_fp8_fp4_gemm_nt_masked",
    family="grouped_gemm",
    description="DeepGEMM-style MoE grouped GEMM, masked layout, fp8 A x FP4 (e2m1, 1x32 scales) B",
    factory=m_grouped_fp8_fp4_gemm_nt_masked,
    runtime_sizes=_MASKED_RUNTIME_SIZES,
    problems={
        "small": Problem("small", dict(masked_rows=[40, 0, 17], max_m=40, num_groups=3, N=160,
                                       K=256, block_M=32, block_N=64)),
        "demo": Problem("demo", dict(masked_rows=[20, 0, 64, 7, 33, 50], max_m=64, num_groups=6,
                                     N=512, K=512, block_M=64, block_N=128)),
        "bench": Problem("bench", dict(masked_rows=[192] * 32, max_m=256, **config.choose_fp8_fp4_masked.heuristic(
            "cuda", num_groups=32, N=4096, K=2048, expected_m=192))),
    },
    make_inputs=lambda params, seed, device="cpu": make_inputs_fp8_masked(params, seed, device, fp4=True),
    outputs=(5,),
    reference=lambda inputs, params: [reference_masked(*_dequantized_masked(inputs, True))],
    check=lambda outputs, expected, inputs, params: _check_fp8_masked(outputs, expected, inputs, params, True),
    flops=_masked_flops,
    tags=("moe", "gemm", "decode", "fp8", "fp4"),
))
