"""bf16 wgmma reading 128-byte-swizzled operands (descriptor layout type 1) on host emulation.

The kernel restates the layout itself: row r of a 128-byte column chunk at byte r * 128, its
16-byte piece p stored at piece p ^ (r % 8) (CU_TENSOR_MAP_SWIZZLE_128B; PTX "matrix
descriptor"), chunk j of an R-row tile at byte j * R * 128.  So an emulator whose XOR pattern,
K-major row stride or MN-major chunk stride (LBO) differs computes another product than float64
numpy, a descriptor that declares no swizzle over swizzled data does too, and a swizzled
operand that does not start on a 1024-byte atom is refused.
"""
from __future__ import annotations

import shutil

import ml_dtypes
import numpy as np
import pytest

from kernforge.backends.cuda_emu import backend as emu_backend
from kernforge.backends.cuda_emu.backend import EmulationError

from .conftest import CudaTestKernel, build_emu_module

BF16 = ml_dtypes.bfloat16
K, N_K, N_MN = 128, 64, 128  # K: two 64-element chunks; MN-major B: two chunks along N (LBO used)

SOURCE = r'''
#include "kf/wgmma.cuh"
// element (r, c) of an R x C bf16 tile stored 128B-swizzled at `base` (bytes)
__device__ inline unsigned swz(int R, int r, int c) {
  return (c / 64) * R * 128 + r * 128 + ((((c % 64) / 8) ^ (r % 8)) * 16) + (c % 8) * 2;
}
// D(64xN) = A(64xK) B(KxN); A given M x K, B given N x K (B_MN: stored K x N in shared memory).
// LAYOUT: the descriptors' layout type (1 = 128B swizzle; 0 plants "no swizzle" over the same
// bytes); SHIFT: bytes the tiles are moved off their 1024-byte atoms.
template <int N, int B_MN, int LAYOUT, int SHIFT>
__device__ void swz_run(const unsigned short* A, const unsigned short* B, float* D) {
  extern __shared__ __align__(1024) unsigned char kf_smem[];
  unsigned char* sA = kf_smem + SHIFT;
  unsigned char* sB = sA + 64 * KK * 2;
  const int tid = threadIdx.x;
  for (int i = tid; i < 64 * KK; i += 128)
    *reinterpret_cast<unsigned short*>(sA + swz(64, i / KK, i % KK)) = A[i];
  for (int i = tid; i < N * KK; i += 128) {
    const int n = i / KK, k = i % KK;
    *reinterpret_cast<unsigned short*>(sB + (B_MN ? swz(KK, k, n) : swz(N, n, k))) = B[i];
  }
  kf::fence_proxy_async();
  __syncthreads();
  float d[N / 2];
  kf::wgmma_fence_operand(d);
  kf::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < KK / 16; ++kk) {
    // K-major: the k16 step moves 32 bytes inside a row, a chunk every 4 steps
    const uint64_t da = kf::make_smem_desc(sA + (kk / 4) * 64 * 128 + (kk % 4) * 32, 16, 1024, LAYOUT);
    const uint64_t db = B_MN ? kf::make_smem_desc(sB + kk * 16 * 128, KK * 128, 1024, LAYOUT)
                             : kf::make_smem_desc(sB + (kk / 4) * N * 128 + (kk % 4) * 32, 16, 1024, LAYOUT);
    kf::wgmma_m64nNk16_f32_bf16<N, 0, B_MN>(d, da, db, kk > 0);
  }
  kf::wgmma_commit();
  kf::wgmma_wait<0>();
  kf::wgmma_fence_operand(d);
  const int w = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  for (int j = 0; j < N / 8; ++j)
    for (int q = 0; q < 4; ++q) D[(16 * w + g + 8 * (q / 2)) * N + 8 * j + 2 * t + q % 2] = d[4 * j + q];
}
extern "C" __global__ void swz_k(const unsigned short* A, const unsigned short* B, float* D) {
  swz_run<NK, 0, 1, 0>(A, B, D);
}
extern "C" __global__ void swz_mn(const unsigned short* A, const unsigned short* B, float* D) {
  swz_run<NMN, 1, 1, 0>(A, B, D);
}
extern "C" __global__ void swz_declared_none(const unsigned short* A, const unsigned short* B, float* D) {
  swz_run<NK, 0, 0, 0>(A, B, D);
}
extern "C" __global__ void swz_off_atom(const unsigned short* A, const unsigned short* B, float* D) {
  swz_run<NK, 0, 1, 512>(A, B, D);
}
'''.replace("KK", str(K)).replace("NMN", str(N_MN)).replace("NK", str(N_K))
ARGS = [("const unsigned short*", "buffer")] * 2 + [("float*", "buffer")]
NAMES = ("swz_k", "swz_mn", "swz_declared_none", "swz_off_atom")
SMEM = 512 + 64 * K * 2 + max(N_K, N_MN) * K * 2


def _build(tag):
    return build_emu_module(tag, [CudaTestKernel(NAMES[0], SOURCE, ARGS, 128)] +
                            [CudaTestKernel(n, "", ARGS, 128) for n in NAMES[1:]], dynamic_smem=SMEM)


@pytest.fixture(scope="module")
def kernels():
    return _build("emu_test_swizzle_wgmma")


def _run(kern, n, rng):
    a = rng.standard_normal((64, K)).astype(BF16)
    b = rng.standard_normal((n, K)).astype(BF16)
    d = np.full((64, n), np.nan, np.float32)
    kern([a.view(np.uint16), b.view(np.uint16), d], [], [1])
    return d, a.astype(np.float64) @ b.astype(np.float64).T


@pytest.mark.parametrize("name,n", [("swz_k", N_K), ("swz_mn", N_MN)])
def test_swizzled_wgmma_matches_float64_matmul(kernels, rng, name, n):
    got, want = _run(kernels[name], n, rng)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_descriptor_without_swizzle_over_swizzled_tiles_is_wrong(kernels, rng):
    """Planted bug (a): the data is swizzled, the descriptor says layout type 0."""
    got, want = _run(kernels["swz_declared_none"], N_K, rng)
    assert not np.allclose(got, want, rtol=1e-3, atol=1e-2)


def test_swizzled_operand_off_its_atom_is_refused(kernels, rng):
    """Planted bug (c): a swizzled tile 512 bytes past a 1024-byte boundary (base offset 0)."""
    with pytest.raises(EmulationError, match=r"128-byte-swizzled operand A starts at shared address \d+, inside "
                                             r"its 8-row atom \(row 4\)"):
        _run(kernels["swz_off_atom"], N_K, rng)


def test_a_wrong_xor_pattern_in_the_emulator_is_caught(tmp_path, monkeypatch, rng):
    """Planted bug (b): the emulator's 128B pattern XORs with bits [7:8] only (row % 4).  The
    kernels above store the real pattern, so the emulated products go wrong."""
    tree = tmp_path / "emu_include"
    for i, src in enumerate(emu_backend.INCLUDE_DIRS):
        shutil.copytree(src, tree / str(i))
    header = tree / "1" / "kf" / "emu" / "swizzle.h"
    text = header.read_text()
    assert "case 128: return a ^ (((a >> 7) & 7u) << 4);" in text
    header.write_text(text.replace("case 128: return a ^ (((a >> 7) & 7u) << 4);",
                                   "case 128: return a ^ (((a >> 7) & 3u) << 4);"))
    monkeypatch.setattr(emu_backend, "INCLUDE_DIRS", tuple(str(tree / str(i)) for i in range(2)))
    mutated = _build("emu_test_swizzle_wgmma_wrong_xor")
    for name, n in (("swz_k", N_K), ("swz_mn", N_MN)):
        got, want = _run(mutated[name], n, rng)
        assert not np.allclose(got, want, rtol=1e-3, atol=1e-2), name
