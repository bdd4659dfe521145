"""The RMSNorm catalogue entry: problems, inputs (outputs poisoned), the float64 reference, the check."""
from __future__ import annotations

import torch

from kernforge.kernels.norm.config import choose
from kernforge.kernels.norm.kernel import rms_norm
from kernforge.kernels.norm.reference import reference
from kernforge.kernels.registry import KernelSpec, Problem, register

EPS = 1e-6


def tolerance(dtype: torch.dtype) -> dict:
    """float32: a row's sum of squares in float32 against float64; bfloat16: one rounding of the output."""
    return dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2.0 ** -7, atol=1e-2)


def _make_inputs(params, seed, device):
    g = torch.Generator().manual_seed(seed)
    rows, dim = params["rows"], params["dim"]
    x = (torch.randn(rows, dim, generator=g) * 3).to(getattr(torch, params["dtype"]))
    w = (torch.rand(dim, generator=g) + 0.5).to(getattr(torch, params["weight_dtype"]))
    out = torch.full((rows, dim), float("nan"), dtype=getattr(torch, params["out_dtype"]))
    return [t.to(device) for t in (x, w, out)] + [EPS]


def _reference(inputs, params):
    x, w, _, eps = inputs
    return [reference(x.cpu(), w.cpu(), eps)]


def peers(spec, inputs, params):
    """The model's torch function on the spec's inputs, for ``benchmarks/gpu_check.py``'s timing
    columns (``PEERS[family]``): what this kernel replaces in ``kernforge/model``."""
    from kernforge.model.primitives import rms_normalize

    x, w, _, eps = inputs
    return {"model RMSNorm (torch)": lambda: rms_normalize(x, eps) * w}


def _check(outputs, expected, inputs, params):
    got, want = outputs[0].cpu(), expected[0]
    torch.testing.assert_close(got.double(), want, **tolerance(got.dtype), msg=lambda m: f"rms_norm: {m}")


SPEC = register(KernelSpec(
    name="rms_norm",
    family="norm",
    description="RMSNorm over rows with a weight (the model's RMSNorm: attn/ffn/q/kv/final norms)",
    factory=rms_norm,
    runtime_sizes=("rows",),
    problems={
        "small": Problem("small", dict(rows=5, dim=96, dtype="float32", weight_dtype="float32",
                                       out_dtype="float32", block_rows=2)),
        # the op's CUDA configuration at V4-Flash's hidden size (also what the nvcc tests build)
        "demo": Problem("demo", dict(rows=2048, **choose.heuristic("cuda", 4096, "bfloat16", "float32", "bfloat16"))),
        "bench": Problem("bench", dict(rows=16384, dim=4096, dtype="bfloat16", weight_dtype="float32",
                                       out_dtype="bfloat16")),
    },
    make_inputs=_make_inputs,
    outputs=(2,),
    reference=_reference,
    check=_check,
    bytes=lambda p: p["rows"] * p["dim"] * 4,
    tags=("norm", "dense"),
))
