"""Dense block-scaled GEMM's compile-time configuration: the one place its tiles are chosen.

Used by :mod:`kernforge.ops.gemm` and the catalogue's production-sized problems alike;
keyed on the language a backend generates (:func:`kernforge.backends.lang`); a configuration
tuned for the call (``kernforge tune``) wins (:func:`kernforge.tune.consult.tuned`).
"""
from __future__ import annotations

from typing import Optional

from kernforge import backends
from kernforge.tune.consult import tuned

#: GPUs run the dense bf16 and FP8 GEMMs persistent (``persistent``: one CTA per SM
#: looping over the output tiles, :mod:`kernforge.backends.cuda.persistent`) in L2 groups of 16
#: row tiles per N tile, as the grouped GEMMs do (DeepGEMM's ``kNum1DBlocksPerGroup``): the CTAs
#: running together read a few B tiles and 16 A row tiles, each reused from L2 across N tiles
L2_GROUP = 16


def _fp8_kernel(config: dict) -> str:
    """One chooser serves both scaled GEMMs: only the FP8 x FP8 kernel takes majors and ``gran_n``."""
    return "fp8_gemm_nt" if "gran_n" in config or "a_major" in config else "fp8_fp4_gemm_nt"


def block_scaled(arch: Optional[str], variant: dict) -> bool:
    """Whether an FP8 x FP8 GEMM of ``variant`` built for ``arch`` runs block-scaled ``tcgen05.mma``
    (``kernforge.backends.cuda.tcgen05.plan_block_scaled``): packed UE8M0 scales, K-major e4m3
    operands and an arch with tcgen05 (sm_100a).  Those MMAs exist at ``M = 128`` only (no
    ``cta_group::1`` block-scaled ``M = 64``), so such a GEMM needs 128-row tiles: a 64-row tile
    keeps the float32 promotion in registers and the sum leaves TMEM every K step."""
    if arch is None or variant.get("sf_format") != "ue8m0" or variant.get("a_major", "k") != "k" \
            or variant.get("b_major", "k") != "k":
        return False
    from kernforge.backends.cuda.arch import arch_info

    return arch_info(arch).tcgen05


@tuned(_fp8_kernel)
def choose(backend: str, N: int, K: int, m: int, arch: Optional[str] = None, **variant) -> dict:
    """:func:`~kernforge.kernels.gemm.fp8_gemm` and ``fp8_fp4_gemm`` parameters for ``m``
    rows (the same tiles: the FP4 kernel's 32-deep steps need less shared memory).  GPUs
    take 128x128 tiles with 256 threads (two float32 128x128 fragments: 128 threads would
    spill, as in the grouped fp8 kernel), three stages and (FP8 x FP8) the persistent tile loop
    (:data:`L2_GROUP`), 64-row tiles when ``m <= 64``
    (decode: fewer wasted rows) or when accumulating (reading ``D`` in the epilogue costs
    registers: at 128x128, sm_100a's mma.sync build spills, ptxas: 104 B of stack); the CPU
    backend 256x128 tiles (a decode batch: :func:`_rows`, up to 128 rows: 128), other host
    backends 64x128, in one stage.  ``arch``: the CUDA arch the kernel is built for (None: not
    known, as sm_90a); where it folds UE8M0 scales into block-scaled MMAs (:func:`block_scaled`)
    tiles are 128 rows whatever ``m`` or ``accumulate`` (the sum stays in TMEM, so reading ``D``
    costs no promotion registers; sm_100a ptxas: no spills).  ``variant``: majors, ``gran_n``,
    ``accumulate``, ``out_dtype``, ``sf_format``, passed through (the FP4 kernel takes
    ``accumulate``/``out_dtype`` only)."""
    if backends.lang(backend) == "cuda":
        small = (m <= 64 or variant.get("accumulate")) and not block_scaled(arch, variant)
        cfg = dict(block_M=64 if small else 128, block_N=128, num_stages=3, threads=256)
        if _fp8_kernel(variant) == "fp8_gemm_nt":
            # FP8 x FP4 stays one CTA per tile and unclustered: it decodes B in shared memory (no TMA
            # ring to share), and persistent its sm_100a build spills (255 registers, 72 B)
            cfg["persistent"] = L2_GROUP
            cfg.update(_cluster(N, m, cfg, variant, row_bytes=128))  # 128-deep e4m3 rows
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
    with 64-deep K tiles (persistent too); float32 64x128x32 (sm_90a ptxas: 64x64x64 at 128
    threads and 128x128x32 spill), one CTA per tile (FMA tiles for a reference model, not asked
    to be persistent).  Host backends: 64x64x64 tiles in one stage; at decode (``m <= 16``)
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
                   num_stages=3, threads=256, persistent=L2_GROUP)
        cfg.update(_cluster(N, m, cfg, variant, row_bytes=cfg["block_K"] * 2))
    elif variant.get("dtype", "bfloat16") == "bfloat16":
        cfg = dict(block_M=_rows(m) if m <= 64 else 128 if m <= 128 else 256, block_N=128,
                   block_K=512 if m <= 64 else 256, num_stages=1)
    else:
        cfg = dict(block_M=_rows(m), block_N=64, block_K=64, num_stages=1)
    return dict(N=N, K=K, **cfg, **variant)


#: DeepGEMM multicasts only from this many rows on (its sm90 heuristic); here it gates B multicast
MULTICAST_B_MIN_M = 512


def _cluster(N: int, m: int, cfg: dict, variant: dict, row_bytes: int) -> dict:
    """2-CTA TMA multicast where the shape allows (``kernforge.backends.cuda.cluster``; bf16 and
    FP8 alike, ``row_bytes``: one K-deep tile row), of one operand as DeepGEMM picks per shape:

    * B (``multicast="b"``: the CTAs of adjacent M blocks load each B tile once from L2) when
      ``m >= 512``, the tiles are no taller than wide (DeepGEMM tries the operand on the larger
      block side first, B on a tie), B is K-major and the M blocks pair evenly (its legality rule:
      no padded CTA) into half tiles of whole 1024-byte swizzle atoms;
    * else A (the CTAs of adjacent N blocks share each A tile) wherever a K-major A's half tile
      keeps that alignment and there are at least two N blocks (an odd count pads one CTA).

    The renderer falls back to one CTA, with the same code, on archs without a warp-specialized
    TMA ring (sm_80, sm_100a).  Nothing is timed yet: no GPU has run it."""
    from kernforge.backends.cuda.cluster import config_request

    m_blocks = -(-int(m) // cfg["block_M"])
    if (m >= MULTICAST_B_MIN_M and cfg["block_M"] <= cfg["block_N"] and variant.get("b_major", "k") == "k"
            and m_blocks % 2 == 0 and config_request(m_blocks, cfg["block_N"], row_bytes)):
        return dict(config_request(m_blocks, cfg["block_N"], row_bytes), multicast="b")
    if variant.get("a_major", "k") != "k":
        return {}
    return config_request(-(-N // cfg["block_N"]), cfg["block_M"], row_bytes)


def _rows(m: int) -> int:
    """A host row tile for ``m`` rows: the smallest power of two holding a decode batch, else 64."""
    return next(b for b in (1, 2, 4, 8, 16) if m <= b) if m <= 16 else 64
