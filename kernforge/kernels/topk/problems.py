"""The TopK catalogue entries: problems, inputs, reference and an exact check per kernel."""
from __future__ import annotations

import torch

from kernforge.kernels.registry import KernelSpec, Problem, register
from kernforge.kernels.topk.kernel import bit_tables, topk_select
from kernforge.kernels.topk.reference import reference


def _make_inputs(params, seed, device):
    g = torch.Generator().manual_seed(seed)
    b, n, k = params["batch"], params["vocab"], params["k"]
    dt = getattr(torch, params.get("dtype", "float32"))
    idt = getattr(torch, params.get("index_dtype", "int64"))
    x = torch.randn((b, n), generator=g).to(dt)
    end = torch.randint(0, n + 1, (b,), generator=g, dtype=torch.int32)
    end[0] = n
    offset = torch.randint(-1000, 1000, (b,), generator=g, dtype=torch.int32)
    nan_rows = torch.full((b,), -1, dtype=torch.int32)
    out_idx = torch.full((b, k), -77, dtype=idt)
    out_val = torch.full((b, k), float("nan"), dtype=dt)
    ins = [x, end, offset, 2**31 - 1, float("-inf"), nan_rows, out_idx, out_val, *bit_tables()]
    return [a.to(device) if isinstance(a, torch.Tensor) else a for a in ins]


def _reference(inputs, params):
    x, end, offset, idx_fill, val_fill = inputs[:5]
    v, i, nan = reference(x.cpu(), params["k"], end.cpu(), params.get("sorted_values", False),
                          offset.cpu(), idx_fill, val_fill,
                          getattr(torch, params.get("index_dtype", "int64")))
    return [nan, i, v]


def _check(outputs, expected, inputs, params):
    names = ("nan_rows", "indices", "values")
    for name, got, want in zip(names, outputs, expected):
        got = got.cpu()
        same = (torch.equal(got.view(torch.int16), want.view(torch.int16))
                if got.dtype == torch.bfloat16 else
                torch.equal(got.view(torch.int32), want.view(torch.int32))
                if got.dtype == torch.float32 else torch.equal(got, want))
        if not same:
            bad = (got != want).nonzero()[:5].tolist()
            raise AssertionError(f"topk {name} differ at {bad}: got {got.flatten()[:8].tolist()}..., "
                                 f"want {want.flatten()[:8].tolist()}...")


def _problems(**kernel):
    """Both kernels' sizes.  The configurations are pinned, not the op's (``config.choose``
    differs per backend): "small" uses tiny tiles and slack so that 700-element rows span
    several tiles, a ragged last tile and buffer refinements; "demo" and "bench" keep the
    factory's defaults (group_serial compaction, 1024-element tiles, no prescan), one
    configuration that every backend runs.  ``benchmarks/bench_topk.py`` times the op's."""
    return {
        "small": Problem("small", dict(batch=3, vocab=700, k=16, tile=128, group=8, slack=128,
                                       compaction="tile_scan", **kernel)),
        "demo": Problem("demo", dict(batch=8, vocab=32768, k=512, **kernel)),
        "bench": Problem("bench", dict(batch=32, vocab=129280, k=512, **kernel)),
    }


SPEC_FP32 = register(KernelSpec(
    name="topk_fp32",
    family="topk",
    description="TopK select over float32 rows (the sampler path), values sorted descending",
    factory=topk_select,
    runtime_sizes=("batch", "vocab"),
    problems=_problems(dtype="float32", index_dtype="int64", sorted_values=True),
    make_inputs=_make_inputs,
    outputs=(5, 6, 7),
    reference=_reference,
    check=_check,
    bytes=lambda p: p["batch"] * p["vocab"] * 4 + p["batch"] * p["k"] * 12,
    tags=("topk", "sampler"),
))

SPEC_BF16 = register(KernelSpec(
    name="topk_bf16",
    family="topk",
    description="TopK select over bfloat16 rows (the DSA lightning-indexer path), int32 indices",
    factory=topk_select,
    runtime_sizes=("batch", "vocab"),
    problems=_problems(dtype="bfloat16", index_dtype="int32"),
    make_inputs=_make_inputs,
    outputs=(5, 6, 7),
    reference=_reference,
    check=_check,
    bytes=lambda p: p["batch"] * p["vocab"] * 2 + p["batch"] * p["k"] * 6,
    tags=("topk", "indexer"),
))
