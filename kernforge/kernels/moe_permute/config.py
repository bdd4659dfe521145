"""MoE permutation's compile-time configuration: the one place its tile sizes are chosen.

Used by :mod:`kernforge.ops.moe` and the catalogue's problems alike; keys on the language
a backend generates (:func:`kernforge.backends.lang`), never on backend names.
"""
from __future__ import annotations

from kernforge import backends
from kernforge.tune.consult import tuned
from kernforge.kernels.moe_permute.kernel import DEFAULT_CHUNK


def num_chunks(num_slots: int, chunk: int = DEFAULT_CHUNK) -> int:
    """Chunks the mapping kernels split ``T * k`` slots into (at least one, so an empty
    routing still gets its zero-length segments written)."""
    return max(1, -(-num_slots // chunk))


@tuned("moe_mapping_scan")
def choose_mapping(backend: str, num_topk: int, num_experts: int, alignment: int) -> dict:
    """:func:`~kernforge.kernels.moe_permute.moe_mapping_scan` parameters; its ``chunk``
    is the scatter's too (:func:`choose_scatter`).  256-slot chunks everywhere: the
    scan's serial loop over chunks and the scatter's serial walk inside one are then both
    short at V4 sizes (4096 tokens x 6 = 96 chunks); the interpreter takes 64 (its cost is
    per statement, and tests route few tokens)."""
    chunk = 64 if backends.lang(backend) == "ir" else DEFAULT_CHUNK
    return dict(num_topk=num_topk, num_experts=num_experts, alignment=alignment, chunk=chunk)


@tuned("moe_mapping_scatter", pinned=("chunk",))
def choose_scatter(backend: str, num_topk: int, num_experts: int, alignment: int, chunk: int) -> dict:
    """:func:`~kernforge.kernels.moe_permute.moe_mapping_scatter` parameters for the scan
    that ran with ``chunk`` slots per chunk: the scatter reads the scan's per-chunk
    offsets, so ``chunk`` is pinned and the database's fastest row at that chunk supplies
    the rest (``tail_tile``).  1024-row tail tiles: the rows past the last segment are
    the worst-case buffer's slack (the padding not needed, plus the ``-1`` slots), which
    a few such blocks clear."""
    return dict(num_topk=num_topk, num_experts=num_experts, alignment=alignment, chunk=chunk, tail_tile=1024)


def _block(backend: str, hidden: int) -> int:
    """Columns moved per step: a whole V4 row (up to 4096) at once on GPUs and CPUs
    (one fragment, no loop), 256 on the interpreter."""
    if backends.lang(backend) == "ir":
        return 256
    return min(hidden, 4096)


@tuned("expand_to_fused")
def choose_expand(backend: str, hidden: int, num_topk: int, dtype: str, sf_cols: int = 0,
                  sf_dtype: str = "float32", sf_col_major: bool = False) -> dict:
    """:func:`~kernforge.kernels.moe_permute.expand_to_fused` parameters."""
    return dict(hidden=hidden, num_topk=num_topk, dtype=dtype, sf_cols=sf_cols, sf_dtype=sf_dtype,
                sf_col_major=sf_col_major, block=_block(backend, hidden))


#: ``reduce_fused``'s columns per step on a host (C++): 128 (half a KB of bf16 per row)
HOST_REDUCE_BLOCK = 128


@tuned("reduce_fused")
def choose_reduce(backend: str, hidden: int, num_topk: int, dtype: str, out_dtype: str,
                  with_weights: bool, with_x_sf: bool, with_sf: bool) -> dict:
    """:func:`~kernforge.kernels.moe_permute.reduce_fused` parameters.  On a host the
    block's column loop is outside its slot loop, so narrow steps walk a token's ``k`` rows
    side by side: ``k`` streams the prefetchers follow at once instead of one row after
    another, each starting cold on its own page.  128 columns ran 1.8x faster than whole
    2048-column rows at T = 4096, k = 6 (7.7 vs 13.7 ms, Zen 4, 1 thread), same bits: each
    element still adds its terms in slot order."""
    block = HOST_REDUCE_BLOCK if backends.lang(backend) == "c++" else _block(backend, hidden)
    return dict(hidden=hidden, num_topk=num_topk, dtype=dtype, out_dtype=out_dtype, with_weights=with_weights,
                with_x_sf=with_x_sf, with_sf=with_sf, block=min(block, hidden))
