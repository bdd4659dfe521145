"""The indexer score kernel's compile-time configuration, keyed on the backend's language.

Host backends: a block is one thread running ``heads`` GEMMs of ``block_S x dim x block_N``
on the GEMM micro-kernel, so ``block_S`` follows the call's query count (``rows``): 32
queries by 64 keys for a prefill slice (128 queries by 256 keys, 4 heads of 64 dims:
0.20 ms against 0.80 ms at one query a block, and 2.3 ms for the former tree-summed
kernel; Zen 4, one thread, 2026-12-05), 8 for a handful and 1 for a decode row, where
padded query rows would be pure waste (1 query by 1024 keys: 33 us at 1, 205 us at 32).
On CUDA a block keeps one query's ``block_N`` scores in registers (the float32 ``T.gemm``
is a scalar loop there): 64 keys at V4-Flash's 64 heads, 16 at a handful of heads (the
catalogue's small sizes)."""
from __future__ import annotations

from typing import Optional

from kernforge import backends
from kernforge.tune.consult import tuned


def row_block(rows: Optional[int]) -> int:
    """The host ``block_S`` for a call of ``rows`` queries (``None``: unknown, a prefill)."""
    if rows is None or rows >= 32:
        return 32
    return 8 if rows >= 8 else 1


@tuned("indexer_scores")
def choose(backend: str, heads: int, dim: int, dtype: str = "float32", rows: Optional[int] = None) -> dict:
    """:func:`~kernforge.kernels.indexer.indexer_scores` parameters for calls of ``rows`` queries."""
    common = dict(heads=heads, dim=dim, dtype=dtype)
    if backends.lang(backend) == "cuda":
        return dict(common, block_S=1, block_N=64 if heads >= 32 else 16, threads=128)
    return dict(common, block_S=row_block(rows), block_N=64, threads=128)
