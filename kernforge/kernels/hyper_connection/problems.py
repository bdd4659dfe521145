"""The hyper-connection catalogue entries: ``hc_pre`` (mixes + Sinkhorn + collapse), ``hc_post`` and
``hc_head``, on random streams and mixer parameters of the model's shapes."""
from __future__ import annotations

import torch

from kernforge.kernels.hyper_connection import reference as ref
from kernforge.kernels.hyper_connection.config import choose_head, choose_post, choose_pre
from kernforge.kernels.hyper_connection.kernel import hc_head, hc_post, hc_pre
from kernforge.kernels.registry import KernelSpec, Problem, register

NORM_EPS = HC_EPS = 1e-6


def tolerance(dtype: torch.dtype) -> dict:
    """float32: the M*D-long mixing dot products in float32 against float64; bfloat16: one output rounding."""
    return dict(rtol=1e-5, atol=2e-5) if dtype == torch.float32 else dict(rtol=2.0 ** -7, atol=2e-2)


def mixer(g: torch.Generator, rows: int, width: int, n_scales: int):
    """``fn, scale, base`` of a trained-looking mixer: small ``fn`` so the mixes stay O(1)."""
    fn = torch.randn(rows, width, generator=g) * width ** -0.5
    return fn, torch.rand(n_scales, generator=g) + 0.5, torch.randn(rows, generator=g) * 0.5


def _streams(params, g):
    return torch.randn(params["tokens"], params["hc_mult"] * params["dim"], generator=g).to(
        getattr(torch, params["dtype"]))


def _nan(*shape, dtype=torch.float32):
    return torch.full(shape, float("nan"), dtype=dtype)


def _pre_inputs(params, seed, device):
    g = torch.Generator().manual_seed(seed)
    n, m, d = params["tokens"], params["hc_mult"], params["dim"]
    x = _streams(params, g)
    fn, scale, base = mixer(g, (2 + m) * m, m * d, 3)
    ins = [x, fn.to(getattr(torch, params["fn_dtype"])), scale, base, _nan(n, d, dtype=x.dtype), _nan(n, m),
           _nan(n, m, m)]
    return [t.to(device) for t in ins] + [NORM_EPS, HC_EPS]


def _pre_reference(inputs, params):
    x, fn, scale, base = (t.cpu() for t in inputs[:4])
    m = params["hc_mult"]
    return list(ref.hc_pre(x.view(x.shape[0], m, -1), fn, scale, base, params["sinkhorn_iters"], *inputs[7:]))


def _head_inputs(params, seed, device):
    g = torch.Generator().manual_seed(seed)
    n, m, d = params["tokens"], params["hc_mult"], params["dim"]
    x = _streams(params, g)
    fn, scale, base = mixer(g, m, m * d, 1)
    ins = [x, fn.to(getattr(torch, params["fn_dtype"])), scale, base, _nan(n, d, dtype=x.dtype)]
    return [t.to(device) for t in ins] + [NORM_EPS, HC_EPS]


def _head_reference(inputs, params):
    x, fn, scale, base = (t.cpu() for t in inputs[:4])
    return [ref.hc_head(x.view(x.shape[0], params["hc_mult"], -1), fn, scale, base, *inputs[5:])]


def _post_inputs(params, seed, device):
    g = torch.Generator().manual_seed(seed)
    n, m, d = params["tokens"], params["hc_mult"], params["dim"]
    x = _streams(params, g)
    y = torch.randn(n, d, generator=g).to(x.dtype)
    post = 2 * torch.rand(n, m, generator=g)
    comb = ref.sinkhorn(torch.randn(n, m, m, generator=g), 20, HC_EPS).float()
    return [t.to(device) for t in (y, x, post, comb, _nan(n, m * d, dtype=x.dtype))]


def _post_reference(inputs, params):
    y, x, post, comb = (t.cpu() for t in inputs[:4])
    return [ref.hc_post(y, x.view(x.shape[0], params["hc_mult"], -1), post, comb).flatten(1)]


def peers(spec, inputs, params):
    """The model's torch function on the spec's inputs, for ``benchmarks/gpu_check.py``'s timing
    columns (``PEERS[family]``): what this kernel replaces in ``kernforge/model``."""
    from kernforge.model import block

    m = params["hc_mult"]
    if spec.name == "hc_post":
        y, x, post, comb = inputs[:4]
        xs = list(x.view(x.shape[0], m, -1).unbind(1))
        return {"model hc_post (torch)": lambda: block.hc_post(y, xs, post, comb)}
    x, fn, scale, base = inputs[:4]
    xs = list(x.view(x.shape[0], m, -1).unbind(1))
    if spec.name == "hc_head":
        return {"model hc_head (torch)": lambda: block.hc_head(xs, fn, scale, base, NORM_EPS, HC_EPS)}
    return {"model hc_pre (torch)": lambda: block.hc_pre(xs, fn, scale, base, params["sinkhorn_iters"],
                                                          NORM_EPS, HC_EPS)}


def _check(name):
    def check(outputs, expected, inputs, params):
        for i, (got, want) in enumerate(zip(outputs, expected)):
            got = got.cpu()
            torch.testing.assert_close(got.double(), want.double(), **tolerance(inputs[0].dtype),
                                       msg=lambda m: f"{name} output {i}: {m}")
    return check


def _problems(small: dict, full: dict):
    """"small": tiny tiles (two tokens per block, M*D streamed in several ``block_k`` tiles, a ragged last
    token block); "demo" / "bench": ``full``, the op's CUDA configuration at V4-Flash's M = 4, D = 4096
    (also what the nvcc tests build)."""
    return {
        "small": Problem("small", dict(tokens=5, hc_mult=4, dim=64, dtype="float32", block_tokens=2, **small)),
        "demo": Problem("demo", dict(tokens=1024, **full)),
        "bench": Problem("bench", dict(tokens=8192, **full)),
    }


SPEC_PRE = register(KernelSpec(
    name="hc_pre",
    family="hyper_connection",
    description="mHC pre-mix: mixes, sigmoid weights, Sinkhorn, collapse to the sublayer input",
    factory=hc_pre,
    runtime_sizes=("tokens",),
    problems=_problems(dict(block_k=64, sinkhorn_iters=20, fn_dtype="float32"),
                       choose_pre.heuristic("cuda", 4, 4096, 20, "bfloat16", "float32")),
    make_inputs=_pre_inputs,
    outputs=(4, 5, 6),
    reference=_pre_reference,
    check=_check("hc_pre"),
    flops=lambda p: 2 * p["tokens"] * (2 + p["hc_mult"]) * p["hc_mult"] ** 2 * p["dim"],
    tags=("hyper_connection", "dense"),
))

SPEC_HEAD = register(KernelSpec(
    name="hc_head",
    family="hyper_connection",
    description="mHC head collapse: mixes and sigmoid pre weights over the final streams (no Sinkhorn)",
    factory=hc_head,
    runtime_sizes=("tokens",),
    problems=_problems(dict(block_k=64, fn_dtype="float32"),
                       choose_head.heuristic("cuda", 4, 4096, "bfloat16", "float32")),
    make_inputs=_head_inputs,
    outputs=(4,),
    reference=_head_reference,
    check=_check("hc_head"),
    flops=lambda p: 2 * p["tokens"] * p["hc_mult"] ** 2 * p["dim"],
    tags=("hyper_connection", "dense"),
))

SPEC_POST = register(KernelSpec(
    name="hc_post",
    family="hyper_connection",
    description="mHC post-mix: X'_k = post_k y + sum_j comb[j, k] X_j",
    factory=hc_post,
    runtime_sizes=("tokens",),
    problems=_problems(dict(block_d=32), choose_post.heuristic("cuda", 4, 4096, "bfloat16")),
    make_inputs=_post_inputs,
    outputs=(4,),
    reference=_post_reference,
    check=_check("hc_post"),
    bytes=lambda p: p["tokens"] * p["dim"] * (2 * p["hc_mult"] + 1) * (2 if p["dtype"] == "bfloat16" else 4),
    tags=("hyper_connection", "dense"),
))
