"""The embedding catalogue entry: random ids into a random table (a gather is exact: the check is equality)."""
from __future__ import annotations

import torch

from kernforge.kernels.embedding.config import choose
from kernforge.kernels.embedding.kernel import embedding
from kernforge.kernels.embedding.reference import reference
from kernforge.kernels.registry import KernelSpec, Problem, register


def _make_inputs(params, seed, device):
    g = torch.Generator().manual_seed(seed)
    n, vocab, dim = params["tokens"], params["vocab"], params["dim"]
    ids = torch.randint(0, vocab, (n,), generator=g).to(getattr(torch, params["index_dtype"]))
    ids[0] = vocab - 1  # the last row
    weight = torch.randn(vocab, dim, generator=g).to(getattr(torch, params["dtype"]))
    out = torch.full((n, dim), float("nan"), dtype=weight.dtype)
    return [t.to(device) for t in (ids, weight, out)]


def _reference(inputs, params):
    return [reference(inputs[0].cpu(), inputs[1].cpu())]


def peers(spec, inputs, params):
    """The model's torch function on the spec's inputs, for ``benchmarks/gpu_check.py``'s timing
    columns (``PEERS[family]``): what this kernel replaces in ``kernforge/model``."""
    ids, weight = inputs[:2]
    return {"model Embedding (torch)": lambda: weight[ids]}


def _check(outputs, expected, inputs, params):
    got, want = outputs[0].cpu(), expected[0]
    if not torch.equal(got, want):
        bad = (got != want).any(-1).nonzero()[:5, 0].tolist()
        raise AssertionError(f"embedding rows differ at tokens {bad}")


SPEC = register(KernelSpec(
    name="embedding",
    family="embedding",
    description="Token embedding lookup (row gather) with a zero row for out-of-range ids",
    factory=embedding,
    runtime_sizes=("tokens", "vocab"),
    problems={
        "small": Problem("small", dict(tokens=7, vocab=50, dim=96, dtype="float32", index_dtype="int64",
                                       block_cols=64)),
        # the op's CUDA configuration at V4-Flash's hidden size (also what the nvcc tests build)
        "demo": Problem("demo", dict(tokens=4096, vocab=16384, **choose.heuristic("cuda", 4096, "bfloat16", "int64"))),
        "bench": Problem("bench", dict(tokens=16384, vocab=129280, dim=4096, dtype="bfloat16", index_dtype="int64")),
    },
    make_inputs=_make_inputs,
    outputs=(2,),
    reference=_reference,
    check=_check,
    bytes=lambda p: 2 * p["tokens"] * p["dim"] * (2 if p["dtype"] == "bfloat16" else 4),
    tags=("embedding", "dense"),
))
