"""sm_100a block-scaled FP8 (issue 21 item 6): ``tcgen05.cp`` of UE8M0 scale factors into tensor
memory and ``tcgen05.mma.cta_group::1.kind::mxf8f6f4.block_scale.scale_vec::1X`` on host emulation,
against float64 numpy, and the same device code's SASS.

The kernel restates the PTX layouts itself: e4m3 operands in 8 x 16-byte K-major core matrices,
the scale factors of row (column) r, K block s in byte ``s % 4`` of the 32-bit cell at lane
``r % 32``, column ``base + 4 * (s / 4) + r / 32`` -- written by one ``tcgen05.cp .32x128b.warpx4``
per four K blocks from 32 shared rows of 16 bytes -- and one MMA per 32 K elements choosing its
byte with the SFA/SFB ids of the instruction descriptor (``tcgen05.instr_desc_block_scaled``).
``GRAN`` is the scale's K width: 32 (MX, a factor per MMA) or 128 (DeepGEMM's UE8M0 recipe, four
MMAs share a factor).  ``PLANT`` makes the *kernel* read its factors per 128 when they are per
32, which the emulated product must expose; emulators rebuilt with a planted bug (bias 126, the
SFB id ignored) must fail the float64 check.

Then the library: ``fp8_gemm(sf_format="ue8m0")`` (DeepGEMM's SM100 packed scales) on sm_100a
folds its promotion into block-scaled MMAs (``tcgen05.plan_block_scaled``); it must match float64
over the whole exponent range on both launch variants, the grouped contiguous GEMM's variant too,
bugs planted in its generated source must be caught, and ``ops.fp8_gemm_nt`` must route packed
scales to it on CUDA backends.  "CUDA semantics verified on host emulation", never GPU verified.
"""
from __future__ import annotations

import re
import shutil
import subprocess

import ml_dtypes
import numpy as np
import pytest
import torch

import kernforge
from kernforge.backends.cuda import tcgen05
from kernforge.backends.cuda.renderer import INCLUDE_DIR, render_cuda
from kernforge.backends.cuda_emu.backend import CudaEmuBackend, EmulationError
from kernforge.kernels.gemm import fp8_gemm, get_mn_major_tma_aligned_tensor
from tests.emu.planted import copies_module, mutants

from .conftest import CudaTestKernel, build_emu_module

E4M3 = ml_dtypes.float8_e4m3fn
K = 256  # eight K = 32 MMAs: two packed words of four 32-wide factors, both SF ids 0-3

SOURCE = r'''
#include "kf/tcgen05.cuh"
#include "kf/tma.cuh"
#include "kf/fence.cuh"
// D(128 x N) = sum over K blocks s of (A_s B_s^T) * 2^(SA[m, s] - 127) * 2^(SB[n, s] - 127):
// A [128, KK], B [N, KK] e4m3 (K-major), SA [128, KK / GRAN], SB [N, KK / GRAN] UE8M0 bytes.
template <int N, int GRAN, int PLANT>
__device__ void bs_run(const unsigned char* A, const unsigned char* B, const unsigned char* SA,
                       const unsigned char* SB, float* D) {
  extern __shared__ __align__(1024) unsigned char kf_smem[];
  constexpr int SBLK = KK / GRAN;          // factors per row
  constexpr int WORDS = (SBLK + 3) / 4;    // packed 32-bit words per row: one tcgen05.cp each
  constexpr int BQ = (N + 127) / 128;      // 128-row pieces of B's factors
  constexpr int COLS = N + 4 * WORDS * (1 + BQ) <= 128 ? 128 : 512;
  unsigned char* sA = kf_smem;
  unsigned char* sB = sA + 128 * KK;
  unsigned char* sSA = sB + N * KK;                 // WORDS x (32 rows x 16 bytes)
  unsigned char* sSB = sSA + WORDS * 512;           // WORDS x BQ x (32 rows x 16 bytes)
  uint64_t* bar = reinterpret_cast<uint64_t*>(sSB + WORDS * BQ * 512);
  uint32_t* slot = reinterpret_cast<uint32_t*>(bar + 1);
  const int tid = threadIdx.x;
  for (int i = tid; i < 128 * KK; i += 128) {
    const int r = i / KK, c = i % KK;
    sA[((r / 8) * (KK / 16) + c / 16) * 128 + (r % 8) * 16 + c % 16] = A[i];
  }
  for (int i = tid; i < N * KK; i += 128) {
    const int n = i / KK, c = i % KK;
    sB[((n / 8) * (KK / 16) + c / 16) * 128 + (n % 8) * 16 + c % 16] = B[i];
  }
  // tcgen05.cp source rows: byte 4 j + b of row r = factor 4 w + b of row 128 h + 32 j + r
  for (int i = tid; i < WORDS * 512; i += 128) {
    const int w = i / 512, r = i % 512 / 16, j = i % 16 / 4, s = 4 * w + i % 4, m = 32 * j + r;
    sSA[i] = s < SBLK ? SA[m * SBLK + s] : 0;
  }
  for (int i = tid; i < WORDS * BQ * 512; i += 128) {
    const int w = i / (512 * BQ), h = i / 512 % BQ, r = i % 512 / 16, j = i % 16 / 4, s = 4 * w + i % 4;
    const int n = 128 * h + 32 * j + r;
    sSB[i] = s < SBLK && n < N ? SB[n * SBLK + s] : 0;
  }
  kf::fence_proxy_async();  // the generic-proxy stores above are read by tcgen05.mma / tcgen05.cp
  if (tid < 32) {
    kf::tmem_alloc(slot, COLS);
    kf::tmem_relinquish_alloc_permit();
  }
  if (tid == 0) {
    kf::mbarrier_init(bar, 1);
    kf::mbarrier_init_fence();
  }
  kf::tcgen05_fence_before();
  __syncthreads();
  kf::tcgen05_fence_after();
  const uint32_t tmem = *slot, sfa = tmem + N, sfb = sfa + 4 * WORDS;
  if (tid == 0) {
    for (int w = 0; w < WORDS; ++w) {
      kf::tcgen05_cp_32x128b_warpx4(sfa + 4 * w, kf::make_umma_desc(sSA + 512 * w, 0, 128));
      for (int h = 0; h < BQ; ++h)
        kf::tcgen05_cp_32x128b_warpx4(sfb + 4 * (w * BQ + h), kf::make_umma_desc(sSB + 512 * (w * BQ + h), 0, 128));
    }
#pragma unroll
    for (int kk = 0; kk < KK / 32; ++kk) {
      const int s = kk * 32 / (PLANT ? 128 : GRAN);  // this MMA's factor
      const uint32_t idesc = (uint32_t(s % 4) << 4) | (uint32_t(N >> 3) << 17) | (1u << 23) | (8u << 24) |
                             (uint32_t(s % 4) << 29);
      kf::tcgen05_mma_mxf8f6f4_block_scale(tmem, kf::make_umma_desc(sA + kk * 256, 128, (KK / 16) * 128),
                                           kf::make_umma_desc(sB + kk * 256, 128, (KK / 16) * 128), idesc,
                                           sfa + 4 * (s / 4), sfb + 4 * BQ * (s / 4), kk > 0);
    }
    kf::tcgen05_commit(bar);
  }
  kf::mbarrier_wait_parity(bar, 0);
  kf::tcgen05_fence_after();
  const int w = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  for (int half = 0; half < 2; ++half) {  // M = 128 (layout D): row r in lane r
    float d[N / 2];
    kf::tmem_ld_16x256b<N / 8>(d, tmem + (uint32_t(32 * w + 16 * half) << 16));
    kf::tmem_wait_ld();
    for (int j = 0; j < N / 8; ++j)
      for (int q = 0; q < 4; ++q) D[(32 * w + 16 * half + g + 8 * (q / 2)) * N + 8 * j + 2 * t + q % 2] = d[4 * j + q];
  }
  kf::tcgen05_fence_before();
  __syncthreads();
  if (tid < 32) {
    kf::tcgen05_fence_after();
    kf::tmem_dealloc(tmem, COLS);
  }
}
#define KF_BS(name, N, GRAN, PLANT)                                                                  \
  extern "C" __global__ void name(const unsigned char* A, const unsigned char* B, const unsigned char* SA, \
                                  const unsigned char* SB, float* D) { bs_run<N, GRAN, PLANT>(A, B, SA, SB, D); }
KF_BS(bs_n64_g32, 64, 32, 0)
KF_BS(bs_n64_g128, 64, 128, 0)
KF_BS(bs_n256_g32, 256, 32, 0)
KF_BS(bs_n64_g32_planted, 64, 32, 1)
'''.replace("KK", str(K))
KERNELS = {"bs_n64_g32": (64, 32), "bs_n64_g128": (64, 128), "bs_n256_g32": (256, 32),
           "bs_n64_g32_planted": (64, 32)}
ARGS = [("const unsigned char*", "buffer")] * 4 + [("float*", "buffer")]


def _smem(n: int) -> int:
    words = K // 32 // 4
    return 128 * K + n * K + words * 512 * (1 + -(-n // 128)) + 16


@pytest.fixture(scope="module")
def kernels():
    return build_emu_module("emu_test_tcgen05_block_scaled",
                            [CudaTestKernel(name, SOURCE if i == 0 else "", ARGS, 128)
                             for i, name in enumerate(KERNELS)],
                            dynamic_smem=_smem(256), arch="sm_100a")


def ue8m0(e: np.ndarray) -> np.ndarray:
    """UE8M0 bytes -> float64: 2^(e - 127), 255 NaN (an independent restatement of the format)."""
    e = e.astype(np.int64)
    return np.where(e == 255, np.nan, np.ldexp(1.0, e - 127))


def reference(a, b, sa, sb, gran):
    """float64 ``sum_s (A_s B_s^T) sa[:, s] sb[:, s]`` and a bound on float32 accumulation error."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    out = np.zeros((a.shape[0], b.shape[0]))
    mag = np.zeros_like(out)
    for s in range(K // gran):
        part = a64[:, s * gran:(s + 1) * gran] @ b64[:, s * gran:(s + 1) * gran].T
        scale = ue8m0(sa[:, s])[:, None] * ue8m0(sb[:, s])[None, :]
        out += part * scale
        mag += np.abs(a64[:, s * gran:(s + 1) * gran]) @ np.abs(b64[:, s * gran:(s + 1) * gran]).T * scale
    return out, mag * 2.0 ** -20 + (K // 32) * 2.0 ** -149


def _operands(rng, n, gran, extreme_a: bool):
    """Random e4m3 data over the format's range and UE8M0 factors: one side over the whole
    exponent range 0..254 (2^-127 .. 2^127, both ends present), the other in 0..104 so that no
    product overflows float32 (which float64 would not)."""
    a = (rng.standard_normal((128, K)) * 4).astype(E4M3)
    b = (rng.standard_normal((n, K)) * 4).astype(E4M3)
    a[0, :5] = np.array([0.0, -0.0, 2.0 ** -9, 448.0, -448.0], dtype=np.float32).astype(E4M3)
    wide = rng.integers(0, 255, (128 if extreme_a else n, K // gran)).astype(np.uint8)
    wide[0, 0], wide[1, -1] = 0, 254
    narrow = rng.integers(0, 105, (n if extreme_a else 128, K // gran)).astype(np.uint8)
    sa, sb = (wide, narrow) if extreme_a else (narrow, wide)
    return a, b, sa, sb


def _run(kern, a, b, sa, sb):
    d = np.full((128, b.shape[0]), np.nan, np.float32)
    kern([a.view(np.uint8), b.view(np.uint8), np.ascontiguousarray(sa), np.ascontiguousarray(sb), d], [], [1])
    return d


def _check(got, want, bound):
    err = np.abs(got.astype(np.float64) - want)
    bad = ~(err <= bound)
    assert not bad.any(), f"{bad.sum()} elements off, first {np.argwhere(bad)[:3].tolist()}, max err {err.max()}"


@pytest.mark.parametrize("name", ["bs_n64_g32", "bs_n64_g128", "bs_n256_g32"])
def test_block_scaled_mma_matches_float64(rng, kernels, name):
    n, gran = KERNELS[name]
    for extreme_a in (True, False):
        a, b, sa, sb = _operands(rng, n, gran, extreme_a)
        want, bound = reference(a, b, sa, sb, gran)
        _check(_run(kernels[name], a, b, sa, sb), want, bound)


def test_ue8m0_255_is_nan_and_only_where_it_scales(rng, kernels):
    n, gran = KERNELS["bs_n64_g32"]
    a, b, sa, sb = _operands(rng, n, gran, True)
    sa[7, 3], sb[11, 5] = 255, 255
    got = _run(kernels["bs_n64_g32"], a, b, sa, sb)
    nan = np.zeros(got.shape, bool)
    nan[7, :], nan[:, 11] = True, True
    np.testing.assert_array_equal(np.isnan(got), nan)
    want, bound = reference(a, b, sa, sb, gran)
    _check(np.where(nan, 0, got), np.where(nan, 0, want), np.where(nan, 0, bound))


def test_one_hot_factor_lands_on_its_row_column_and_block(kernels):
    """One element per K block, each block a different power of two: the factor of block s
    of row m / column n (SF id s % 4, column word s / 4, lane quarter m / 32) must scale exactly
    that product."""
    n, gran = KERNELS["bs_n64_g32"]
    for m, c, s in [(0, 0, 0), (37, 17, 3), (127, 63, 4), (96, 33, 7), (64, 32, 5)]:
        a, b = np.zeros((128, K), E4M3), np.zeros((n, K), E4M3)
        sa, sb = np.full((128, K // gran), 127, np.uint8), np.full((n, K // gran), 127, np.uint8)
        a[m, s * gran + 9], b[c, s * gran + 9] = 3.0, -0.5
        sa[m, s], sb[c, s] = 127 + 5, 127 - 2
        want = np.zeros((128, n))
        want[m, c] = -1.5 * 2.0 ** 3
        np.testing.assert_array_equal(_run(kernels["bs_n64_g32"], a, b, sa, sb), want)


def test_kernel_reading_factors_per_128_instead_of_32_is_caught(rng, kernels):
    n, gran = KERNELS["bs_n64_g32_planted"]
    a, b, sa, sb = _operands(rng, n, gran, True)
    want, bound = reference(a, b, sa, sb, gran)
    with pytest.raises(AssertionError):
        _check(_run(kernels["bs_n64_g32_planted"], a, b, sa, sb), want, bound)


def test_instr_desc_block_scaled_follows_the_ptx_table():
    d = tcgen05.instr_desc_block_scaled(128, 64, sfa_id=2, sfb_id=1)
    assert d & 0x7 == 0 and (d >> 7) & 0x3f == 0 and not (d >> 13) & 0xf  # dense, e4m3 x e4m3, K-major
    assert (d >> 4) & 3 == 1 and (d >> 29) & 3 == 2 and (d >> 23) & 1 == 1  # SF ids, UE8M0
    assert (d >> 17) & 63 == 64 >> 3 and (d >> 24) & 31 == 128 >> 4 and not d >> 31
    for bad in (dict(m=64, n=64), dict(m=128, n=8), dict(m=128, n=264), dict(m=128, n=64, sfa_id=4)):
        with pytest.raises(ValueError):
            tcgen05.instr_desc_block_scaled(**bad)


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_block_scaled_mma_assembles_for_sm100a(tmp_path):
    """The same device code for sm_100a: the block-scaled MMA and the scale copy are tensor-core
    instructions (``UTCQMMA`` with two scale-factor tensor-memory operands, ``UTCCP``), with no
    CUDA-core promotion of partial products."""
    from kernforge.backends.cuda.backend import disassemble

    src = tmp_path / "bs.cu"
    src.write_text('#include <cstdint>\n#include "kf/common.cuh"\n' + SOURCE)
    cubin = tmp_path / "bs.cubin"
    subprocess.run(["nvcc", "-O3", "-std=c++17", "--expt-relaxed-constexpr", "-cubin", "-arch=sm_100a",
                    f"-I{INCLUDE_DIR}", "-o", str(cubin), str(src)], check=True, capture_output=True, text=True)
    sass = disassemble(str(cubin))
    # block-scaled: a third tensor-memory operand (the B factors) after the instruction descriptor;
    # the plain kind::f8f6f4 form ends at idesc[...] (tests/backends/test_cuda_compile_tcgen05.py)
    mmas = re.findall(r"UTCQMMA gdesc\[\w+\], gdesc\[\w+\], tmem\[[^]]+\], tmem\[[^]]+\], idesc\[\w+\], tmem\[", sass)
    assert len(mmas) == sass.count("UTCQMMA") == 4 * (K // 32), sass.count("UTCQMMA")
    assert sass.count("UTCCP.T.S.4x32dp128bit") == 4 + 2 + 6 + 4  # words x (A + B's 128-row pieces)
    ops = set(re.findall(r"/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9]+)", sass))
    assert not ops & {"FFMA", "FMUL", "HMMA", "QGMMA"}, ops  # no CUDA-core promotion of partial products


# ---- the library kernel: fp8_gemm(sf_format="ue8m0") on sm_100a -------------------------------------

GEMM = dict(N=64, K=528, block_M=128, block_N=64, threads=256, sf_format="ue8m0", out_dtype="float32")
M = 140  # a ragged second row tile; K = 528 a ragged fifth K tile (16 deep)


def _pack(e: torch.Tensor) -> torch.Tensor:
    """UE8M0 bytes ``[..., k]`` -> int32 ``[..., ceil(k / 4)]``, byte j of word p = byte 4p + j."""
    e = torch.nn.functional.pad(e.to(torch.int64), (0, (-e.shape[-1]) % 4), value=127).unflatten(-1, (-1, 4))
    word = e[..., 0] | (e[..., 1] << 8) | (e[..., 2] << 16) | (e[..., 3] << 24)
    return (word - ((word >> 31) << 32)).to(torch.int32)  # the same 32 bits, signed


def _gemm_inputs(seed: int, gran_n: int, extreme_a: bool, k: int = GEMM["K"], m: int = M):
    """e4m3 A, B and UE8M0 exponents: one side over all of 0..254, the other 0..104 (no float32
    overflow)."""
    g = torch.Generator().manual_seed(seed)
    n = GEMM["N"]
    kb = -(-k // 128)
    a = (torch.randn(m, k, generator=g) * 4).to(torch.float8_e4m3fn)
    b = (torch.randn(n, k, generator=g) * 4).to(torch.float8_e4m3fn)
    rows_b = -(-n // gran_n)
    ea = torch.randint(0, 255 if extreme_a else 105, (m, kb), generator=g)
    eb = torch.randint(0, 105 if extreme_a else 255, (rows_b, kb), generator=g)
    (ea if extreme_a else eb)[0, :2] = torch.tensor([0, 254])
    return a, b, ea, eb


def _gemm_reference(a, b, ea, eb, gran_n: int):
    """float64 ``sum_s (A_s B_s^T) 2^(ea[:, s] - 127) 2^(eb[col, s] - 127)`` over 128-wide K
    blocks, and a bound: one float32 rounding per 32-deep MMA and per K tile."""
    a64, b64 = a.double(), b.double()
    cols = torch.arange(b.shape[0]) // gran_n
    want, mag = torch.zeros(a.shape[0], b.shape[0], dtype=torch.float64), None
    mag = torch.zeros_like(want)
    for s in range(ea.shape[1]):
        ks = slice(128 * s, 128 * (s + 1))
        scale = torch.pow(2.0, (ea[:, s, None] - 127).double()) * torch.pow(2.0, (eb[cols, s][None, :] - 127).double())
        want += (a64[:, ks] @ b64[:, ks].T) * scale
        mag += (a64[:, ks].abs() @ b64[:, ks].abs().T) * scale
    return want, mag * (a.shape[1] // 32 + 4) * 2.0 ** -24 + 2.0 ** -140


def _run_gemm(kern, a, b, ea, eb):
    """D (poisoned) from packed scales, SFA in DeepGEMM's MN-major TMA-aligned layout."""
    d = torch.full((a.shape[0], GEMM["N"]), float("nan"))
    kern(a, get_mn_major_tma_aligned_tensor(_pack(ea)), b, _pack(eb).contiguous(), d)
    return d


def _assert_within(d, want, bound):
    err = (d.double() - want).abs()
    bad = ~(err <= bound)
    assert not bad.any(), f"{int(bad.sum())} elements off, first at {bad.nonzero()[:3].tolist()}"


def test_ue8m0_gemm_plans_block_scaled_mmas_only_on_sm100a_with_128_row_tiles():
    src = CudaEmuBackend().source(fp8_gemm(**GEMM).ir, "sm_100a")
    assert "kf::tcgen05_mma_mxf8f6f4_block_scale(" in src and src.count("kf::tcgen05_cp_32x128b_warpx4(") == 2
    assert "partial[" not in src.split("tcgen05_commit")[-1].split("kf::tmem_ld")[0], "promotion left in the loop"
    assert "block_scale" not in CudaEmuBackend().source(fp8_gemm(**{**GEMM, "block_M": 64}).ir, "sm_100a")
    assert "block_scale" not in CudaEmuBackend().source(fp8_gemm(**{**GEMM, "sf_format": "float32"}).ir, "sm_100a")
    assert "tcgen05" not in CudaEmuBackend().source(fp8_gemm(**GEMM).ir, "sm_90a")


# 128x128 B scales on the TMA variant; per-row B scales and 256-row tiles (two M = 128 MMAs and
# A copies per K step) with K = 520, whose 520-byte rows TMA cannot take: the cp.async variant a
# launch then falls back to
@pytest.mark.parametrize("gran_n, k, block_m, variant", [(128, GEMM["K"], 128, "tma"), (1, 520, 256, "cp.async")])
def test_ue8m0_gemm_on_sm100a_matches_float64_over_the_whole_exponent_range(gran_n, k, block_m, variant):
    """Block-scaled MMAs apply 2^(e - 127) inside the tensor cores, so even factors that would
    overflow or go subnormal in a float32 promotion (the interpreter's) give the float64 result."""
    params = {**GEMM, "gran_n": gran_n, "K": k, "block_M": block_m}
    emu = kernforge.compile(fp8_gemm, backend="cuda-emu", arch="sm_100a", **params)
    for seed, extreme_a, m in ((0, True, M), (1, False, 100)):  # the second run on one row tile: time
        a, b, ea, eb = _gemm_inputs(seed, gran_n, extreme_a, k, m)
        want, bound = _gemm_reference(a, b, ea, eb, gran_n)
        _assert_within(_run_gemm(emu, a, b, ea, eb), want, bound)
        assert emu.launcher.last_variant == variant
    if variant == "cp.async":
        source = emu.launcher._fallback_launcher.program.source
        assert "block_scale(" in source and source.count("tcgen05_cp_32x128b_warpx4(") == 3


def _accumulate_first_tile_only(src):
    return re.sub(r"(kf_tmem_live\d+) \| \(kf_kk > 0\)\);", r"(kf_kk > 0));", src)


GEMM_BUGS = {
    # a packed scale word staged one byte over: each SF id reads its neighbour K block's byte
    "staged_byte": lambda s: s.replace("((kf_s >> 5) & 3) * 4) =", "((kf_s >> 5) & 3) * 4 + 1) =", 1),
    # SFA id 1 in the instruction descriptor's constant part
    "sfa_id": lambda s: re.sub(r"0x0890([0-9a-f]{4})u", r"0x2890\1u", s),
    # every K tile overwrites the sum instead of accumulating
    "no_accumulate": _accumulate_first_tile_only,
    # one copy per four K steps, but the SF ids never step: K steps 1-3 of a word reuse byte 0
    "sf_id_frozen": lambda s: re.sub(r" \| \((kf_sf_id\d+) << 4\) \| \(\1 << 29\)", "", s),
    # the SFB id steps by two: K steps 1, 2, 3 of a word read B's bytes 2, 0, 2
    "sfb_id_step": lambda s: re.sub(r"\((kf_sf_id\d+) << 4\)", r"(((\1 * 2) & 3) << 4)", s),
    # the word copied on SF id 1 instead of 0: the fifth K step still reads the first word
    "word_copied_late": lambda s: re.sub(r"(kf_sf_id\d+) == 0u", r"\1 == 1u", s),
}


def test_bugs_planted_in_the_generated_block_scaled_gemm_are_caught():
    ir = fp8_gemm(**GEMM).ir
    clean = CudaEmuBackend().source(ir, "sm_100a")
    module = copies_module("emu_test_block_scaled_planted", ir.name, {"clean": clean, **mutants(clean, GEMM_BUGS)},
                           "sm_100a", render_cuda(ir, "sm_100a").dynamic_smem)
    emu = kernforge.compile(fp8_gemm, backend="cuda-emu", arch="sm_100a", **GEMM)
    a, b, ea, eb = _gemm_inputs(2, 128, True, m=100)  # one row tile: each run is seconds of emulation
    want, bound = _gemm_reference(a, b, ea, eb, 128)
    for tag in ["clean", *GEMM_BUGS]:
        emu.launcher.emulated = module.kernel(tag, timeout_ms=5_000)
        if tag == "clean":
            _assert_within(_run_gemm(emu, a, b, ea, eb), want, bound)
            continue
        try:
            d = _run_gemm(emu, a, b, ea, eb)
        except EmulationError:
            continue
        with pytest.raises(AssertionError):
            _assert_within(d, want, bound)
    assert emu.launcher.last_variant == "tma"  # the variant the mutants are of


def test_ops_hand_packed_ue8m0_scales_to_the_kernel_on_cuda_backends(monkeypatch):
    """``fp8_gemm_nt`` with both scales packed (DeepGEMM's SM100 form): CUDA backends get the
    ``sf_format="ue8m0"`` kernel and the int32 words as they are (SFA MN-major), host backends the
    unpacked float32 powers of two; FP4 b keeps the unpacked path."""
    from kernforge import ops
    from kernforge.ops import gemm as gemm_ops

    seen = []
    monkeypatch.setattr(gemm_ops, "_kernel", lambda factory, backend, **p: (
        lambda *args: seen.append((backend, p, args))))
    a, b, ea, eb = _gemm_inputs(3, 1, True)
    sfa, sfb = _pack(ea), _pack(eb)
    for backend in ("cuda-emu", "interp"):
        ops.fp8_gemm_nt((a, sfa), (b, sfb), torch.zeros(M, GEMM["N"]), backend=backend)  # recipe (1, 1, 128)
    (emu_backend, emu_p, emu_args), (_, host_p, host_args) = seen
    assert emu_p["sf_format"] == "ue8m0" and emu_p["gran_n"] == 1 and "sf_format" not in host_p
    assert emu_args[1].dtype == emu_args[3].dtype == torch.int32 and emu_args[1].stride(0) == 1
    assert torch.equal(emu_args[1], sfa) and torch.equal(emu_args[3], sfb)
    assert host_args[1].dtype == torch.float32
    normal = ea > 0  # the host unpacking reads byte 0 as 0.0
    assert torch.equal(host_args[1][normal], torch.pow(2.0, ea.double() - 127).float()[normal])


@pytest.mark.parametrize("old, new", [
    ("std::ldexp(1.0, int(e) - 127)", "std::ldexp(1.0, int(e) - 126)"),  # exponent bias 126
    ('scale_byte(op.sfb & 0xffffu, c, mx.sfb_id, "B")', 'scale_byte(op.sfb & 0xffffu, c, 0, "B")'),  # SFB id ignored
], ids=["bias_126", "sfb_id_ignored"])
def test_an_emulator_with_a_planted_scale_bug_fails_the_float64_check(tmp_path, monkeypatch, rng, old, new):
    """The tests above would catch a wrong emulator: rebuilt from a copy of the emulation headers
    with one bug planted, the block-scaled kernel no longer matches float64."""
    from kernforge.backends.cuda_emu import backend as emu_backend

    inc = tmp_path / "include"
    shutil.copytree(emu_backend.INCLUDE_DIRS[1], inc)
    header = inc / "kf" / "emu" / "tcgen05.h"
    text = header.read_text()
    assert text.count(old) == 1, "the emulator moved: update the planted bug"
    header.write_text(text.replace(old, new))
    monkeypatch.setattr(emu_backend, "INCLUDE_DIRS", (emu_backend.INCLUDE_DIRS[0], str(inc)))
    kern = build_emu_module("emu_test_tcgen05_block_scaled_bug", [CudaTestKernel("bs_n64_g32", SOURCE, ARGS, 128)],
                            dynamic_smem=_smem(64), arch="sm_100a")["bs_n64_g32"]
    a, b, sa, sb = _operands(rng, 64, 32, True)
    want, bound = reference(a, b, sa, sb, 32)
    with pytest.raises(AssertionError):
        _check(_run(kern, a, b, sa, sb), want, bound)


def test_ue8m0_grouped_contiguous_gemm_on_sm100a_matches_float64():
    """The grouped contiguous fp8 GEMM's UE8M0 variant folds its promotion the same way (inside
    its ``if expert >= 0`` branch): expert-major 128-row blocks, a padded block (-1 rows zeroed),
    factors over the whole exponent range on A's side."""
    from kernforge.kernels.grouped_gemm.kernel import m_grouped_fp8_gemm_nt_contiguous

    G, N, K, rows = 3, 64, 256, 256
    params = dict(num_groups=G, N=N, K=K, block_M=128, block_N=64, threads=256, out_dtype="float32",
                  sf_format="ue8m0")
    assert "block_scale(" in CudaEmuBackend().source(m_grouped_fp8_gemm_nt_contiguous(**params).ir, "sm_100a")
    g = torch.Generator().manual_seed(5)
    a = (torch.randn(rows, K, generator=g) * 4).to(torch.float8_e4m3fn)
    b = (torch.randn(G, N, K, generator=g) * 4).to(torch.float8_e4m3fn)
    ea = torch.randint(0, 255, (rows, K // 128), generator=g)
    eb = torch.randint(0, 105, (G, 1, K // 128), generator=g)
    experts = torch.cat([torch.full((128,), 2), torch.zeros(100, dtype=torch.int64), torch.full((28,), -1)])
    d = torch.full((rows, N), float("nan"))
    emu = kernforge.compile(m_grouped_fp8_gemm_nt_contiguous, backend="cuda-emu", arch="sm_100a", **params)
    emu(a, _pack(ea), b, _pack(eb), experts.to(torch.int32), d)
    for e in (0, 2):
        sel = experts == e
        want, bound = _gemm_reference(a[sel], b[e], ea[sel], eb[e], 128)
        _assert_within(d[sel], want, bound)
    assert torch.equal(d[experts < 0], torch.zeros(28, N))


def test_ue8m0_variant_is_the_float32_kernel_on_decoded_scales_in_the_interpreter():
    """Off sm_100a the variant runs its promotion as written: on the interpreter it gives the
    float32-scale kernel's bits on the same (decoded, exact) scales, and the float64 product."""
    params = {**GEMM, "K": 264}
    a, b, ea, eb = _gemm_inputs(4, 128, True, k=264)
    ea, eb = ea.clamp(60, 190), eb + 60  # a float32 promotion neither overflows nor goes subnormal
    d = _run_gemm(kernforge.compile(fp8_gemm, backend="interp", **params), a, b, ea, eb)
    d32 = torch.full_like(d, float("nan"))
    kernforge.compile(fp8_gemm, backend="interp", **{**params, "sf_format": "float32"})(
        a, get_mn_major_tma_aligned_tensor(torch.pow(2.0, ea - 127.0).float()), b, torch.pow(2.0, eb - 127.0).float(),
        d32)
    assert torch.equal(d, d32)
    want, bound = _gemm_reference(a, b, ea, eb, 128)
    _assert_within(d, want, bound)


def test_ue8m0_grouped_masked_gemm_on_sm100a_matches_float64():
    """The masked grouped GEMM's UE8M0 variant (per-group MN-major SFA): rows past ``masked_m``
    stay unwritten, the rest match float64 over the whole exponent range on A's side."""
    from kernforge.kernels.grouped_gemm.kernel import m_grouped_fp8_gemm_nt_masked

    G, N, K, max_m = 2, 64, 256, 128
    params = dict(num_groups=G, N=N, K=K, block_M=128, block_N=64, threads=256, out_dtype="float32",
                  sf_format="ue8m0")
    assert "block_scale(" in CudaEmuBackend().source(m_grouped_fp8_gemm_nt_masked(**params).ir, "sm_100a")
    g = torch.Generator().manual_seed(6)
    a = (torch.randn(G, max_m, K, generator=g) * 4).to(torch.float8_e4m3fn)
    b = (torch.randn(G, N, K, generator=g) * 4).to(torch.float8_e4m3fn)
    ea = torch.randint(0, 255, (G, max_m, K // 128), generator=g)
    eb = torch.randint(0, 105, (G, 1, K // 128), generator=g)
    masked = torch.tensor([100, 0], dtype=torch.int32)
    d = torch.full((G, max_m, N), float("nan"))
    emu = kernforge.compile(m_grouped_fp8_gemm_nt_masked, backend="cuda-emu", arch="sm_100a", **params)
    emu(a, get_mn_major_tma_aligned_tensor(_pack(ea)), b, _pack(eb), masked, d)
    want, bound = _gemm_reference(a[0, :100], b[0], ea[0, :100], eb[0], 128)
    _assert_within(d[0, :100], want, bound)
    assert torch.isnan(d[0, 100:]).all() and torch.isnan(d[1]).all()


def test_packed_words_are_recognised_only_as_byte_k_mod_4_of_word_k_div_4():
    """``tcgen05._packed_word`` (one copy per four K steps) takes ``(W[.., k // 4] >> (k % 4) * 8) & 255``
    and nothing else: a word read at ``k`` itself, or a byte index other than ``k % 4``, would make
    the four steps sharing a copy need different words, so those keep one byte staged per step."""
    from dataclasses import replace

    from kernforge.backends.cuda.renderer import CudaRenderer
    from kernforge.codegen import ir
    from kernforge.codegen.renderer import Target

    plan = CudaRenderer().lower(fp8_gemm(**GEMM).ir, Target("cuda-emu", "sm_100a"))[1]["layouts"]
    (bs,) = plan.block_scaled.values()
    k = bs.loop.var
    assert bs.words is not None and bs.words[2].op == ir.Op.MOD and bs.words[2].a is k
    for byte in (bs.sfa, bs.sfb):
        word, sf_id = tcgen05._packed_word(byte, k)
        assert word is byte.a.a and sf_id is byte.a.b.a
        load = word
        at_k = replace(load, indices=tuple(k if isinstance(x, ir.Binary) and x.a is k else x for x in load.indices))
        assert tcgen05._packed_word(replace(byte, a=replace(byte.a, a=at_k)), k) is None  # W[.., k]
        mod2 = replace(byte.a.b, a=replace(byte.a.b.a, b=ir.Const(2, byte.a.b.a.b.dtype)))
        assert tcgen05._packed_word(replace(byte, a=replace(byte.a, b=mod2)), k) is None  # byte k % 2
        assert tcgen05._packed_word(byte, ir.Var("other")) is None  # another loop's variable
