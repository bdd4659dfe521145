"""RoPE's compile-time configuration, keyed on the backend's language.

A block reads its token's cos/sin rows once for ``block_heads`` heads: the interpreter
and the CPU take all of a V4 layer's heads a few at a time (16), CUDA four heads per
block so that 64 query heads still spread over 16 blocks per token."""
from __future__ import annotations

from kernforge import backends
from kernforge.tune.consult import tuned


@tuned("rotary_embedding")
def choose(backend: str, head_dim: int, rope_dim: int, dtype: str = "float32", position_dtype: str = "int64",
           inverse: bool = False) -> dict:
    common = dict(head_dim=head_dim, rope_dim=rope_dim, dtype=dtype, position_dtype=position_dtype,
                  inverse=inverse)
    if backends.lang(backend) in ("ir", "c++"):
        return dict(common, block_heads=16, threads=64)
    return dict(common, block_heads=4, threads=64)
