"""The compressor pooling's compile-time configuration (:func:`choose`): used by
:func:`kernforge.ops.compressor_pool` and the catalogue."""
from __future__ import annotations

from kernforge.tune.consult import tuned


@tuned("compressor_pool")
def choose(backend: str, head_dim: int, ratio: int, overlap: bool, dtype: str) -> dict:
    """32 channels per block where they divide ``head_dim`` (V4: 512 and 128; tiny(): 96 and
    64), else the largest power of two that does: a ``[candidates, 32]`` float32 tile (8 x 32
    at ratio 4, 128 x 32 at ratio 128) per operand, one warp's worth of columns."""
    block_d = next(b for b in (32, 16, 8, 4, 2, 1) if head_dim % b == 0)
    candidates = 2 * ratio if overlap else ratio
    return dict(head_dim=head_dim, ratio=ratio, overlap=overlap, dtype=dtype, block_d=block_d,
                threads=128 if candidates >= 64 else 64)
