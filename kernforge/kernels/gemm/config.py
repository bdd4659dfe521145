"""Dense block-scaled GEMM's compile-time configuration: the one place its tiles are chosen.

Used by :mod:`kernforge.ops.gemm` and the catalogue's production-sized problems alike;
keyed on the language a backend generates (:func:`kernforge.backends.lang`); a configuration
tuned for the call (``kernforge tune``) wins (:func:`kernforge.tune.consult.tuned`).
"""
from __future__ import annotations

from kernforge import backends
from kernforge.tune.consult import tuned


def _fp8_kernel(config: dict) -> str:
    """One chooser serves both scaled GEMMs: only the FP8 x FP8 kernel takes majors and ``gran_n``."""
    return "fp8_gemm_nt" if "gran_n" in config or "a_major" in config else "fp8_fp4_gemm_nt"


@tuned(_fp8_kernel)
def choose(backend: str, N: int, K: int, m: int, **variant) -> dict:
    """:func:`~kernforge.kernels.gemm.fp8_gemm` and ``fp8_fp4_gemm`` parameters for ``m``
    rows (the same tiles: the FP4 kernel's 32-deep steps need less shared memory).  GPUs
    take 128x128 tiles with 256 threads (two float32 128x128 fragments: 128 threads would
    spill, as in the grouped fp8 kernel) and three stages, 64-row tiles when ``m <= 64``
    (decode: fewer wasted rows) or when accumulating (reading ``D`` in the epilogue costs
    registers: at 128x128, sm_100a's mma.sync build spills, ptxas: 104 B of stack); the CPU
    backend 256x128 tiles (a decode batch: :func:`_rows`, up to 128 rows: 128), other host
    backends 64x128, in one stage.  ``variant``: majors, ``gran_n``, ``accumulate``,
    ``out_dtype``, passed through (the FP4 kernel takes ``accumulate``/``out_dtype`` only)."""
    if backends.lang(backend) == "cuda":
        cfg = dict(block_M=64 if m <= 64 or variant.get("accumulate") else 128, block_N=128, num_stages=3,
                   threads=256)
    elif backends.lang(backend) == "c++":
        # a decode batch's power of two, else tall tiles: each K step converts the 128 x 128 B tile
        # to bf16 and packs it for the micro-kernel once per row tile (Zen 4, avx512bf16, one
        # thread, 512 x 2048^2: 34 / 31 / 28 ms with 64 / 128 / 256 rows)
        cfg = dict(block_M=_rows(m) if m <= 64 else 128 if m <= 128 else 256, block_N=128, num_stages=1)
    else:
        cfg = dict(block_M=64, block_N=128, num_stages=1)
    return dict(N=N, K=K, **cfg, **variant)


@tuned(("bf16_gemm_nt", "fp32_gemm_nt"))  # one factory: the bucket's dtype tells them apart
def choose_dense(backend: str, N: int, K: int, m: int, **variant) -> dict:
    """:func:`~kernforge.kernels.gemm.dense_gemm` parameters.  GPUs: bf16 as :func:`choose`,
    with 64-deep K tiles; float32 64x128x32 (sm_90a ptxas: 64x64x64 at 128 threads and
    128x128x32 spill).  Host backends: 64x64x64 tiles in one stage; at decode (``m <= 16``)
    the row tile is the smallest power of two holding ``m`` (the micro-kernel computes every
    row of its tile, so a 16-row tile at M = 1 does 16x the work): on Zen 3 (AVX2, one
    thread, float32, MN-major B) 2-3 against 16-57 us at M = 1, N 64-128, K 128-192, and
    28-40 against 45-65 us at M = 8, N 128-384.  Measured on Zen 4 at float32, M 37..2048,
    N 128..512, K 128..264: 64x64x64 was the fastest of block_N 64/128 x block_K 64/128/256.
    bf16 on a host takes larger tiles, 128 columns and 256-512 deep (the AVX512-BF16 micro-kernel
    packs a K-major B per call, and each K step reads and writes the float32 C tile), with
    256-row tiles above 128 rows: against torch (oneDNN, AVX512-BF16) on Zen 4 at one thread,
    nt layout, M = 1 / 8 / 64 x 4096^2 went 0.56 / 0.47 / 0.68x -> 1.22 / 1.02 / 0.97x and
    1024^3 0.81 -> 0.95x.
    The CPU micro-kernel sums each output's K products in one order whatever the tile, so a
    row's bits do not depend on ``m`` (the engine's deterministic mode relies on it; tested).
    ``variant``: majors, ``accumulate``, ``dtype``, ``out_dtype``, passed through."""
    if backends.lang(backend) == "cuda" and variant.get("dtype") == "float32":
        # no tensor cores for float32: FMA tiles, 64x128x32 (128x128 or 64-deep K spill, ptxas)
        cfg = dict(block_M=64, block_N=128, block_K=32, num_stages=3, threads=256)
    elif backends.lang(backend) == "cuda":
        cfg = dict(block_M=64 if m <= 64 or variant.get("accumulate") else 128, block_N=128, block_K=64,
                   num_stages=3, threads=256)
        cfg.update(_cluster(N, cfg, variant))
    elif variant.get("dtype", "bfloat16") == "bfloat16":
        cfg = dict(block_M=_rows(m) if m <= 64 else 128 if m <= 128 else 256, block_N=128,
                   block_K=512 if m <= 64 else 256, num_stages=1)
    else:
        cfg = dict(block_M=_rows(m), block_N=64, block_K=64, num_stages=1)
    return dict(N=N, K=K, **cfg, **variant)


def _cluster(N: int, cfg: dict, variant: dict) -> dict:
    """``cluster=2`` where the shape allows 2-CTA TMA multicast of the A tile (at least two N
    blocks, a K-major A whose half tile keeps the swizzle's 1024-byte alignment): the CTAs of
    adjacent N blocks load each A tile once from L2 (``kernforge.backends.cuda.cluster``; the
    renderer falls back to one CTA, with the same code, on archs without a warp-specialized TMA
    ring: sm_80, sm_100a).  Nothing is timed yet: no GPU has run it."""
    from kernforge.backends.cuda.cluster import config_request

    if variant.get("a_major", "k") != "k":
        return {}
    return config_request(-(-N // cfg["block_N"]), cfg["block_M"], cfg["block_K"] * 2)


def _rows(m: int) -> int:
    """A host row tile for ``m`` rows: the smallest power of two holding a decode batch, else 64."""
    return next(b for b in (1, 2, 4, 8, 16) if m <= b) if m <= 16 else 64
