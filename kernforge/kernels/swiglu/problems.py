"""The SwiGLU catalogue entry: bf16 gate/up, routing weights, clamp active, FP8 output
checked against the float64 chain within e4m3's rounding."""
from __future__ import annotations

import torch

from kernforge.kernels.grouped_gemm.reference import dequantize
from kernforge.kernels.registry import KernelSpec, Problem, register
from kernforge.kernels.swiglu import reference
from kernforge.kernels.swiglu.kernel import swiglu

#: V4-Flash's swiglu_limit
LIMIT = 10.0


def _inputs(p, seed, device):
    g = torch.Generator().manual_seed(seed)
    m, i = p["M"], p["inter"]
    x = (torch.randn((m, 2 * i), generator=g) * 6).to(getattr(torch, p["dtype"]))  # many values past the clamp
    w = torch.rand(m, generator=g)
    out = torch.full((m, i), float("nan")).to(torch.float8_e4m3fn if p["quantize"] else x.dtype)
    out_sf = torch.full((m, i // 128) if p["quantize"] else (1, 1), float("nan"))
    return [x.to(device), w.to(device), LIMIT, out.to(device), out_sf.to(device)]


def _reference(inputs, p):
    return [reference.float64(inputs[0].cpu(), inputs[1].cpu() if p["with_weights"] else None, inputs[2])]


def _check(outputs, expected, inputs, params):
    want = expected[0]
    if params["quantize"]:
        q, sf = (t.cpu() for t in outputs)
        assert not torch.isnan(sf).any(), "out_sf has NaN (unwritten)"
        got = dequantize(q, sf, (1, 128))
        # e4m3 keeps 3 mantissa bits: half an ulp is 2^-4 of the value, plus one input-dtype
        # ulp for the kernel's float32 exp against float64
        bound = (2.0 ** -4 + 2.0 ** -7) * want.abs() + 2.0 ** -9 * sf.repeat_interleave(128, 1)
    else:
        got = outputs[0].cpu().double()
        bound = 2.0 ** -7 * want.abs() + 1e-30
    assert not torch.isnan(got).any(), "out has NaN (unwritten or poisoned elements)"
    excess = (got - want).abs() - bound
    assert excess.max() <= 0, f"swiglu exceeds its bound by {excess.max().item():.3g}"


SPEC = register(KernelSpec(
    name="swiglu",
    family="swiglu",
    description="MoE expert activation: clamped SwiGLU x routing weight, 1x128 e4m3 output + float32 scales",
    factory=swiglu,
    runtime_sizes=("M",),
    problems={
        "small": Problem("small", dict(M=13, inter=256, dtype="bfloat16", with_weights=True, quantize=True, rows=4)),
        "demo": Problem("demo", dict(M=1536, inter=2048, dtype="bfloat16", with_weights=True, quantize=True,
                                     rows=8)),
        "bench": Problem("bench", dict(M=24576, inter=2048, dtype="bfloat16", with_weights=True, quantize=True,
                                       rows=8)),
    },
    make_inputs=_inputs,
    outputs=(3, 4),
    reference=_reference,
    check=_check,
    bytes=lambda p: p["M"] * p["inter"] * 5 + p["M"] * p["inter"] // 32,
    tags=("moe", "activation"),
))
