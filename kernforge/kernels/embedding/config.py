"""The embedding gather's compile-time configuration, keyed on the backend's language.

Host backends copy a whole row per block (up to 4096 columns); CUDA splits a row into
1024-column blocks so that one token still fills several blocks."""
from __future__ import annotations

from kernforge import backends
from kernforge.tune.consult import tuned


@tuned("embedding")
def choose(backend: str, dim: int, dtype: str = "float32", index_dtype: str = "int64") -> dict:
    common = dict(dim=dim, dtype=dtype, index_dtype=index_dtype)
    if backends.lang(backend) in ("ir", "c++"):
        return dict(common, block_cols=min(dim, 4096), threads=128)
    return dict(common, block_cols=1024, threads=128)
