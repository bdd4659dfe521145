"""Grouped GEMM's compile-time configuration: the one place its tile sizes are chosen.

The choosers return keyword parameters of one kernel factory and are used by both
:mod:`kernforge.ops.grouped_gemm` and the catalogue's production-sized problems
(:mod:`.problems`).  They key on the language a backend generates
(:func:`kernforge.backends.lang`), never on backend names.  Each is wrapped in
:func:`kernforge.tune.consult.tuned`: a configuration tuned for the call wins.
"""
from __future__ import annotations

from typing import Optional

from kernforge import backends
from kernforge.kernels.gemm.config import block_scaled
from kernforge.tune.consult import tuned


def _gpu(backend: str) -> bool:
    return backends.lang(backend) == "cuda"


#: GPUs run the grouped GEMMs (bf16, fp8, FP8 x FP4) persistent (``persistent``: one CTA per SM
#: looping over the tiles, :mod:`kernforge.backends.cuda.persistent`) in L2 groups of 16 row tiles
#: per N tile, DeepGEMM's ``kNum1DBlocksPerGroup`` for its large shapes: 16 CTAs running together
#: share one B tile (an expert's weights) and read 16 A row tiles, each reused across the N tiles
L2_GROUP = 16


def block_m(alignment: int) -> int:
    """Rows per tile: the largest power of two up to 128 dividing the layout alignment,
    so a tile never spans two experts."""
    return next(bm for bm in (128, 64, 32, 16, 8, 4, 2, 1) if alignment % bm == 0)


def _within_expert(config: dict) -> bool:
    """A row tile must not span two experts whatever the layout (a sweep verified one)."""
    return config["alignment"] % config["block_M"] == 0


@tuned("m_grouped_gemm_nt_contiguous", keys=("alignment",), valid=_within_expert)
def choose(backend: str, num_groups: int, N: int, K: int, alignment: int = 128) -> dict:
    """:func:`~kernforge.kernels.grouped_gemm.m_grouped_gemm_nt_contiguous` parameters.
    GPUs use 128x128 output tiles with 64-deep K steps (three stages fit Hopper shared
    memory) and the persistent tile loop (:data:`L2_GROUP`); the CPU 128x128 tiles with 512-deep
    K steps, a 16-row ladder (``row_step``: padding rows cost little) and two row tiles a block
    (``row_tiles``: the B tile is packed once per 256 rows of one expert), other host
    backends 128x128x256 tiles (64 rows for 16+ groups).  A configuration tuned for this shape
    (``kernforge tune``) takes precedence over both, as for every chooser here."""
    cfg = _heuristic(backend, num_groups, N, K, alignment)
    if _gpu(backend):
        # clusters of 2 adjacent N tiles share each A tile by TMA multicast where the shape allows
        # (kernforge.backends.cuda.cluster; sm_90a's warp-specialized ring; nothing timed yet)
        from kernforge.backends.cuda.cluster import config_request

        cfg.update(config_request(-(-N // cfg["block_N"]), cfg["block_M"], cfg["block_K"] * 2))
    return cfg


def _splits(N: int, threads: int) -> int:
    """``n_splits`` for a CPU team of ``threads``: one run of N tiles per thread when they divide the
    128-column tiles (:func:`~kernforge.kernels.grouped_gemm.kernel._grid`), else one run.  Busiest
    thread's CPU time per call at 2 threads, masked G 4 x [200, 9, 128, 0], N = K = 2048: 10.4 ->
    8.5 ms (torch's loop 8.6).  The masked op passes its team only for a skewed ``masked_m``; the
    contiguous chooser keeps one run (there the runs cost 10% of locality, what they gained)."""
    return threads if threads > 1 and -(-N // 128) % threads == 0 else 1


def _heuristic(backend: str, num_groups: int, N: int, K: int, alignment: int, threads: int = 1) -> dict:
    rows = block_m(alignment)
    if _gpu(backend):
        return dict(num_groups=num_groups, N=N, K=K, block_M=rows, block_N=128, num_stages=3, block_K=64,
                    persistent=L2_GROUP)
    if backends.lang(backend) == "c++":
        # the CPU: a tile multiplies only its rows up to the last expert row, in steps of 16 rows
        # (``row_step``), so a ragged expert's padding costs < 16 rows of work while the B tile is
        # packed once per 128 rows; 512-deep K steps halve the float32 C tile's reads and writes
        # (G 4 x 256 rows, N = K = 4096: 182 against 186-190 ms with 256-deep ones).
        # Zen 4, avx512bf16, one thread, against torch's per-expert loop: G 32 x 0-130 rows, N = K =
        # 1024: 0.66x (64-row tiles) -> 0.84x (32-row steps) -> 0.99x (16); G 4 x 0-512 rows, N = K =
        # 2048: 0.77x -> 0.92x.  Two row tiles a block (``row_tiles``): an expert's rows across both
        # share one B packing per K step (G 4 x 256 rows, N = K = 4096: 177 -> 169 ms; with A read in
        # place by the GEMM (passes.gemm_layout's guarded pairs) 160 ms, torch's loop 160-165)
        return dict(num_groups=num_groups, N=N, K=K, block_M=rows, block_N=128, num_stages=1, block_K=512,
                    row_step=min(rows, 16), row_tiles=2, n_splits=_splits(N, threads))
    if num_groups >= 16:
        # other hosts compute every row a tile holds: at G 32 with 0-130 rows per expert (1228 rows in
        # 3584 aligned ones), 64-row tiles ran 1.55x faster than 128-row ones (Zen 4, avx512bf16, 1
        # thread, before the CPU's row ladder); with 128 full rows per expert (G 8) they cost 10%
        rows = min(rows, 64)
    return dict(num_groups=num_groups, N=N, K=K, block_M=rows, block_N=128, num_stages=1, block_K=256)


def _fp8_tiles(backend: str, num_groups: int, N: int, K: int, alignment: int = 128) -> dict:
    """The FP8 grouped GEMMs' tiles (FP8 x FP8 and FP8 x FP4): as :func:`choose`'s, but 128 deep
    (one scale block) by construction, and GPUs run 256 threads (two 128x128 float32 fragments:
    128 threads spill, ptxas: 2.7 KB)."""
    gpu = _gpu(backend)
    cfg = dict(num_groups=num_groups, N=N, K=K, block_M=block_m(alignment), block_N=128,
               num_stages=3 if gpu else 1)
    if gpu:
        cfg.update(threads=256, persistent=L2_GROUP)
    return cfg


def _fp8_cluster(backend: str, cfg: dict) -> dict:
    """``cfg`` with ``cluster=2`` where, as in :func:`choose`, 2 adjacent N tiles can share each
    e4m3 A tile (128 one-byte columns a row) by TMA multicast.  FP8 x FP8 only: the FP8 x FP4
    kernels widen A to bf16 in shared memory, so no TMA ring holds it."""
    if not _gpu(backend):
        return cfg
    from kernforge.backends.cuda.cluster import config_request  # as choose's clusters

    return dict(cfg, **config_request(-(-cfg["N"] // cfg["block_N"]), cfg["block_M"], 128))


@tuned("m_grouped_fp8_gemm_nt_contiguous", keys=("alignment",), valid=_within_expert)
def choose_fp8(backend: str, num_groups: int, N: int, K: int, alignment: int = 128, **variant) -> dict:
    """:func:`~kernforge.kernels.grouped_gemm.m_grouped_fp8_gemm_nt_contiguous` parameters:
    :func:`_fp8_tiles`, clustered on GPUs where the shape allows (:func:`_fp8_cluster`).  The row
    tile is the alignment's (a tile never spans two experts), so sm_100a's block-scaled MMAs
    (``M = 128``) take DeepGEMM's default 128 whatever the arch.  ``variant`` (``sf_format``,
    ``gran_n``): passed through."""
    return dict(_fp8_cluster(backend, _fp8_tiles(backend, num_groups, N, K, alignment)), **variant)


#: :func:`~kernforge.kernels.grouped_gemm.kernel.m_grouped_fp8_fp4_gemm_nt_contiguous`: the fp8 tiles
choose_fp8_fp4 = tuned("m_grouped_fp8_fp4_gemm_nt_contiguous", keys=("alignment",),
                       valid=_within_expert)(_fp8_tiles)


@tuned("m_grouped_gemm_nt_masked")
def choose_masked(backend: str, num_groups: int, N: int, K: int, expected_m: int, threads: int = 1) -> dict:
    """:func:`~kernforge.kernels.grouped_gemm.m_grouped_gemm_nt_masked` parameters: the
    contiguous tiles, with a row tile sized by ``expected_m`` (typical rows per group).  On the
    CPU 64 or 256 rows with the contiguous kernel's row ladder, and the N tiles in one run per thread
    of ``threads`` (``n_splits``, :func:`_splits`).  Other host tiles compute every
    row they hold, and a group's last tile is partly past ``masked_m``, so they are smaller:
    16 rows up to 32 expected, 32 up to 128, else 64 (Zen 4, avx512bf16, one
    thread, against torch's per-group loop: G 8 x 0-64 rows, N = K = 1024: 0.48x with 128-row
    tiles, 0.85x with 64, 0.97x with 16; G 4 x 0-200 rows, N = K = 2048: 0.68x / 0.70x / 0.71x
    with 128 / 64 / 32)."""
    if _gpu(backend):
        from kernforge.backends.cuda.cluster import config_request  # as choose's clusters

        rows = 64 if expected_m <= 64 else 128
        return dict(_heuristic(backend, num_groups, N, K, 128), block_M=rows,
                    **config_request(-(-N // 128), rows, 64 * 2))
    elif backends.lang(backend) == "c++":
        # the row ladder (as in :func:`choose`) bounds the rows past ``masked_m`` instead: G 8 x 0-64
        # rows, N = K = 1024: 0.97x -> 1.1x; G 4 x 0-200, N = K = 2048: 0.71x -> 0.94x
        # 256 rows past 64 expected: a group's B tile is packed once for up to 256 of its rows (G 4 x
        # 0-200 rows, N = K = 2048: 0.94x -> 0.96x against 128-row tiles)
        cfg = dict(_heuristic(backend, num_groups, N, K, 128, threads), block_M=64 if expected_m <= 64 else 256)
        del cfg["row_tiles"]  # a masked tile never spans groups: the contiguous layout's concern only
        return cfg
    else:
        rows = 16 if expected_m <= 32 else 32 if expected_m <= 128 else 64
    return dict(_heuristic(backend, num_groups, N, K, 128), block_M=rows)


def _fp8_masked_tiles(backend: str, num_groups: int, N: int, K: int, expected_m: int) -> dict:
    """The FP8 masked GEMMs' tiles (FP8 x FP8 and FP8 x FP4): :func:`_fp8_tiles` with the row
    tile sized by ``expected_m``, as :func:`choose_masked`."""
    return dict(_fp8_tiles(backend, num_groups, N, K, 128), block_M=64 if expected_m <= 64 else 128)


@tuned("m_grouped_fp8_gemm_nt_masked")
def choose_fp8_masked(backend: str, num_groups: int, N: int, K: int, expected_m: int, arch: Optional[str] = None,
                      **variant) -> dict:
    """:func:`~kernforge.kernels.grouped_gemm.kernel.m_grouped_fp8_gemm_nt_masked` parameters:
    :func:`_fp8_masked_tiles`, clustered on GPUs where the shape allows (:func:`_fp8_cluster`);
    128-row tiles whatever ``expected_m`` where ``arch`` folds the UE8M0 scales of ``variant``
    into block-scaled MMAs, which are ``M = 128`` only (``kernels.gemm.config.block_scaled``).
    ``variant`` (``sf_format``, ``gran_n``): passed through."""
    cfg = _fp8_masked_tiles(backend, num_groups, N, K, expected_m)
    if _gpu(backend) and block_scaled(arch, variant):
        cfg["block_M"] = 128
    return dict(_fp8_cluster(backend, cfg), **variant)


#: :func:`~kernforge.kernels.grouped_gemm.kernel.m_grouped_fp8_fp4_gemm_nt_masked`: the fp8 tiles
choose_fp8_fp4_masked = tuned("m_grouped_fp8_fp4_gemm_nt_masked")(_fp8_masked_tiles)

