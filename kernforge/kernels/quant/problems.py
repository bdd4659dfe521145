"""The quantisation catalogue entries: problems, inputs, references and bit-exact checks."""
from __future__ import annotations

import torch

from kernforge.kernels.quant import config
from kernforge.kernels.quant.kernel import (FAKE_FP8_BLOCK, FP4_BLOCK, FP8_BLOCK, fake_quant_e2m1, fake_quant_e4m3,
                                            per_block_cast, per_token_cast, per_token_cast_fp4)
from kernforge.kernels.quant.reference import (fake_quant_fp4, fake_quant_fp8, per_block_cast_to_fp8,
                                               per_token_cast_to_fp4, per_token_cast_to_fp8)
from kernforge.kernels.registry import KernelSpec, Problem, register


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _x(shape, params, seed):
    """Random activations with a spread of magnitudes per scale block (so scales differ and
    some blocks sit at the amax floor)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-20, 8, shape[:-1] + (1,), generator=g).float())
    return x.to(getattr(torch, params.get("dtype", "bfloat16")))


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes/words of ``t`` as an integer tensor (NaN-proof equality)."""
    return t.view({1: torch.uint8, 4: torch.int32}[t.element_size()])


def assert_same_bits(names, outputs, expected) -> None:
    for name, got, want in zip(names, outputs, expected):
        got, want = bits(got.cpu()), bits(want.cpu())
        if got.shape != want.shape or not torch.equal(got, want):
            bad = (got != want).nonzero()[:5].tolist() if got.shape == want.shape else "shape"
            raise AssertionError(f"{name} differ at {bad}")


def _token_inputs(params, seed, device):
    m, k = params["M"], params["K"]
    data = torch.full((m, k), float("nan")).to(torch.float8_e4m3fn)
    sf = torch.full((m, _cdiv(k, FP8_BLOCK)), float("nan"))
    return [t.to(device) for t in (_x((m, k), params, seed), data, sf)]


def _block_inputs(params, seed, device):
    g, n, k = params["G"], params["N"], params["K"]
    data = torch.full((g, n, k), float("nan")).to(torch.float8_e4m3fn)
    sf = torch.full((g, _cdiv(n, FP8_BLOCK), _cdiv(k, FP8_BLOCK)), float("nan"))
    return [t.to(device) for t in (_x((g, n, k), params, seed), data, sf)]


def _fp4_inputs(params, seed, device):
    m, k = params["M"], params["K"]
    codes = torch.full((m, k // 2), 0x5A, dtype=torch.uint8)
    sf = torch.full((m, _cdiv(k, FP4_BLOCK)), float("nan"))
    return [t.to(device) for t in (_x((m, k), params, seed), codes, sf)]


def _check_fp8(outputs, expected, inputs, params):
    assert_same_bits(("data", "scales"), outputs, expected)


def _check_fp4(outputs, expected, inputs, params):
    assert_same_bits(("codes", "scales"), [outputs[0].view(torch.int8), outputs[1]], expected)


_TOKEN_SIZES = dict(small=dict(M=5, K=300), demo=dict(M=512, K=7168), bench=dict(M=4096, K=7168))


def _problems(sizes: dict, **kernel) -> dict:
    return {label: Problem(label, dict(size, **kernel)) for label, size in sizes.items()}


def _register_fp8_token(ue8m0: bool):
    suffix = "_ue8m0" if ue8m0 else ""
    return register(KernelSpec(
        name=f"per_token_cast_to_fp8{suffix}",
        family="quant",
        description=f"bf16 activations -> e4m3 with one {'power-of-two ' if ue8m0 else ''}float32 scale per 1x128",
        factory=per_token_cast,
        runtime_sizes=("M", "K"),
        problems=_problems(_TOKEN_SIZES, **config.choose_token.heuristic("cuda", "bfloat16", ue8m0)),
        make_inputs=_token_inputs,
        outputs=(1, 2),
        reference=lambda inputs, p: list(per_token_cast_to_fp8(inputs[0].cpu(), p["use_ue8m0"])),
        check=_check_fp8,
        bytes=lambda p: p["M"] * p["K"] * 3 + p["M"] * _cdiv(p["K"], FP8_BLOCK) * 4,
        tags=("quant", "fp8", "moe"),
    ))


SPEC_TOKEN_FP8 = _register_fp8_token(False)
SPEC_TOKEN_FP8_UE8M0 = _register_fp8_token(True)

SPEC_BLOCK_FP8 = register(KernelSpec(
    name="per_block_cast_to_fp8",
    family="quant",
    description="bf16 weights [G, N, K] -> e4m3 with one float32 scale per 128x128 block",
    factory=per_block_cast,
    runtime_sizes=("G", "N", "K"),
    problems=_problems(dict(small=dict(G=2, N=200, K=300), demo=dict(G=1, N=2048, K=7168),
                            bench=dict(G=8, N=4096, K=7168)),
                       **config.choose_block.heuristic("cuda", "bfloat16", False)),
    make_inputs=_block_inputs,
    outputs=(1, 2),
    reference=lambda inputs, p: list(per_block_cast_to_fp8(inputs[0].cpu(), p["use_ue8m0"])),
    check=_check_fp8,
    bytes=lambda p: p["G"] * p["N"] * p["K"] * 3,
    tags=("quant", "fp8", "moe"),
))

SPEC_TOKEN_FP4 = register(KernelSpec(
    name="per_token_cast_to_fp4",
    family="quant",
    description="bf16 activations -> e2m1 pairs per byte, one power-of-two float32 scale per 32 (V4's format)",
    factory=per_token_cast_fp4,
    runtime_sizes=("M", "K"),
    problems=_problems(dict(small=dict(M=5, K=200), demo=dict(M=512, K=7168), bench=dict(M=4096, K=7168)),
                       **config.choose_fp4.heuristic("cuda", "bfloat16")),
    make_inputs=_fp4_inputs,
    outputs=(1, 2),
    reference=lambda inputs, p: list(per_token_cast_to_fp4(inputs[0].cpu())),
    check=_check_fp4,
    bytes=lambda p: p["M"] * p["K"] * 2.5 + p["M"] * _cdiv(p["K"], FP4_BLOCK) * 4,
    tags=("quant", "fp4", "moe"),
))


def _fake_inputs(params, seed, device):
    """x [M, K] with magnitudes per block from 2^-20 to 2^8 (scales differ, some at the floor),
    and the output poisoned with NaN."""
    m, k = params["M"], params["K"]
    g = torch.Generator().manual_seed(seed)
    shape = (m, k // params["block"], params["block"])
    x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-20, 8, shape[:-1] + (1,), generator=g).float())
    x = x.view(m, k).to(getattr(torch, params.get("dtype", "float32")))
    return [t.to(device) for t in (x, torch.full_like(x, float("nan")))]


def _check_fake(outputs, expected, inputs, params):
    assert_same_bits(("out",), outputs, expected)


# the model's shapes: window KV nope dims (448 of 512) per token, indexer q (64 heads x 128) per token
SPEC_FAKE_FP8 = register(KernelSpec(
    name="fake_quant_fp8",
    family="quant",
    description="QAT e4m3 rounding, one power-of-two scale per 64 values (the model's fake_quant_fp8)",
    factory=fake_quant_e4m3,
    runtime_sizes=("M", "K"),
    problems=_problems(dict(small=dict(M=5, K=192), demo=dict(M=512, K=448), bench=dict(M=8192, K=448)),
                       **config.choose_fake_fp8.heuristic("cuda", "float32", FAKE_FP8_BLOCK)),
    make_inputs=_fake_inputs,
    outputs=(1,),
    reference=lambda inputs, p: [fake_quant_fp8(inputs[0].cpu(), p["block"])],
    check=_check_fake,
    bytes=lambda p: p["M"] * p["K"] * 8,
    tags=("quant", "fp8", "qat"),
))

SPEC_FAKE_FP4 = register(KernelSpec(
    name="fake_quant_fp4",
    family="quant",
    description="QAT e2m1 rounding, one power-of-two scale per 32 values (the model's fake_quant_fp4)",
    factory=fake_quant_e2m1,
    runtime_sizes=("M", "K"),
    problems=_problems(dict(small=dict(M=5, K=96), demo=dict(M=512, K=8192), bench=dict(M=4096, K=8192)),
                       **config.choose_fake_fp4.heuristic("cuda", FP4_BLOCK)),
    make_inputs=_fake_inputs,
    outputs=(1,),
    reference=lambda inputs, p: [fake_quant_fp4(inputs[0].cpu(), p["block"])],
    check=_check_fake,
    bytes=lambda p: p["M"] * p["K"] * 8,
    tags=("quant", "fp4", "qat"),
))
