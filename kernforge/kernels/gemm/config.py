"""Dense block-scaled GEMM's compile-time configuration: the one place its tiles are chosen.

Used by :mod:`kernforge.ops.gemm` and the catalogue's production-sized problems alike;
keyed on the language a backend generates (:func:`kernforge.backends.lang`).  Not tuned:
correctness first (the CPU GEMM lowering is being rewritten; its tiles follow then).
"""
from __future__ import annotations

from kernforge import backends


def choose(backend: str, N: int, K: int, m: int, **variant) -> dict:
    """:func:`~kernforge.kernels.gemm.fp8_gemm` and ``fp8_fp4_gemm`` parameters for ``m``
    rows (the same tiles: the FP4 kernel's 32-deep steps need less shared memory).  GPUs
    take 128x128 tiles with 256 threads (two float32 128x128 fragments: 128 threads would
    spill, as in the grouped fp8 kernel) and three stages, 64-row tiles when ``m <= 64``
    (decode: fewer wasted rows) or when accumulating (reading ``D`` in the epilogue costs
    registers: at 128x128, sm_100a's mma.sync build spills, ptxas: 104 B of stack); host
    backends 64x128 tiles in one stage.  ``variant``: majors, ``gran_n``, ``accumulate``,
    ``out_dtype``, passed through (the FP4 kernel takes ``accumulate``/``out_dtype`` only)."""
    if backends.lang(backend) == "cuda":
        cfg = dict(block_M=64 if m <= 64 or variant.get("accumulate") else 128, block_N=128, num_stages=3,
                   threads=256)
    else:
        cfg = dict(block_M=64, block_N=128, num_stages=1)
    return dict(N=N, K=K, **cfg, **variant)
