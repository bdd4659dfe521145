"""The compressor pooling's catalogue entry: problems, inputs, the float64 reference and a
float32-tolerance check."""
from __future__ import annotations

import torch

from kernforge.kernels.compressor import config
from kernforge.kernels.compressor.kernel import compressor_pool
from kernforge.kernels.compressor.reference import compressor_pool as reference
from kernforge.kernels.registry import KernelSpec, Problem, register


def _inputs(params, seed, device):
    """Projections of (N + 1) * ratio rows plus a partial block (rows the pooling must not
    read), the first half-block's scores -inf (absent rows, as a fresh compressor state has
    them), the gate's position bias ape, and the output poisoned with NaN."""
    r, n, d = params["ratio"], params["N"], params["head_dim"]
    w = 2 * d if params["overlap"] else d
    dtype = getattr(torch, params["dtype"])
    g = torch.Generator().manual_seed(seed)
    rows = (n + 1) * r + r // 2
    kv = torch.randn(rows, w, generator=g)
    score = torch.randn(rows, w, generator=g) * 3.0
    score[:max(1, r // 2)] = float("-inf")
    ape = torch.randn(r, w, generator=g)
    out = torch.full((n, d), float("nan"))
    return [t.to(dtype).to(device) for t in (kv, score, ape, out)]


def _reference(inputs, params):
    kv, score, ape, out = inputs
    return [reference(kv.cpu(), score.cpu(), params["N"], params["ratio"], params["overlap"], ape.cpu())]


def _check(outputs, expected, inputs, params):
    got, want = outputs[0].cpu().double(), expected[0]
    tol = 1e-5 if params["dtype"] == "float32" else 2e-2
    if got.shape != want.shape or not torch.allclose(got, want, atol=tol, rtol=tol):
        err = (got - want).abs().nan_to_num(float("inf")).max().item() if got.shape == want.shape else "shape"
        raise AssertionError(f"compressor_pool differs from the float64 reference: max error {err}")


def _problem(label, n, **size):
    return Problem(label, dict(N=n, **config.choose.heuristic("cuda", **size)))


SPEC = register(KernelSpec(
    name="compressor_pool",
    family="compressor",
    description="softmax-gated pooling of each ratio block into one KV entry (V4 compressor)",
    factory=compressor_pool,
    runtime_sizes=("N",),
    problems={
        "small": _problem("small", 3, head_dim=64, ratio=4, overlap=True, dtype="float32"),
        "demo": _problem("demo", 256, head_dim=512, ratio=4, overlap=True, dtype="float32"),
        "bench": _problem("bench", 64, head_dim=512, ratio=128, overlap=False, dtype="float32"),
    },
    make_inputs=_inputs,
    outputs=(3,),
    reference=_reference,
    check=_check,
    flops=lambda p: p["N"] * p["head_dim"] * (2 if p["overlap"] else 1) * p["ratio"] * 5,
    bytes=lambda p: (p["N"] + 1) * p["ratio"] * p["head_dim"] * (2 if p["overlap"] else 1) * 8,
    tags=("compressor", "attention"),
))
