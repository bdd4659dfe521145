"""The indexer score kernel's compile-time configuration, keyed on the backend's language.

The host backends run a block as one thread, so their key tile only trades the launch
loop against the tile's size: 16 keys.  On CUDA a block's ``block_N x heads`` terms are
spread over its threads: 64 keys at V4-Flash's 64 heads (4096 terms, 32 per thread at 128
threads), 16 at a handful of heads (the catalogue's small sizes)."""
from __future__ import annotations

from kernforge import backends
from kernforge.tune.consult import tuned


@tuned("indexer_scores")
def choose(backend: str, heads: int, dim: int, dtype: str = "float32") -> dict:
    """:func:`~kernforge.kernels.indexer.indexer_scores` parameters."""
    common = dict(heads=heads, dim=dim, dtype=dtype)
    if backends.lang(backend) == "cuda":
        return dict(common, block_N=64 if heads >= 32 else 16, threads=128)
    return dict(common, block_N=16, threads=128)
