"""The Hadamard catalogue entry: the indexer's rows (index_head_dim 128 at full size)."""
from __future__ import annotations

import torch

from kernforge.kernels.hadamard.config import choose
from kernforge.kernels.hadamard.kernel import hadamard
from kernforge.kernels.hadamard.reference import reference
from kernforge.kernels.registry import KernelSpec, Problem, register


def tolerance(dtype: torch.dtype) -> dict:
    return dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2.0 ** -7, atol=1e-2)


def _make_inputs(params, seed, device):
    g = torch.Generator().manual_seed(seed)
    dt = getattr(torch, params["dtype"])
    x = torch.randn(params["rows"], params["n"], generator=g).to(dt)
    out = torch.full_like(x, float("nan"))
    return [x.to(device), out.to(device)]


def _reference(inputs, params):
    return [reference(inputs[0].cpu())]


def peers(spec, inputs, params):
    """The model's torch function on the spec's inputs, for ``benchmarks/gpu_check.py``'s timing
    columns (``PEERS[family]``): what this kernel replaces in ``kernforge/model``."""
    from kernforge.model.primitives import hadamard as model_hadamard

    return {"model hadamard (torch)": lambda: model_hadamard(inputs[0])}


def _check(outputs, expected, inputs, params):
    got = outputs[0].cpu()
    torch.testing.assert_close(got.double(), expected[0], **tolerance(got.dtype), msg=lambda m: f"hadamard: {m}")


SPEC = register(KernelSpec(
    name="hadamard",
    family="hadamard",
    description="Walsh-Hadamard transform (Sylvester order, n^-1/2) over power-of-two rows (indexer q and keys)",
    factory=hadamard,
    runtime_sizes=("rows",),
    problems={
        "small": Problem("small", dict(rows=9, n=64, dtype="float32", block_rows=2)),
        # the op's CUDA configuration at V4-Flash's index_head_dim (also what the nvcc tests build)
        "demo": Problem("demo", dict(rows=65536, **choose.heuristic("cuda", 128, "bfloat16"))),
        "bench": Problem("bench", dict(rows=262144, n=128, dtype="bfloat16")),
    },
    make_inputs=_make_inputs,
    outputs=(1,),
    reference=_reference,
    check=_check,
    bytes=lambda p: 2 * p["rows"] * p["n"] * (2 if p["dtype"] == "bfloat16" else 4),
    tags=("hadamard", "indexer"),
))
