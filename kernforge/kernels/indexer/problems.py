"""The indexer score catalogue entry: problems, inputs (scores poisoned), the float64 oracle, the check."""
from __future__ import annotations

import torch

from kernforge.kernels.indexer.config import choose
from kernforge.kernels.indexer.kernel import indexer_scores
from kernforge.kernels.indexer.reference import indexer_scores as oracle
from kernforge.kernels.registry import KernelSpec, Problem, register


def scale_of(params) -> float:
    """The model's indexer scale, ``head_dim^-1/2 * heads^-1/2`` (`Indexer.scale`)."""
    return params["dim"] ** -0.5 * params["heads"] ** -0.5


def make_inputs(params, seed, device):
    """q, keys and head weights of both signs (so some terms are relu's zeros times a
    negative weight), scores poisoned with NaN, and the scale."""
    g = torch.Generator().manual_seed(seed)
    s, n, h, d = params["S"], params["N"], params["heads"], params["dim"]
    dtype = getattr(torch, params["dtype"])
    q = torch.randn(s, h, d, generator=g).to(dtype)
    keys = torch.randn(n, d, generator=g).to(dtype)
    w = torch.randn(s, h, generator=g).to(dtype)
    scores = torch.full((s, n), float("nan"))
    return [t.to(device) for t in (q, keys, w, scores)] + [scale_of(params)]


def reference(inputs, params):
    """The engine's former torch step in float64 (its matmul form)."""
    q, keys, w, _, scale = inputs
    return [oracle(w.cpu().double(), q.cpu().double(), keys.cpu().double(), scale)]


def tolerance(params) -> dict:
    """float32 dots of ``dim`` unit-variance products against float64: a few ulps of the
    largest partial sums, times the weights' scale."""
    return dict(rtol=1e-5, atol=1e-5 * params["dim"] ** 0.5 * params["heads"] ** 0.5 * scale_of(params))


def _check(outputs, expected, inputs, params):
    got = outputs[0].cpu()
    torch.testing.assert_close(got.double(), expected[0], **tolerance(params),
                               msg=lambda m: f"indexer_scores: {m}")
    if bool((got.view(torch.int32) == torch.tensor(-0.0).view(torch.int32)).any()):
        raise AssertionError("indexer_scores: a score is -0.0 (the + 0.0 is missing)")


def _problems(sizes: dict, **kernel) -> dict:
    return {label: Problem(label, dict(size, **kernel)) for label, size in sizes.items()}


SPEC = register(KernelSpec(
    name="indexer_scores",
    family="indexer",
    description="lightning indexer entry scores sum_h relu(q_h . k) * w_h * scale (a GEMM per head, heads in order)",
    factory=indexer_scores,
    runtime_sizes=("S", "N"),
    problems={
        "small": Problem("small", dict(S=3, N=37, **choose.heuristic("cpu", 4, 64, "float32", 3))),
        # V4-Flash: 64 indexer heads of 128 dims; a prefill chunk against 4096 compressed keys
        **_problems(dict(demo=dict(S=64, N=1024), bench=dict(S=256, N=4096)),
                    **choose.heuristic("cuda", 64, 128, "bfloat16")),
    },
    make_inputs=make_inputs,
    outputs=(3,),
    reference=reference,
    check=_check,
    flops=lambda p: 2 * p["S"] * p["N"] * p["heads"] * (p["dim"] + 1),
    bytes=lambda p: (p["S"] * p["heads"] * p["dim"] + p["N"] * p["dim"]) * 2 + p["S"] * p["N"] * 4,
    tags=("indexer", "attention"),
))
