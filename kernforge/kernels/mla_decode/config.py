"""MLA decode's compile-time configuration: the one place its tile sizes are chosen.

Every chooser returns keyword parameters of one kernel factory and is used by both
:func:`kernforge.ops.flash_mla_with_kvcache` and the catalogue's production-sized
problems (:mod:`.problems`).  They key on the language a backend generates
(:func:`kernforge.backends.lang`) or the device its buffers live on
(:func:`kernforge.backends.device`), never on backend names.
"""
from __future__ import annotations

from kernforge import backends
from kernforge.tune.consult import tuned


def _gpu(backend: str) -> bool:
    return backends.lang(backend) == "cuda"


@tuned("mla_decode")
def choose(backend: str, heads: int, heads_kv: int = 1, seq_q: int = 1, dim: int = 576, dim_v: int = 512,
           page_size: int = 64, causal: bool = False, arch: str | None = None) -> dict:
    """:func:`~kernforge.kernels.mla_decode.mla_decode` parameters.  Rows (query tokens x
    heads per KV head) fill a block of ``block_H``: GPUs want a tensor-core friendly 64;
    host backends gain nothing from padding rows, so they take the exact row count up
    to 64.  ``block_N`` divides the page.  KV tiles: host backends take whole 64-token pages
    (fewer, longer tile GEMMs).  On ``arch`` sm_90a, 64 tokens: the CUDA renderer runs the loop
    as FlashMLA's two-warpgroup seesaw (``backends/cuda/seesaw.py``), one 64-token tile per math
    warpgroup, which fits beside the 64-row d=576 Q in two stages (221 KB of the 227) because
    its softmax needs no cross-warpgroup scratch.  Other CUDA arches (and ``arch`` None, a
    configuration that builds on every arch: sm_80 allows 163 KB) take 32 tokens, which keep
    two stages of the block within the limit."""
    rows = seq_q * (heads // heads_kv)
    gpu = _gpu(backend)
    block_H = 64 if gpu else min(rows, 64)
    first = (64 if arch == "sm_90a" else 32) if gpu else 64
    block_N = next(n for n in (first, 32, 16, 8, 4, 2, 1) if page_size % n == 0)
    return dict(heads=heads, heads_kv=heads_kv, seq_q=seq_q, dim=dim, dim_v=dim_v, page_size=page_size,
                causal=causal, block_N=block_N, block_H=block_H)


@tuned("mla_decode_sparse")
def choose_sparse(backend: str, heads: int, topk: int, seq_q: int = 1, dim: int = 576, dim_v: int = 512,
                  fp8_kv: bool = False) -> dict:
    """:func:`~kernforge.kernels.mla_decode.mla_decode_sparse` parameters.  A block owns
    ``block_H`` heads of one query token (sized as the dense rows of one token); slots
    are gathered one by one, so the KV tile is free of the page size: 32 slots on GPUs, 64 on
    hosts (half the per-tile softmax and pack steps per token; h 128, topk 2048, b 4 on Zen 4:
    16.3 -> 14.1 ms together with 128-row blocks, which the dense chooser does not take)."""
    block_H = choose.heuristic(backend, heads)["block_H"]
    return dict(heads=heads, topk=topk, seq_q=seq_q, dim=dim, dim_v=dim_v, fp8_kv=fp8_kv,
                block_N=32 if _gpu(backend) else 64, block_H=block_H)


@tuned("mla_decode_combine")
def choose_combine(backend: str, heads: int, num_splits: int, seq_q: int = 1, dim_v: int = 512) -> dict:
    """:func:`~kernforge.kernels.mla_decode.mla_decode_combine` parameters.  GPU: 4 rows
    per block (ptxas on sm_90a: 8 rows took 255 registers and spilled 48 bytes at dim_v=512
    while the sink factor was evaluated per element; with it computed once per row 8 rows
    fit and 16 spill; 4 is kept, not re-timed); hosts: 16."""
    return dict(heads=heads, num_splits=num_splits, seq_q=seq_q, dim_v=dim_v,
                block_R=4 if _gpu(backend) else 16)


@tuned("mla_decode_splitkv", keys=("batch", "pages"))
def choose_splits(backend: str, config: dict, batch: int, pages: int, device=None) -> dict:
    """``config`` (:func:`choose`'s result for the call) with the split-KV factor
    ``num_splits``, for ``batch`` requests over a block table ``pages`` wide: the
    parameters of the ``mla_decode_splitkv`` catalogue entry.  A sweep of that entry is
    looked up with the tiles of ``config`` and this exact batch and table width (the
    split count depends on both, unlike the tiles); without one, :func:`split_count` on
    requests x row blocks and the table's KV tiles.  Both are known on the host, so one
    decode step picks one value for every layer, as FlashMLA's schedule."""
    rows = config["seq_q"] * (config["heads"] // config["heads_kv"])
    blocks = batch * config["heads_kv"] * -(-rows // config["block_H"])
    tiles = pages * config["page_size"] // config["block_N"]
    return dict(config, num_splits=split_count(backend, blocks, tiles, device))


def split_count(backend: str, blocks: int, max_tiles: int, device) -> int:
    """The heuristic split-KV factor: when ``blocks`` (requests x row blocks) cannot
    occupy the GPU's SMs, cut each request's KV range into a power of two of splits,
    keeping at least 4 KV tiles per split.  Backends whose buffers are not on a CUDA
    device default to 1: on the 2-core development machine two splits measured slower
    than one (docs/performance/kernels.md); ``num_kv_splits`` forces it."""
    if backends.device(backend) != "cuda":
        return 1
    import torch

    units = torch.cuda.get_device_properties(device).multi_processor_count
    splits = 1
    while blocks * splits < units and max_tiles >= 8 * splits and splits < 32:
        splits *= 2
    return splits


def scheduled_combine_params(backend: str, heads: int, seq_q: int = 1, dim_v: int = 512) -> dict:
    """:func:`~kernforge.kernels.mla_decode.scheduled.mla_decode_combine_scheduled`
    parameters: the row block :func:`choose_combine` picks for two splits, tuned or not
    (the scheduled combine's split loop runs over the accumulator in global memory, so its
    registers do not grow with the splits, and a sweep of ``mla_decode_combine`` carries
    over)."""
    block_R = choose_combine(backend, heads, 2, seq_q, dim_v)["block_R"]
    return dict(heads=heads, seq_q=seq_q, dim_v=dim_v, block_R=block_R)


def sm_parts(config: dict, device=None) -> int:
    """FlashMLA's partition count for the balanced schedule (:mod:`.schedule`): the SMs
    of ``device`` shared out among one partition's CTAs (latent heads x row blocks of
    ``config``).  Only meaningful for CUDA devices; host backends do not split by default
    (the caller passes ``num_sm_parts`` to force it)."""
    import torch

    from kernforge.kernels.mla_decode import schedule

    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return schedule.num_sm_parts(sms, config["heads"], config["heads_kv"], config["seq_q"], config["block_H"])


def host_parts(config: dict, batch: int, workers) -> int | None:
    """The balanced schedule's partition count on a host backend with ``workers`` threads,
    or None to run unsplit: only when the batch's blocks (``batch`` x latent heads x row
    blocks) leave threads idle -- batch 1 at 64 heads on 2 threads would run one block on
    one thread.  Otherwise a split only adds the combine (two splits of a batch that
    already fills the threads measured no faster on the 2-core machine)."""
    from kernforge.kernels.mla_decode import schedule

    if not workers or workers < 2:
        return None
    per_part = -(-(config["seq_q"] * config["heads"] // config["heads_kv"]) // config["block_H"]) * config["heads_kv"]
    if batch * per_part >= workers:
        return None
    return schedule.num_sm_parts(workers, config["heads"], config["heads_kv"], config["seq_q"], config["block_H"])
