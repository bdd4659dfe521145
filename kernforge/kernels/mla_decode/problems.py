"""The MLA decode catalogue entries: problems, paged-cache inputs, references and tolerances."""
import math

import torch

from kernforge.kernels.mla_decode import config, scheduled, split_kv
from kernforge.kernels.mla_decode.kernel import mla_decode, mla_decode_combine, mla_decode_sparse
from kernforge.kernels.mla_decode.reference import reference, reference_sparse
from kernforge.kernels.registry import KernelSpec, Problem, register

# Problem keys that size the inputs but are not compile-time parameters of the kernel.
_RUNTIME_SIZES = ("batch", "seqlens")
UNUSED_BLOCK = 2147480000   # FlashMLA's tests put this in unused block_table slots


def make_cache(seqlens: list[int], page_size: int, heads_kv: int, dim: int, gen: torch.Generator,
               dtype=torch.bfloat16, device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """A shuffled paged cache for ``seqlens``: ``(kv_cache [pages, page, h_kv, dim], block_table)``.
    Positions past each request's length are NaN and unused table slots hold
    ``UNUSED_BLOCK``, so a kernel that reads beyond ``cache_seqlens`` shows up as NaN
    or a fault rather than passing by luck."""
    blocks = [-(-n // page_size) for n in seqlens]
    max_blocks = max(max(blocks), 1)
    total = sum(blocks) + 1                                   # one spare page nobody owns
    kv = torch.randn(total, page_size, heads_kv, dim, generator=gen)
    perm = torch.randperm(total, generator=gen)
    table = torch.full((len(seqlens), max_blocks), UNUSED_BLOCK, dtype=torch.int32)
    used = 0
    for i, (n, nb) in enumerate(zip(seqlens, blocks)):
        pages = perm[used:used + nb]
        table[i, :nb] = pages.int()
        flat = kv[pages].reshape(-1, heads_kv, dim)
        flat[n:] = float("nan")
        kv[pages] = flat.reshape(nb, page_size, heads_kv, dim)
        used += nb
    kv[perm[used:]] = float("nan")
    return kv.to(dtype).to(device), table.to(device)


def make_inputs(params: dict, seed: int, device: str = "cpu") -> list:
    g = torch.Generator().manual_seed(seed)
    b, heads, seq_q, dim = params["batch"], params["heads"], params.get("seq_q", 1), params.get("dim", 576)
    dim_v, page, heads_kv = params.get("dim_v", 512), params.get("page_size", 64), params.get("heads_kv", 1)
    seqlens = params["seqlens"]
    kv, table = make_cache(seqlens, page, heads_kv, dim, g, device=device)
    q = torch.randn(b, seq_q, heads, dim, generator=g).bfloat16().to(device)
    sink = torch.randn(heads, generator=g).to(device)
    out = torch.full((b, seq_q, heads, dim_v), float("nan"), dtype=torch.bfloat16, device=device)
    lse = torch.full((b, heads, seq_q), float("nan"), device=device)
    lens = torch.tensor(seqlens, dtype=torch.int32, device=device)
    return [q, kv.view(-1, heads_kv * dim), table, lens, sink, dim ** -0.5, out, lse]


def _reference(inputs: list, params: dict) -> list:
    q, kv, table, lens, sink, scale = inputs[:6]
    page, heads_kv, dim = params.get("page_size", 64), params.get("heads_kv", 1), q.shape[-1]
    out, lse = reference(q, kv.view(-1, page, heads_kv, dim), table, lens, sink, scale,
                         params.get("dim_v", 512), params.get("causal", False))
    return [out, lse]


def tolerances(q: torch.Tensor, kv: torch.Tensor, sm_scale: float, max_len: int,
               dim_v: int) -> tuple[float, float]:
    """Absolute error bounds ``(out, lse)`` for bf16 inputs with float32 accumulation.

    * scores: bf16 x bf16 products are exact in float32, so a d-term dot product is off
      by at most ``d * 2^-24 * sum|q_i k_i| <= d * 2^-24 * |q| |k|`` (Cauchy-Schwarz),
      times ``sm_scale``; the float32 running sum of up to ``max_len`` terms adds a
      relative ``max_len * 2^-24`` to the normaliser, i.e. that much to the lse.
    * output: a score error ``e`` scales a probability by at most ``exp(2e)``; the
      probabilities are rounded to bf16 (relative 2^-8) before P.V and the output is
      rounded to bf16 once more (2^-8 of max|v|), so ``|err| <= (2^-7 + 4e) max|v|``.
    """
    finite = kv[~torch.isnan(kv.float()).any(-1)].float()
    qn = q.float().norm(dim=-1).max().item()
    kn = finite.norm(dim=-1).max().item() if finite.numel() else 0.0
    d = q.shape[-1]
    e_score = sm_scale * d * 2.0 ** -24 * qn * kn
    e_lse = e_score + (max_len + 8) * 2.0 ** -24
    vmax = finite[:, :dim_v].abs().max().item() if finite.numel() else 0.0
    return (2.0 ** -7 + 4 * e_lse) * vmax + 1e-6, e_lse + 1e-6


def assert_close(out, lse, exp_out, exp_lse, tol_out: float, tol_lse: float) -> None:
    """Outputs within ``tol_out``; lse within ``tol_lse`` and +inf exactly where expected."""
    got, exp_out, exp_lse = out.cpu().double(), exp_out.cpu(), exp_lse.cpu()
    assert not torch.isnan(got).any(), "output has NaN (unwritten or poisoned elements)"
    err = (got - exp_out).abs().max().item()
    assert err <= tol_out, f"output differs by {err:.3g} > {tol_out:.3g}"
    gl = lse.cpu().double()
    assert not torch.isnan(gl).any(), "lse has NaN (unwritten or poisoned elements)"
    inf_got, inf_exp = torch.isinf(gl), torch.isinf(exp_lse)
    assert torch.equal(inf_got, inf_exp), "lse is +inf for a different set of rows than expected"
    finite = ~inf_exp
    if finite.any():
        e = (gl[finite] - exp_lse[finite]).abs().max().item()
        assert e <= tol_lse, f"lse differs by {e:.3g} > {tol_lse:.3g}"


def _check(outputs: list, expected: list, inputs: list, params: dict) -> None:
    q, kv, scale = inputs[0], inputs[1], inputs[5]
    tol_out, tol_lse = tolerances(q, kv, scale, max(params["seqlens"]), params.get("dim_v", 512))
    assert_close(outputs[0], outputs[1], expected[0], expected[1], tol_out, tol_lse)


def _flops(p: dict) -> float:
    rows = p["heads"] * p.get("seq_q", 1)
    return sum(2.0 * rows * n * (p.get("dim", 576) + p.get("dim_v", 512)) for n in p["seqlens"])


def _bytes(p: dict) -> float:
    rows = p["heads"] * p.get("seq_q", 1)
    kv = sum(p["seqlens"]) * p.get("heads_kv", 1) * p.get("dim", 576) * 2
    return kv + p["batch"] * rows * (p.get("dim", 576) + p.get("dim_v", 512)) * 2


SPEC = register(KernelSpec(
    name="mla_decode",
    family="mla_decode",
    description="FlashMLA-style dense paged MLA decode: online softmax, bf16 in, fp32 accum, out + lse",
    factory=mla_decode,
    runtime_sizes=_RUNTIME_SIZES,
    # tile sizes come from the configuration chooser the op uses: "small" (tests and
    # emulation run it on host backends) takes the host configuration, "demo" and "bench"
    # (the GPU benchmarks' sizes) the CUDA one
    problems={
        # V4 tiny test geometry (head_dim 96 = 64 value + 32 rope), MTP with causal mask
        "small": Problem("small", dict(batch=2, seqlens=[37, 5], **config.choose.heuristic(
            "cpu", heads=8, heads_kv=1, seq_q=2, dim=96, dim_v=64, page_size=16, causal=True))),
        "demo": Problem("demo", dict(batch=2, seqlens=[700, 333], **config.choose.heuristic(
            "cuda", heads=64, seq_q=1, dim=576, dim_v=512))),
        # FlashMLA's dense perf shape (b=128, h_q=128, s_q=1, s_k=4096), configured for an
        # H100/H200 (sm_90a: 64-token tiles, the seesaw schedule; too big for sm_80's shared memory)
        "bench": Problem("bench", dict(batch=128, seqlens=[4096] * 128, **config.choose.heuristic(
            "cuda", heads=128, seq_q=1, dim=576, dim_v=512, arch="sm_90a")), cuda_archs=("sm_90a", "sm_100a")),
    },
    make_inputs=make_inputs,
    outputs=(6, 7),
    reference=_reference,
    check=_check,
    flops=_flops,
    bytes=_bytes,
    tags=("attention", "decode", "paged"),
))


_SPARSE_RUNTIME_SIZES = ("batch", "num_tokens", "topk_lengths")


def make_inputs_sparse(params: dict, seed: int, device: str = "cpu") -> list:
    g = torch.Generator().manual_seed(seed)
    b, heads, seq_q, topk = params["batch"], params["heads"], params.get("seq_q", 1), params["topk"]
    dim, dim_v, num_tokens = params.get("dim", 576), params.get("dim_v", 512), params["num_tokens"]
    lengths = torch.tensor(params["topk_lengths"], dtype=torch.int32)
    kv = torch.randn(num_tokens, dim, generator=g).bfloat16()
    indices = torch.randint(0, num_tokens, (b, seq_q, topk), generator=g, dtype=torch.int32)
    indices[torch.rand(b, seq_q, topk, generator=g) < 0.1] = -1            # empty slots
    for i, n in enumerate(lengths.tolist()):
        indices[i, :, n:] = UNUSED_BLOCK                                    # never read
    q = torch.randn(b, seq_q, heads, dim, generator=g).bfloat16()
    sink = torch.randn(heads, generator=g)
    out = torch.full((b, seq_q, heads, dim_v), float("nan"), dtype=torch.bfloat16)
    lse = torch.full((b, heads, seq_q), float("nan"))
    tensors = [q, kv, indices, lengths, sink]
    return [t.to(device) for t in tensors] + [dim ** -0.5] + [out.to(device), lse.to(device)]


def _reference_sparse(inputs: list, params: dict) -> list:
    q, kv, indices, lengths, sink, scale = inputs[:6]
    return list(reference_sparse(q, kv, indices, lengths, sink, scale, params.get("dim_v", 512)))


def _check_sparse(outputs: list, expected: list, inputs: list, params: dict) -> None:
    tol_out, tol_lse = tolerances(inputs[0], inputs[1], inputs[5], params["topk"],
                                  params.get("dim_v", 512))
    assert_close(outputs[0], outputs[1], expected[0], expected[1], tol_out, tol_lse)


def _flops_sparse(p: dict) -> float:
    rows = p["heads"] * p.get("seq_q", 1)
    return sum(2.0 * rows * min(n, p["topk"]) * (p.get("dim", 576) + p.get("dim_v", 512))
               for n in p["topk_lengths"])


SPEC_SPARSE = register(KernelSpec(
    name="mla_decode_sparse",
    family="mla_decode",
    description="Sparse (index-selected, DSA) MLA decode with topk_length and attention sink",
    factory=mla_decode_sparse,
    runtime_sizes=_SPARSE_RUNTIME_SIZES,
    # tile sizes from the op's chooser, as for the dense kernel (host for "small", CUDA otherwise)
    problems={
        # block_N pinned to 16 (the chooser's 32 would hold all 24 slots in one tile), so the
        # tile loop runs twice and the second tile is partly past topk_length
        "small": Problem("small", dict(batch=2, num_tokens=90, topk_lengths=[24, 11], **dict(
            config.choose_sparse.heuristic("cpu", heads=8, topk=24, seq_q=2, dim=96, dim_v=64), block_N=16))),
        # V4 geometry: 64 heads, d = dim_v = 512, index_topk 512
        "demo": Problem("demo", dict(batch=2, num_tokens=4096, topk_lengths=[512, 300],
                                     **config.choose_sparse.heuristic("cuda", heads=64, topk=512, dim=512,
                                                                      dim_v=512))),
        # FlashMLA's sparse perf shape (b=148... scaled to b=128, s_q=2, topk=2048, h=128)
        "bench": Problem("bench", dict(batch=128, num_tokens=32768, topk_lengths=[2048] * 128,
                                       **config.choose_sparse.heuristic("cuda", heads=128, topk=2048, seq_q=2,
                                                              dim=576, dim_v=512))),
    },
    make_inputs=make_inputs_sparse,
    outputs=(6, 7),
    reference=_reference_sparse,
    check=_check_sparse,
    flops=_flops_sparse,
    tags=("attention", "decode", "sparse"),
))


def make_inputs_combine(params: dict, seed: int, device: str = "cpu") -> list:
    """Split-KV partials as the split kernel leaves them: per split a normalised float32
    output and its lse, ``-inf`` (output 0) for a split that saw no key.  About one split in
    four is empty, and the last request's first head is empty in every split (output 0,
    lse ``+inf`` after the merge); lse values spread over +-8 so the weights differ by
    orders of magnitude."""
    g = torch.Generator().manual_seed(seed)
    b, heads, splits = params["batch"], params["heads"], params["num_splits"]
    seq_q, dim_v = params.get("seq_q", 1), params.get("dim_v", 512)
    o_part = torch.randn(b, splits, seq_q, heads, dim_v, generator=g)
    lse_part = torch.rand(b, splits, heads, seq_q, generator=g) * 16 - 8
    empty = torch.rand(b, splits, heads, seq_q, generator=g) < 0.25
    empty[-1, :, 0, :] = True
    lse_part[empty] = -math.inf
    o_part.masked_fill_(empty.permute(0, 1, 3, 2)[..., None], 0.0)
    sink = torch.randn(heads, generator=g)
    out = torch.full((b, seq_q, heads, dim_v), float("nan"), dtype=torch.bfloat16)
    lse = torch.full((b, heads, seq_q), float("nan"))
    return [t.to(device) for t in (o_part, lse_part, sink, out, lse)]


def reference_combine(o_part: torch.Tensor, lse_part: torch.Tensor, sink: torch.Tensor) -> list:
    """float64 merge: ``lse = logsumexp_s lse_s``, ``out = sum_s exp(lse_s - lse) out_s``,
    times the sink factor ``1 / (1 + exp(sink - lse))``; rows with every split empty: 0
    and ``+inf``."""
    o, l = o_part.cpu().double(), lse_part.cpu().double()
    lse = torch.logsumexp(l, dim=1)                                       # [b, h, s]
    empty = torch.isneginf(lse)
    w = torch.exp(l - lse[:, None]).masked_fill(empty[:, None], 0.0)      # [b, splits, h, s]
    out = torch.einsum("bphs,bpshd->bshd", w, o)
    out = out / (1 + torch.exp(sink.cpu().double()[None, :, None] - lse)).permute(0, 2, 1)[..., None]
    return [out.masked_fill(empty.permute(0, 2, 1)[..., None], 0.0), lse.masked_fill(empty, math.inf)]


def _check_combine(outputs: list, expected: list, inputs: list, params: dict) -> None:
    """Bounds: the output is stored in bf16 (2^-8 of the largest partial) after float32
    weights and sums (a few ulps of it each); the lse is a float32 log of a float32 sum
    of ``num_splits`` exponentials (a few ulps of ``|lse|`` plus 2^-24 per split)."""
    o_max = inputs[0].abs().max().item()
    finite = expected[1][torch.isfinite(expected[1])]
    l_max = finite.abs().max().item() if finite.numel() else 0.0
    splits = params["num_splits"]
    tol_out = (2.0 ** -8 + (splits + 4) * 2.0 ** -23) * o_max + 1e-6
    tol_lse = 8 * 2.0 ** -24 * l_max + (splits + 4) * 2.0 ** -23
    assert_close(outputs[0], outputs[1], expected[0], expected[1], tol_out, tol_lse)


SPEC_COMBINE = register(KernelSpec(
    name="mla_decode_combine",
    family="mla_decode",
    description="MLA decode split-KV combine: merge per-split outputs by their lse, then the sink",
    factory=mla_decode_combine,
    runtime_sizes=("batch",),
    problems={
        # 24 (token, head) rows: two blocks of the host's 16, the second ragged; three
        # splits (not a power of two)
        "small": Problem("small", dict(batch=3, **config.choose_combine.heuristic(
            "cpu", heads=12, num_splits=3, seq_q=2, dim_v=64))),
        "demo": Problem("demo", dict(batch=2, **config.choose_combine.heuristic(
            "cuda", heads=64, num_splits=8, seq_q=1, dim_v=512))),
        # the factor choose_splits gives 8 requests x 128 heads (16 row blocks of 64) with
        # long contexts on a 132-SM Hopper: 16 splits
        "bench": Problem("bench", dict(batch=8, **config.choose_combine.heuristic(
            "cuda", heads=128, num_splits=16, seq_q=1, dim_v=512))),
    },
    make_inputs=make_inputs_combine,
    outputs=(3, 4),
    reference=lambda inputs, p: reference_combine(*inputs[:3]),
    check=_check_combine,
    bytes=lambda p: p["batch"] * p["heads"] * p.get("seq_q", 1) * (
        p["num_splits"] * (p.get("dim_v", 512) + 1) * 4 + p.get("dim_v", 512) * 2 + 4),
    tags=("attention", "decode", "split-kv"),
))


# ---------------------------------------------------------------- split-KV counts
# The split count's sweep: ``num_splits`` is its only tunable, the tiles are problem
# parameters at the op's heuristic (docs/tuning.md says why it is an entry of its own).
# ``batch`` requests over a block table ``pages`` wide are the runtime sizes the op
# keys its lookup on (:func:`config.choose_splits`); every request fills the table but
# the last, half a page short, so the last KV tile is ragged.
_SPLITKV_SIZES = ("batch", "pages")


def _splitkv_lengths(params: dict) -> dict:
    """``params`` with the ``seqlens`` the dense entry's helpers read."""
    full, page = params["pages"] * params.get("page_size", 64), params.get("page_size", 64)
    return dict(params, seqlens=[full] * (params["batch"] - 1) + [full - page // 2])


SPEC_SPLITKV = register(KernelSpec(
    name="mla_decode_splitkv",
    family="mla_decode",
    description="Dense paged MLA decode at a split-KV count (split kernel + combine, merged output checked)",
    factory=split_kv.mla_decode_splitkv,
    runtime_sizes=_SPLITKV_SIZES,
    # one split in every problem, so the tools that compile the factory alone (emit, run,
    # the emulator and checked-mode suites) run a complete kernel; the sweep builds each
    # count through ``build`` (the kernel, then the combine)
    problems={
        # the dense "small" geometry over 5 KV tiles of 16: 4 splits leave one empty
        "small": Problem("small", dict(batch=2, pages=5, **config.choose.heuristic(
            "cpu", heads=8, heads_kv=1, seq_q=2, dim=96, dim_v=64, page_size=16, causal=True))),
        "demo": Problem("demo", dict(batch=2, pages=16, **config.choose.heuristic(
            "cuda", heads=64, seq_q=1, dim=576, dim_v=512))),
        # a small batch with long contexts, the case split-KV is for (4 x 2 row blocks of
        # 64 heads on 132 SMs; 4096 tokens)
        "bench": Problem("bench", dict(batch=4, pages=64, **config.choose.heuristic(
            "cuda", heads=128, seq_q=1, dim=576, dim_v=512))),
    },
    make_inputs=lambda params, seed, device="cpu": make_inputs(_splitkv_lengths(params), seed, device),
    outputs=(6, 7),
    reference=_reference,
    check=lambda outputs, expected, inputs, params: _check(outputs, expected, inputs, _splitkv_lengths(params)),
    flops=lambda p: _flops(_splitkv_lengths(p)),
    bytes=lambda p: _bytes(_splitkv_lengths(p)),
    tags=("attention", "decode", "paged", "split-kv"),
    build=split_kv.build,
))


# ---------------------------------------------------------------- balanced split-KV schedule
# The dense kernel over FlashMLA's balanced schedule (:mod:`.schedule`); ``num_sm_parts``
# sizes the schedule (FlashMLA's partition count) and, like the lengths, is a runtime size.
_SCHED_SIZES = ("batch", "seqlens", "num_sm_parts")


def make_inputs_scheduled(params: dict, seed: int, device: str = "cpu") -> list:
    """The dense inputs with the schedule of their lengths inserted after ``cache_seqlens``
    and the float32 accumulators (``batch + num_sm_parts`` rows, NaN-poisoned) appended."""
    from kernforge.kernels.mla_decode import schedule

    q, kv, table, lens, sink, scale, out, lse = make_inputs(params, seed, device)
    meta, num_splits = schedule.schedule(params["seqlens"], params["num_sm_parts"])
    rows = params["batch"] + params["num_sm_parts"]
    seq_q, heads, dim_v = q.shape[1], q.shape[2], out.shape[-1]
    o_acc = torch.full((rows, seq_q, heads, dim_v), float("nan"), device=device)
    lse_acc = torch.full((rows, heads, seq_q), float("nan"), device=device)
    return [q, kv, table, lens, meta.to(device), num_splits.to(device), sink, scale, out, lse, o_acc, lse_acc]


def _unscheduled(inputs: list) -> list:
    """The dense entry's inputs from the scheduled entry's."""
    return inputs[:4] + inputs[6:10]


SPEC_SCHEDULED = register(KernelSpec(
    name="mla_decode_scheduled",
    family="mla_decode",
    description="Dense paged MLA decode over FlashMLA's balanced split-KV schedule (split kernel + combine)",
    factory=scheduled.mla_decode_scheduled,
    runtime_sizes=_SCHED_SIZES,
    # "small" has no request cut (two partitions, three one-block requests, one empty),
    # so the tools that compile the factory alone run a complete kernel; cut requests
    # and the combine are tested in tests/emu/test_mla_schedule.py.  "demo" and "bench"
    # cut requests (built through ``build``: the split kernel, then the combine)
    problems={
        "small": Problem("small", dict(batch=3, seqlens=[37, 5, 0], num_sm_parts=2, **config.choose.heuristic(
            "cpu", heads=8, heads_kv=1, seq_q=2, dim=96, dim_v=64, page_size=16, causal=True))),
        "demo": Problem("demo", dict(batch=3, seqlens=[700, 333, 5000], num_sm_parts=8, **config.choose.heuristic(
            "cuda", heads=64, seq_q=1, dim=576, dim_v=512))),
        # FlashMLA's dense perf shape on a 132-SM H100/H200: 132 / 2 row blocks = 66 partitions
        "bench": Problem("bench", dict(batch=128, seqlens=[4096] * 128, num_sm_parts=66, **config.choose.heuristic(
            "cuda", heads=128, seq_q=1, dim=576, dim_v=512, arch="sm_90a")), cuda_archs=("sm_90a", "sm_100a")),
    },
    make_inputs=make_inputs_scheduled,
    outputs=(8, 9),
    reference=lambda inputs, params: _reference(_unscheduled(inputs), params),
    check=lambda outputs, expected, inputs, params: _check(outputs, expected, _unscheduled(inputs), params),
    flops=_flops,
    bytes=_bytes,
    tags=("attention", "decode", "paged", "split-kv"),
    build=scheduled.build,
))
