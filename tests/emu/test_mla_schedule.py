"""FlashMLA's balanced split-KV schedule (kernforge.kernels.mla_decode.schedule) and the
dense kernel + combine that follow it (``mla_decode_scheduled``), on the interpreter and
under CUDA host emulation (sm_90a: wgmma + TMA; sm_80: mma.sync + cp.async).

The schedule is checked against an independent walk of its rows (every (request, block)
exactly once, each split at its own accumulator row) and against the balance bound
(no partition holds more than ``ceil(total / parts) + overhead`` blocks of work); the
kernels are checked against the float64 unsplit reference with ragged lengths that
make the schedule cut requests across partitions.
"""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

import kernforge
from kernforge.kernels.mla_decode import problems, reference, schedule
from kernforge.kernels.mla_decode.scheduled import (Scheduled, mla_decode_combine_scheduled,
                                                    mla_decode_scheduled)
from kernforge.ops import mla


def _walk(meta, num_splits, seqlens, overhead):
    """Independently of :func:`schedule.pieces`: per partition the blocks it covers, and
    per request the (block -> accumulator row) map, from the raw metadata rows."""
    blocks = [max(math.ceil(n / 64), 1) for n in seqlens]
    cover, rows, work = {}, {}, []
    for r0, r1, b0, b1, s0, first_cut, last_cut, pad in meta.tolist():
        assert pad == 0
        w = 0
        for r in range(r0, r1 + 1):
            lo, hi = (b0 if r == r0 else 0), (b1 if r == r1 else blocks[r])
            split = s0 if r == r0 else 0
            for blk in range(lo, hi):
                cover[(r, blk)] = cover.get((r, blk), 0) + 1
            rows.setdefault(r, []).append(num_splits[r].item() + split)
            w += hi - lo + overhead
        if r0 <= r1:
            assert first_cut == int(num_splits[r0 + 1] - num_splits[r0] > 1)
            assert last_cut == int(num_splits[r1 + 1] - num_splits[r1] > 1)
        work.append(w)
    return blocks, cover, rows, work


lengths = st.one_of(
    st.lists(st.integers(0, 3000), min_size=1, max_size=40),
    # very skewed: one long request among short ones
    st.tuples(st.integers(5000, 40000), st.lists(st.integers(0, 70), min_size=0, max_size=30)).map(
        lambda t: t[1][: len(t[1]) // 2] + [t[0]] + t[1][len(t[1]) // 2:]),
)


@settings(max_examples=300, deadline=None)
@given(seqlens=lengths, parts=st.integers(1, 160), overhead=st.sampled_from([0, 1, 5]))
def test_schedule_covers_every_block_once_and_balances(seqlens, parts, overhead):
    meta, num_splits = schedule.schedule(seqlens, parts, overhead)
    assert meta.dtype == torch.int32 and tuple(meta.shape) == (parts, 8)
    assert num_splits.dtype == torch.int32 and tuple(num_splits.shape) == (len(seqlens) + 1,)
    blocks, cover, rows, work = _walk(meta, num_splits, seqlens, overhead)
    want = {(r, blk) for r, n in enumerate(blocks) for blk in range(n)}
    assert set(cover) == want and set(cover.values()) == {1}
    # request r's pieces sit at consecutive accumulator rows num_splits[r], num_splits[r] + 1, ...
    for r in range(len(seqlens)):
        assert rows[r] == list(range(num_splits[r].item(), num_splits[r + 1].item()))
    assert num_splits[-1].item() <= len(seqlens) + parts          # FlashMLA's accumulator rows
    # balance: the busiest partition is within one block plus the overhead of an even share
    total = sum(blocks) + overhead * len(seqlens)
    assert max(work) <= math.ceil(total / parts) + overhead
    assert sum(work) >= total                                     # cuts only add overhead
    schedule.check(meta, num_splits, seqlens)                     # the op's own validator agrees


def test_schedule_matches_flashmla_layout_by_hand():
    """Two requests of 3 and 1 blocks on 2 partitions, overhead 1: payload ceil(6 / 2) + 1 = 4;
    partition 0 takes blocks 0-2 of request 0 (3 + 1) and ends; partition 1 takes request 1."""
    meta, num_splits = schedule.schedule([130, 64], 2, overhead=1)
    assert meta.tolist() == [[0, 0, 0, 3, 0, 0, 0, 0], [1, 1, 0, 1, 0, 0, 0, 0]]
    assert num_splits.tolist() == [0, 1, 2]
    # one long request over three partitions: 10 + 1 -> payload 4 + 1; cut 4 + 4 + 2
    meta, num_splits = schedule.schedule([640], 3, overhead=1)
    assert meta.tolist() == [[0, 0, 0, 4, 0, 1, 1, 0], [0, 0, 4, 8, 1, 1, 1, 0], [0, 0, 8, 10, 2, 1, 1, 0]]
    assert num_splits.tolist() == [0, 3]


@pytest.mark.parametrize("mutate", ["end_short", "end_long", "split_row"])
def test_check_rejects_a_planted_off_by_one(mutate):
    meta, num_splits = schedule.schedule([700, 333, 5000], 8)
    cut = next(i for i, row in enumerate(meta.tolist()) if row[0] == row[1] and row[5])
    bad = meta.clone()
    bad[cut, {"end_short": 3, "end_long": 3, "split_row": 4}[mutate]] += -1 if mutate == "end_short" else 1
    with pytest.raises(ValueError):
        schedule.check(bad, num_splits, [700, 333, 5000])


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="num_sm_parts"):
        schedule.schedule([5], 0)
    with pytest.raises(ValueError, match="cache_seqlens"):
        schedule.schedule([5, -1], 2)
    with pytest.raises(ValueError, match="heads_q"):
        schedule.num_sm_parts(132, 12, heads_kv=8)
    assert schedule.num_sm_parts(132, 128) == 66 and schedule.num_sm_parts(132, 64) == 132
    assert schedule.num_sm_parts(132, 128, seq_q=2) == 33 and schedule.num_sm_parts(1, 128) == 1
    with pytest.raises(ValueError, match="block_N"):
        mla_decode_scheduled(heads=8, block_N=48, page_size=48)


GEOM = dict(heads=8, heads_kv=1, seq_q=2, dim=96, dim_v=64, page_size=16, causal=True, block_N=16, block_H=16)


def _run(backend, seqlens, parts, overhead, seed=0, arch=None, meta=None):
    params = dict(GEOM, batch=len(seqlens), seqlens=seqlens)
    q, kv, table, lens, sink, scale, out, lse = problems.make_inputs(params, seed)
    sched, num_splits = schedule.schedule(seqlens, parts, overhead) if meta is None else meta
    extra = {} if arch is None else dict(arch=arch)
    split = kernforge.compile(mla_decode_scheduled, backend=backend, **GEOM, **extra)
    combine = kernforge.compile(mla_decode_combine_scheduled, backend=backend, heads=8, seq_q=2, dim_v=64,
                                block_R=4, **extra)
    rows = len(seqlens) + parts
    o_acc = torch.full((rows, 2, 8, 64), float("nan"))
    lse_acc = torch.full((rows, 8, 2), float("nan"))
    Scheduled(split, combine)(q, kv, table, lens, sched, num_splits, sink, scale, out, lse, o_acc, lse_acc)
    want_out, want_lse = reference(q, kv.view(-1, 16, 1, 96), table, lens, sink, scale, 64, True)
    tol_out, tol_lse = problems.tolerances(q, kv, scale, max(seqlens), 64)
    return (out, lse, want_out, want_lse, tol_out, tol_lse), split


# ragged, with an empty request, a one-token one and a long one the schedule cuts 4 ways
CUT = ([37, 5, 0, 300, 1, 130], 6, 1)


@pytest.mark.parametrize("backend,arch", [("interp", None), ("cuda-emu", "sm_90a"), ("cuda-emu", "sm_80")])
def test_scheduled_kernel_matches_unsplit_reference(backend, arch):
    seqlens, parts, overhead = CUT
    meta, num_splits = schedule.schedule(seqlens, parts, overhead)
    assert (num_splits[1:] - num_splits[:-1]).max() > 1, "the case must cut a request"
    result, split = _run(backend, seqlens, parts, overhead, arch=arch)
    problems.assert_close(*result)
    if arch == "sm_90a":
        assert split.launcher.last_variant == "tma"


def test_planted_off_by_one_range_end_changes_the_result():
    """A partition that stops one block short leaves that block unread: the output moves
    beyond tolerance (the kernel trusts the schedule, the schedule's check catches it)."""
    seqlens, parts, overhead = CUT
    meta, num_splits = schedule.schedule(seqlens, parts, overhead)
    cut = next(i for i, row in enumerate(meta.tolist()) if row[5] and row[3] > 1)
    bad = meta.clone()
    bad[cut, 3] -= 1
    with pytest.raises(ValueError):
        schedule.check(bad, num_splits, seqlens)
    result, _ = _run("interp", seqlens, parts, overhead, meta=(bad, num_splits))
    with pytest.raises(AssertionError, match="differs"):
        problems.assert_close(*result)


@settings(max_examples=6, deadline=None)
@given(seqlens=st.lists(st.integers(0, 400), min_size=1, max_size=5), parts=st.integers(1, 9),
       seed=st.integers(0, 2 ** 16))
def test_property_scheduled_matches_reference_interp(seqlens, parts, seed):
    result, _ = _run("interp", seqlens, parts, 1, seed=seed)
    problems.assert_close(*result)


def test_op_records_the_schedule_and_reuses_it():
    """``get_mla_metadata`` (current FlashMLA form) gives an empty meta; the first dense call
    with ``num_sm_parts`` fills it with the balanced schedule, later calls reuse it, and the
    result equals the unsplit kernel's within tolerance."""
    seqlens = CUT[0]
    g = torch.Generator().manual_seed(3)
    kv, table = problems.make_cache(seqlens, 16, 1, 96, g)
    q = torch.randn(len(seqlens), 2, 8, 96, generator=g).bfloat16()
    lens = torch.tensor(seqlens, dtype=torch.int32)
    meta, _ = mla.get_mla_metadata()
    assert meta.tile_scheduler_metadata is None
    out, lse = mla.flash_mla_with_kvcache(q, kv, table, lens, 64, meta, causal=True, backend="interp",
                                          num_sm_parts=6)
    want_meta, want_splits = schedule.schedule(seqlens, 6)
    assert torch.equal(meta.tile_scheduler_metadata, want_meta) and torch.equal(meta.num_splits, want_splits)
    assert meta.kv_splits is None
    ref_out, ref_lse = reference(q, kv, table, lens, None, 96 ** -0.5, 64, True)
    tol_out, tol_lse = problems.tolerances(q, kv.view(-1, 96), 96 ** -0.5, max(seqlens), 64)
    problems.assert_close(out, lse, ref_out, ref_lse, tol_out, tol_lse)
    again, _ = mla.flash_mla_with_kvcache(q, kv, table, lens, 64, meta, causal=True, backend="interp")
    assert torch.equal(again, out)                    # same schedule, same launches
    with pytest.raises(ValueError, match="num_sm_parts=3"):
        mla.flash_mla_with_kvcache(q, kv, table, lens, 64, meta, causal=True, backend="interp", num_sm_parts=3)
    with pytest.raises(ValueError, match="not both"):
        mla.flash_mla_with_kvcache(q, kv, table, lens, 64, causal=True, backend="interp", num_sm_parts=3,
                                   num_kv_splits=2)
    with pytest.raises(ValueError, match="num_sm_parts"):
        mla.flash_mla_with_kvcache(q, kv, table, lens, 64, causal=True, backend="interp", num_sm_parts=0)


@pytest.mark.parametrize("heads,heads_kv,seq_q", [(128, 1, 1), (128, 1, 2), (64, 2, 1)])
def test_a_requests_row_blocks_are_adjacent_in_launch_order(heads, heads_kv, seq_q):
    """CUDA launches blockIdx.x fastest: the grid's first extent is the (latent head, row
    block) index and the partition comes from the second block variable only, so CTA
    ``part * X + x`` reads partition ``part``'s requests and the CTAs that read the same KV
    (one latent head's row blocks, both 64-head halves at h=128) have consecutive ids."""
    from kernforge.codegen import ir

    kernel = mla_decode_scheduled(heads=heads, heads_kv=heads_kv, seq_q=seq_q).ir
    row_blocks = -(-seq_q * heads // heads_kv // 64)
    assert str(kernel.grid[0]) == str(heads_kv * row_blocks) and str(kernel.grid[1]) == "num_sm_parts"
    x_var, part_var = kernel.block_vars
    meta_loads = [n for n in ir.walk(kernel.body) if isinstance(n, ir.Load)
                  and n.buffer.name == "tile_scheduler_metadata"]
    assert meta_loads and all(n.indices[0] is part_var for n in meta_loads)
    # which CTA ids read which (request, latent head, row block), over a cut schedule
    meta, num_splits = schedule.schedule([4096] * 8 + [100, 20000], 12)
    reads = {}
    for part, req, lo, hi, _row in schedule.pieces(meta, num_splits, [4096] * 8 + [100, 20000]):
        for x in range(heads_kv * row_blocks):
            reads.setdefault((part, req, x // row_blocks), []).append(part * heads_kv * row_blocks + x)
    for ids in reads.values():
        assert ids == list(range(ids[0], ids[0] + row_blocks))     # the KV's readers are neighbours
