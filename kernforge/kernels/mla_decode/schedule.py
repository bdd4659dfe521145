"""FlashMLA's balanced split-KV schedule for dense decode, computed on the host.

A uniform split count gives every request the same number of splits whatever its
length, so in a ragged batch the long requests' blocks finish last while the SMs that
held short ones idle.  FlashMLA instead cuts the *whole batch's* KV blocks into
``num_sm_parts`` partitions of about equal work and lets one CTA (per row block) walk
its partition's (request, block) range; a request that straddles partitions is
split, and only such requests go through the combine.

Work is counted in FlashMLA's blocks of :data:`BLOCK` (64) tokens: a request of length
``n`` costs ``max(ceil(n / 64), 1)`` blocks (a request of length 0 still writes its
output, 0 with lse ``+inf``) plus a fixed :data:`OVERHEAD` of 5 blocks (its Q load,
epilogue and, if split, the combine).  Each partition is given ``ceil(total /
num_sm_parts) + OVERHEAD`` and requests are packed greedily in order, exactly as
FlashMLA's ``get_mla_metadata`` kernel does (``flashmla-decode.md`` section 4).

Output, FlashMLA's layout: ``tile_scheduler_metadata int32 [num_sm_parts, 8]``, per
partition ``{begin_req, end_req (both inclusive), begin_block, end_block (exclusive,
in end_req), begin_split (the split index of begin_req that this partition computes),
is_first_req_splitted, is_last_req_splitted, 0}``; a partition left with no work has
``begin_req = batch > end_req``.  ``num_splits int32 [batch + 1]``: the prefix sums of
the splits per request, so request ``i``'s partials sit at rows ``num_splits[i] ..
num_splits[i+1] - 1`` of a ``[batch + num_sm_parts, ...]`` accumulator.
"""
from __future__ import annotations

import torch

BLOCK = 64           # tokens per scheduling block (FlashMLA's page and KV tile)
OVERHEAD = 5         # fixed cost per request (and per split piece), in blocks
FIELDS = 8           # int32 per partition (FlashMLA's TileSchedulerMetaDataSize)


def num_sm_parts(num_sms: int, heads_q: int, heads_kv: int = 1, seq_q: int = 1, block_H: int = 64) -> int:
    """FlashMLA's dense partition count: the SMs shared out among the CTAs one partition
    needs (``heads_kv`` latent heads x row blocks of ``block_H`` query rows), at least 1."""
    for name, v in (("num_sms", num_sms), ("heads_q", heads_q), ("heads_kv", heads_kv), ("seq_q", seq_q),
                    ("block_H", block_H)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if heads_q % heads_kv:
        raise ValueError(f"heads_q ({heads_q}) must be a multiple of heads_kv ({heads_kv})")
    row_blocks = -(-(seq_q * heads_q // heads_kv) // block_H)
    return max(num_sms // heads_kv // row_blocks, 1)


def request_blocks(seqlens: list[int]) -> list[int]:
    """Blocks of work per request: ``max(ceil(len / BLOCK), 1)``."""
    return [max(-(-n // BLOCK), 1) for n in seqlens]


def schedule(cache_seqlens, parts: int, overhead: int = OVERHEAD) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tile_scheduler_metadata int32 [parts, 8], num_splits int32 [b + 1])`` for the
    lengths ``cache_seqlens`` (a tensor or a list of non-negative ints), on the CPU.
    The caller moves them to the kernel's device."""
    lens = cache_seqlens.tolist() if isinstance(cache_seqlens, torch.Tensor) else list(cache_seqlens)
    if isinstance(parts, bool) or not isinstance(parts, int) or parts < 1:
        raise ValueError(f"num_sm_parts must be a positive int, got {parts!r}")
    if any(n < 0 for n in lens):
        raise ValueError(f"cache_seqlens must be non-negative, got {lens}")
    blocks = request_blocks(lens)
    b = len(blocks)
    payload = -(-(sum(blocks) + overhead * b) // parts) + overhead
    meta = [[0] * FIELDS for _ in range(parts)]
    splits = [0] * (b + 1)
    req = block = split = cum = 0
    for p in range(parts):
        begin = (req, block, split)
        remain = payload
        while req < b:
            left = blocks[req] - block
            if remain >= left + overhead:          # the rest of the request fits: it ends here
                cum += split + 1
                splits[req + 1] = cum
                remain -= left + overhead
                req, block, split = req + 1, 0, 0
            else:                                  # cut it: this partition takes what it can
                if remain - overhead > 0:
                    block += remain - overhead
                    split += 1
                break
        end_req, end_block = (req, block) if block > 0 else (req - 1, blocks[req - 1] if req > 0 else 0)
        meta[p][:5] = [begin[0], end_req, begin[1], end_block, begin[2]]
    for row in meta:
        if row[0] <= row[1]:
            row[5] = int(splits[row[0] + 1] - splits[row[0]] > 1)
            row[6] = int(splits[row[1] + 1] - splits[row[1]] > 1)
    return torch.tensor(meta, dtype=torch.int32), torch.tensor(splits, dtype=torch.int32)


def pieces(meta: torch.Tensor, num_splits: torch.Tensor, seqlens: list[int]):
    """The work the schedule hands out, as ``(partition, request, begin_block,
    end_block, accumulator_row)`` tuples in partition order: what one partition's CTA
    computes for one request.  ``accumulator_row`` is ``num_splits[req] + split`` (the
    row of the float32 partials; meaningful only for a request with several splits).
    Used by :func:`check` and the tests; the kernel walks the same ranges."""
    blocks = request_blocks(seqlens)
    splits = num_splits.tolist()
    out = []
    for p, (r0, r1, b0, b1, s0, *_rest) in enumerate(meta.tolist()):
        for r in range(r0, r1 + 1):
            lo = b0 if r == r0 else 0
            hi = b1 if r == r1 else blocks[r]
            out.append((p, r, lo, hi, splits[r] + (s0 if r == r0 else 0)))
    return out


def check(meta: torch.Tensor, num_splits: torch.Tensor, seqlens: list[int]) -> None:
    """Raise ``ValueError`` unless the schedule covers every request's blocks exactly
    once, in order, each split at its own accumulator row and within the request's
    prefix-sum range (what the kernel and the combine rely on: a gap leaves a block
    unread, an overlap counts it twice, a wrong row overwrites another split)."""
    blocks = request_blocks(seqlens)
    b = len(blocks)
    if meta.dtype != torch.int32 or meta.dim() != 2 or meta.shape[1] != FIELDS or meta.shape[0] < 1:
        raise ValueError(f"tile_scheduler_metadata must be int32 [num_sm_parts, {FIELDS}], got "
                         f"{meta.dtype} {tuple(meta.shape)}")
    if num_splits.dtype != torch.int32 or tuple(num_splits.shape) != (b + 1,):
        raise ValueError(f"num_splits must be int32 [{b + 1}], got {num_splits.dtype} {tuple(num_splits.shape)}")
    splits = num_splits.tolist()
    if splits[0] != 0 or any(splits[i + 1] <= splits[i] for i in range(b)) or splits[-1] > b + meta.shape[0]:
        raise ValueError(f"num_splits must be increasing prefix sums from 0 to at most batch + num_sm_parts, "
                         f"got {splits}")
    for r0, r1, b0, b1, *_ in meta.tolist():
        if r0 <= r1 and not (0 <= r0 < b and r1 < b and 0 <= b0 < blocks[r0] and 0 < b1 <= blocks[r1]):
            raise ValueError(f"tile_scheduler_metadata row {[r0, r1, b0, b1]} is out of range for "
                             f"{b} requests of {blocks} blocks")
    nxt = [0] * b                       # next uncovered block of each request
    seen = [0] * b                      # pieces seen per request
    for _p, r, lo, hi, row in pieces(meta, num_splits, seqlens):
        if lo != nxt[r] or hi <= lo:
            raise ValueError(f"request {r}: blocks [{lo}, {hi}) do not continue its coverage at {nxt[r]}")
        if row != splits[r] + seen[r]:
            raise ValueError(f"request {r}: split {seen[r]} is written at accumulator row {row}, "
                             f"not {splits[r] + seen[r]}")
        nxt[r], seen[r] = hi, seen[r] + 1
    for r in range(b):
        if nxt[r] != blocks[r] or seen[r] != splits[r + 1] - splits[r]:
            raise ValueError(f"request {r}: covered {nxt[r]} of {blocks[r]} blocks in {seen[r]} pieces, "
                             f"num_splits says {splits[r + 1] - splits[r]}")
