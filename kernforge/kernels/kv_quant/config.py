"""The FP8 KV page kernels' compile-time configuration.

Quantisation: one row per block (a row owns its scales), so only the thread count varies
and one value serves every backend.  Dequantisation: on CUDA 4 tokens of a page per block
(V4-Flash: 4 x 512 values, 16 per thread at 128 threads); the host backends, which run a
block as one thread, decode 16 tokens per block."""
from __future__ import annotations

from kernforge import backends
from kernforge.tune.consult import tuned


@tuned("fp8_kv_quantize")
def choose_quantize(backend: str, nope: int, rope: int, dtype: str = "float32") -> dict:
    """:func:`~kernforge.kernels.kv_quant.fp8_kv_quantize` parameters."""
    return dict(nope=nope, rope=rope, dtype=dtype, threads=128)


@tuned("fp8_kv_dequantize")
def choose_dequantize(backend: str, nope: int, rope: int, block_size: int) -> dict:
    """:func:`~kernforge.kernels.kv_quant.fp8_kv_dequantize` parameters."""
    tokens = 4 if backends.lang(backend) == "cuda" else 16
    return dict(nope=nope, rope=rope, block_size=block_size, block_tokens=min(tokens, block_size), threads=128)
