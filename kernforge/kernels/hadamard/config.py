"""The Hadamard transform's compile-time configuration, keyed on the backend's language.

Rows are short (128 in V4-Flash), so a block takes several: 16 for the interpreter and
the CPU (per-statement and per-block costs), 4 on CUDA (two 4 x 128 float32 tiles of
shared memory, 4 KiB)."""
from __future__ import annotations

from kernforge import backends
from kernforge.tune.consult import tuned


@tuned("hadamard")
def choose(backend: str, n: int, dtype: str = "float32") -> dict:
    if backends.lang(backend) in ("ir", "c++"):
        return dict(n=n, dtype=dtype, block_rows=16, threads=64)
    return dict(n=n, dtype=dtype, block_rows=4, threads=128)
