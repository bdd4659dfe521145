"""RMSNorm's compile-time configuration, keyed on the backend's language (never its name).

The interpreter's cost is per statement, so it takes many rows per block; the CPU runs
blocks under OpenMP and vectorises a row, so a few rows per block amortise the launch
loop; on CUDA one row per block keeps a 4096-wide row in registers (32 floats a thread
at 128 threads, 256 threads above 2048 columns)."""
from __future__ import annotations

from typing import Optional

from kernforge import backends
from kernforge.tune.consult import tuned


@tuned("rms_norm")
def choose(backend: str, dim: int, dtype: str = "float32", weight_dtype: Optional[str] = "float32",
           out_dtype: Optional[str] = None) -> dict:
    common = dict(dim=dim, dtype=dtype, weight_dtype=weight_dtype, out_dtype=out_dtype or dtype)
    lang = backends.lang(backend)
    if lang == "ir":
        return dict(common, block_rows=8, threads=128)
    if lang == "c++":
        return dict(common, block_rows=4, threads=128)
    return dict(common, block_rows=1, threads=256 if dim > 2048 else 128)
