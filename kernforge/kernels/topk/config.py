"""TopK's compile-time configuration: the one place its tile sizes are chosen.

:func:`choose` is what :func:`kernforge.ops.topk` compiles (``kernel_params`` there is
this function); it keys on the language a backend generates
(:func:`kernforge.backends.lang`), never on backend names.
"""
from __future__ import annotations

from typing import Optional

from kernforge import backends
from kernforge.tune.consult import tuned

#: rows of at most this many scores get the CPU's short-row configuration (below)
SHORT_ROW = 4096


def row_bucket(vocab: int) -> Optional[int]:
    """The row-length argument :func:`choose` gets for rows of ``vocab`` scores: ``SHORT_ROW``
    for short rows, ``None`` (long or unknown) otherwise, so a caller that caches the compiled
    kernel per call signature compiles at most two configurations, not one per row length."""
    return SHORT_ROW if vocab <= SHORT_ROW else None


def compaction(backend: str) -> str:
    """How survivors are appended to the buffer (both keep index order, so results are
    identical): one group at a time on a CPU, where survivors are rare; a parallel
    prefix-sum scatter for GPUs and the vectorised interpreter."""
    return "group_serial" if backends.lang(backend) == "c++" else "tile_scan"


@tuned(("topk_fp32", "topk_bf16"))  # one factory: the bucket's dtypes tell them apart
def choose(backend: str, k: int, dtype: str = "float32", index_dtype: str = "int64",
           sorted_values: bool = False, return_value: bool = True, row: Optional[int] = None) -> dict:
    """The :func:`~kernforge.kernels.topk.topk_select` parameters for one call on ``backend``.

    C++ (CPU): 1024-element tiles in groups of 16 (a survivor-free group costs one vector
    compare; a group with survivors is one 16-lane chunk of the append loop, which the
    CPU backend compresses with AVX-512), a buffer slack of ``max(2048, 2k)`` and
    chunks of 128 tiles whose group maxima set the start threshold (``prescan``), and a
    radix sort of the winners for sorted output, measured on ``benchmarks/bench_topk.py``;
    ``row`` (the longest row, or ``None``: unknown) picks, on C++ only, the short-row
    configuration for rows of at most ``SHORT_ROW`` scores (the engine's indexer: 64 to 1024
    per row): 256-element tiles, a slack of ``max(256, 2k)`` and no prescan.  The long-row
    configuration's fixed per-row cost (its 2048-element slack and the prescan's chunk
    pass) is most of a short row's time: 6.8 us against 2.0-2.6 us a row at 64-256 scores
    and k = 8, 6.0 against 3.8 us at 1024, 5.7 against 5.0 us at 4096 (Zen 4, one thread,
    CPU time, 2026-12-05); the results are identical (the compaction keeps index order).
    The interpreter (``"ir"``) gets small tiles (its cost is per statement); GPUs scan
    whole tiles with the parallel compaction."""
    lang = backends.lang(backend)
    common = dict(k=k, dtype=dtype, index_dtype=index_dtype, sorted_values=sorted_values,
                  return_value=return_value, compaction=compaction(backend))
    if lang == "ir":
        return dict(common, tile=256, group=8, slack=256)
    if lang == "c++" and row is not None and row <= SHORT_ROW:
        return dict(common, tile=256, group=16, slack=max(256, 2 * k), mask_append=False, prescan=0,
                    sort="radix")
    if lang == "c++":
        return dict(common, tile=1024, group=16, slack=max(2048, 2 * k), mask_append=False, prescan=128,
                    sort="radix")
    if lang == "ascend-c":
        # the AI Core's scalar unit runs the compaction and the sort (as on a CPU), and every
        # buffer must fit the Unified Buffer (192 KiB on 910B): group-serial appends, a radix
        # sort and a 1024-element slack keep k = 4096 float32 at 161 KiB
        return dict(common, compaction="group_serial", tile=1024, group=16, slack=1024, sort="radix")
    # GPUs: the buffers (six arrays of k + tile + slack) must fit one block's shared memory
    small = k <= 1024
    return dict(common, tile=2048 if small else 1024, group=32, slack=2048 if small else 1024)
