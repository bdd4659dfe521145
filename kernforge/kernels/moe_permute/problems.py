"""The MoE permutation catalogue entries: routings with ``-1`` slots and idle experts,
inputs poisoned where the kernels must write, exact checks for the integer outputs and
error bounds for the reduction."""
from __future__ import annotations

import torch

from kernforge.kernels.moe_permute import config, reference
from kernforge.kernels.moe_permute.kernel import expand_to_fused, moe_mapping_scan, moe_mapping_scatter, reduce_fused
from kernforge.kernels.registry import KernelSpec, Problem, register

POISON = -777


def routing(num_tokens: int, num_topk: int, num_experts: int, seed: int) -> torch.Tensor:
    """int64 ``[T, k]`` ids: random experts, about 1 in 10 slots ``-1``, and expert 1 never
    chosen (a segment of length 0 between two others)."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, num_experts, (num_tokens, num_topk), generator=g)
    if num_experts > 2:
        idx[idx == 1] = 0
    idx[torch.rand((num_tokens, num_topk), generator=g) < 0.1] = -1
    return idx


def expanded_rows(num_tokens: int, num_topk: int, num_experts: int, alignment: int) -> int:
    """TileKernels' worst-case buffer: ``floor((T*k + (alignment-1)*E) / alignment) * alignment``."""
    return (num_tokens * num_topk + (alignment - 1) * num_experts) // alignment * alignment


def _i32(*shape):
    return torch.full(shape, POISON, dtype=torch.int32)


def _scan_state(idx: torch.Tensor, p: dict) -> list:
    """The scan kernel's outputs computed with torch: per-chunk exclusive counts, the valid
    counts and the segments."""
    e, a, ch = p["num_experts"], p["alignment"], p["chunk"]
    flat = idx.reshape(-1)
    chunks = config.num_chunks(flat.numel(), ch)
    hist = torch.zeros((chunks, e), dtype=torch.int64)
    for c in range(chunks):
        part = flat[c * ch:(c + 1) * ch]
        hist[c] = torch.bincount(part[part >= 0], minlength=e)
    offset = torch.cumsum(hist, 0) - hist
    _, _, _, _, start, end, padded = reference.mapping(idx, e, a, expanded_rows(*idx.shape, e, a))
    return [offset.int(), hist.sum(0).int(), start, end, padded]


def _scan_inputs(p, seed, device):
    idx = routing(p["num_tokens"], p["num_topk"], p["num_experts"], seed)
    chunks = config.num_chunks(idx.numel(), p["chunk"])
    e = p["num_experts"]
    ins = [idx, _i32(chunks, e), _i32(e), _i32(e), _i32(e), _i32(e)]
    return [t.to(device) for t in ins]


def _scatter_inputs(p, seed, device):
    idx = routing(p["num_tokens"], p["num_topk"], p["num_experts"], seed)
    n = expanded_rows(p["num_tokens"], p["num_topk"], p["num_experts"], p["alignment"])
    offset, count, start, end, _ = _scan_state(idx, p)
    ins = [idx, offset, count, start, end, _i32(n), _i32(n), _i32(n), _i32(*idx.shape)]
    return [t.to(device) for t in ins]


def _scatter_reference(inputs, p):
    idx = inputs[0].cpu()
    return list(reference.mapping(idx, p["num_experts"], p["alignment"], inputs[5].numel())[:4])


def _check_exact(names):
    def check(outputs, expected, inputs, params):
        for name, got, want in zip(names, outputs, expected):
            got = got.cpu()
            if not torch.equal(got, want):
                bad = (got != want).nonzero()[:5].tolist()
                raise AssertionError(f"{name} differ at {bad}: got {got.flatten()[:8].tolist()}..., "
                                     f"want {want.flatten()[:8].tolist()}...")
    return check


def _mapping_problems(**kw):
    """"small": several chunks, an idle expert, ``-1`` slots, alignment 16 so segments pad;
    "demo"/"bench": V4's 256 experts, top-6, alignment 128 at 512 and 4096 tokens."""
    return {
        "small": Problem("small", dict(num_tokens=45, num_topk=6, num_experts=8, alignment=16, chunk=64, **kw)),
        "demo": Problem("demo", dict(num_tokens=512, num_topk=6, num_experts=256, alignment=128, chunk=256, **kw)),
        "bench": Problem("bench", dict(num_tokens=4096, num_topk=6, num_experts=256, alignment=128, chunk=256,
                                       **kw)),
    }


SPEC_MAP_SCAN = register(KernelSpec(
    name="moe_mapping_scan",
    family="moe_permute",
    description="MoE fused mapping, step 1: per-chunk expert histograms, their scan, padded segments",
    factory=moe_mapping_scan,
    runtime_sizes=("num_tokens",),
    problems=_mapping_problems(),
    make_inputs=_scan_inputs,
    outputs=(1, 2, 3, 4, 5),
    reference=lambda inputs, p: _scan_state(inputs[0].cpu(), p),
    check=_check_exact(("chunk_offset", "expert_count", "expert_start", "expert_end", "num_tokens_per_expert")),
    bytes=lambda p: p["num_tokens"] * p["num_topk"] * 8,
    tags=("moe", "routing"),
))

SPEC_MAP_SCATTER = register(KernelSpec(
    name="moe_mapping_scatter",
    family="moe_permute",
    description="MoE fused mapping, step 2: slots scattered to expert-major rows in flat order, padding -1",
    factory=moe_mapping_scatter,
    runtime_sizes=("num_tokens",),
    problems=_mapping_problems(tail_tile=256, fill_tail=True),
    make_inputs=_scatter_inputs,
    outputs=(5, 6, 7, 8),
    reference=_scatter_reference,
    check=_check_exact(("pos_to_expert", "pos_to_token", "pos_to_token_topk", "token_topk_to_pos")),
    bytes=lambda p: p["num_tokens"] * p["num_topk"] * 12
    + 12 * expanded_rows(p["num_tokens"], p["num_topk"], p["num_experts"], p["alignment"]),
    tags=("moe", "routing"),
))


def _layout(p, seed):
    """A mapping from the reference, for the data-moving kernels' inputs."""
    idx = routing(p["num_tokens"], p["num_topk"], p["num_experts"], seed)
    n = expanded_rows(p["num_tokens"], p["num_topk"], p["num_experts"], p["alignment"])
    p2e, _, _, t2p, *_ = reference.mapping(idx, p["num_experts"], p["alignment"], n)
    return t2p, p2e


def _expand_inputs(p, seed, device):
    g = torch.Generator().manual_seed(seed + 1)
    t2p, p2e = _layout(p, seed)
    t, h, cols = p["num_tokens"], p["hidden"], p["sf_cols"]
    x = torch.randn((t, h), generator=g).to(getattr(torch, p["dtype"].replace("float8_e4m3", "float8_e4m3fn")))
    x_sf = torch.rand((t, cols), generator=g) + 0.5
    n = p2e.numel()
    out = torch.full((n, h), float("nan")).to(x.dtype)
    # the column-major scales: a [cols, n] view with a TMA-aligned row stride, as the op makes it
    out_sf = torch.full((cols, -(-n // 4) * 4), float("nan"))[:, :n]
    return [x.to(device), x_sf.to(device), t2p.to(device), p2e.to(device), out.to(device), out_sf.to(device)]


def _expand_reference(inputs, p):
    x, x_sf, t2p, p2e = (t.cpu() for t in inputs[:4])
    return [reference.expand(x.float(), t2p, p2e), reference.expand(x_sf, t2p, p2e).T]


def _check_expand(outputs, expected, inputs, params):
    for name, got, want in zip(("expanded_x", "expanded_sf"), outputs, expected):
        got = got.cpu().double()
        defined = ~torch.isnan(want)
        if not torch.equal(got[defined], want[defined]):
            bad = ((got != want) & defined).nonzero()[:5].tolist()
            raise AssertionError(f"{name} differ at {bad}")


SPEC_EXPAND = register(KernelSpec(
    name="expand_to_fused",
    family="moe_permute",
    description="MoE expand: token rows (e4m3 + float32 column-major scales) to their expert-major rows",
    factory=expand_to_fused,
    runtime_sizes=("num_tokens", "num_experts", "alignment"),
    problems={
        # a hidden size that is not a multiple of the column tile, three scale columns
        "small": Problem("small", dict(num_tokens=9, num_topk=3, num_experts=4, alignment=16, hidden=300,
                                       sf_cols=3, dtype="float8_e4m3", sf_col_major=True, block=128)),
        "demo": Problem("demo", dict(num_tokens=256, num_topk=6, num_experts=64, alignment=128, hidden=2048,
                                     sf_cols=16, dtype="float8_e4m3", sf_col_major=True, block=2048)),
        "bench": Problem("bench", dict(num_tokens=4096, num_topk=6, num_experts=256, alignment=128, hidden=4096,
                                       sf_cols=32, dtype="float8_e4m3", sf_col_major=True, block=4096)),
    },
    make_inputs=_expand_inputs,
    outputs=(4, 5),
    reference=_expand_reference,
    check=_check_expand,
    bytes=lambda p: p["num_tokens"] * p["num_topk"] * (p["hidden"] + 4 * p["sf_cols"]) * 2,
    tags=("moe", "permute"),
))


def _reduce_inputs(p, seed, device):
    g = torch.Generator().manual_seed(seed + 2)
    t2p, p2e = _layout(p, seed)
    x = torch.randn((p2e.numel(), p["hidden"]), generator=g).to(getattr(torch, p["dtype"]))
    w = torch.rand((p["num_tokens"], p["num_topk"]), generator=g)
    out = torch.full((p["num_tokens"], p["hidden"]), float("nan")).to(x.dtype)
    ins = [x, w, t2p, torch.zeros(1), torch.zeros(1), out]
    return [t.to(device) for t in ins]


def reduce_bound(x, w, t2p, want: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """``|out - reference|`` bound: float32 products and sums (``k + 1`` roundings of terms
    at most ``sum |w x|``) plus the store's rounding to ``out_dtype``."""
    mags = reference.reduce(x.abs(), None if w is None else w.abs(), t2p)
    k = t2p.shape[1]
    store = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11, torch.float32: 2.0 ** -24,
             torch.float8_e4m3fn: 2.0 ** -4}[out_dtype]
    return store * want.abs() + (k + 2) * 2.0 ** -24 * mags + 1e-30


def _check_reduce(outputs, expected, inputs, params):
    got = outputs[0].cpu().double()
    x, w, t2p = (t.cpu() for t in inputs[:3])
    assert not torch.isnan(got).any(), "out has NaN (unwritten or poisoned rows)"
    excess = (got - expected[0]).abs() - reduce_bound(x, w, t2p, expected[0], outputs[0].dtype)
    assert excess.max() <= 0, f"out exceeds its error bound by {excess.max().item():.3g}"


SPEC_REDUCE = register(KernelSpec(
    name="reduce_fused",
    family="moe_permute",
    description="MoE reduce: each token's expert rows, weighted, summed in float32 in slot order (bf16 out)",
    factory=reduce_fused,
    runtime_sizes=("num_tokens", "num_experts", "alignment"),
    problems={
        "small": Problem("small", dict(num_tokens=9, num_topk=3, num_experts=4, alignment=16, hidden=256,
                                       dtype="bfloat16", with_weights=True, block=128)),
        "demo": Problem("demo", dict(num_tokens=256, num_topk=6, num_experts=64, alignment=128, hidden=2048,
                                     dtype="bfloat16", with_weights=True, block=2048)),
        "bench": Problem("bench", dict(num_tokens=4096, num_topk=6, num_experts=256, alignment=128, hidden=4096,
                                       dtype="bfloat16", with_weights=True, block=4096)),
    },
    make_inputs=_reduce_inputs,
    outputs=(5,),
    reference=lambda inputs, p: [reference.reduce(inputs[0], inputs[1], inputs[2])],
    check=_check_reduce,
    flops=lambda p: 2.0 * p["num_tokens"] * p["num_topk"] * p["hidden"],
    bytes=lambda p: p["num_tokens"] * (p["num_topk"] + 1) * p["hidden"] * 2,
    tags=("moe", "permute"),
))
