"""Native fp8 wgmma (``kf::wgmma_m64nNk32_f32_e4m3``, sm_90a ``QGMMA``) on host emulation, and
its SASS.

The kernel restates the PTX ISA's 8-bit K-major canonical layout itself (core matrices of 8
rows x 16 bytes), so an emulator that reads the operands in another order (K halves swapped,
the wrong element type, a 16-wide K step) computes a different product than float64 numpy.
"""
from __future__ import annotations

import os
import shutil
import subprocess

import ml_dtypes
import numpy as np
import pytest

from kernforge.backends.cuda.renderer import INCLUDE_DIR

from .conftest import CudaTestKernel, build_emu_module

E4M3 = ml_dtypes.float8_e4m3fn
K = 64  # two k32 instructions, so the descriptor's K step is exercised

SOURCE = r'''
#include "kf/wgmma.cuh"
// D(64xN) = A(64xK) * B(KxN), A stored M x K, B stored N x K (both K-major), fp8 bytes placed in
// 8 x 16-byte core matrices: element (r, c) at ((r/8) * (K/16) + c/16) * 128 + (r%8) * 16 + c%16.
// SWAP_HALVES plants a layout bug in the *kernel* (the two 16-K halves of every 32-K step
// exchanged), which the emulated product must expose.
template <int N, int SWAP_HALVES>
__device__ void fp8_run(const unsigned char* A, const unsigned char* B, float* D) {
  extern __shared__ __align__(128) unsigned char kf_smem[];
  unsigned char* sA = kf_smem;
  unsigned char* sB = sA + 64 * KK;
  const int tid = threadIdx.x;
  for (int i = tid; i < 64 * KK; i += 128) {
    const int r = i / KK, c0 = i % KK, c = SWAP_HALVES ? (c0 ^ 16) : c0;
    sA[((r / 8) * (KK / 16) + c / 16) * 128 + (r % 8) * 16 + c % 16] = A[i];
  }
  for (int i = tid; i < N * KK; i += 128) {
    const int n = i / KK, c = i % KK;
    sB[((n / 8) * (KK / 16) + c / 16) * 128 + (n % 8) * 16 + c % 16] = B[i];
  }
  kf::fence_proxy_async();
  __syncthreads();
  float d[N / 2];
  for (int i = 0; i < N / 2; ++i) d[i] = 100.0f;
  kf::wgmma_fence_operand(d);
  kf::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < KK / 32; ++kk) {  // one k32 step = two core matrices along K = 256 bytes
    const uint64_t da = kf::make_smem_desc(sA + kk * 256, 128, (KK / 16) * 128);
    const uint64_t db = kf::make_smem_desc(sB + kk * 256, 128, (KK / 16) * 128);
    kf::wgmma_m64nNk32_f32_e4m3<N>(d, da, db, kk > 0);  // the first drops the 100s
  }
  kf::wgmma_commit();
  kf::wgmma_wait<0>();
  kf::wgmma_fence_operand(d);
  const int w = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  for (int j = 0; j < N / 8; ++j)
    for (int q = 0; q < 4; ++q) D[(16 * w + g + 8 * (q / 2)) * N + 8 * j + 2 * t + q % 2] = d[4 * j + q];
}
extern "C" __global__ void fp8_wgmma(const unsigned char* A, const unsigned char* B, float* D) { fp8_run<24, 0>(A, B, D); }
extern "C" __global__ void fp8_wgmma_swapped(const unsigned char* A, const unsigned char* B, float* D) {
  fp8_run<24, 1>(A, B, D);
}
'''.replace("KK", str(K))
N = 24
ARGS = [("const unsigned char*", "buffer")] * 2 + [("float*", "buffer")]


@pytest.fixture(scope="module")
def kernels():
    return build_emu_module("emu_test_fp8_wgmma", [CudaTestKernel("fp8_wgmma", SOURCE, ARGS, 128),
                                                   CudaTestKernel("fp8_wgmma_swapped", "", ARGS, 128)],
                            dynamic_smem=64 * K + N * K)


def _operands(rng):
    """Random e4m3 operands over the format's range (normals, subnormals, zeros, both signs)."""
    a = (rng.standard_normal((64, K)) * 4).astype(E4M3)
    b = (rng.standard_normal((N, K)) * 4).astype(E4M3)
    a[0, :5] = np.array([0.0, -0.0, 2.0 ** -9, 448.0, -448.0], dtype=np.float32).astype(E4M3)  # subnormal, max
    return a, b


def _run(kern, a, b):
    d = np.full((64, N), np.nan, np.float32)
    kern([a.view(np.uint8), b.view(np.uint8), d], [], [1])
    return d


def test_fp8_wgmma_matches_float64_matmul(rng, kernels):
    for _ in range(2):
        a, b = _operands(rng)
        ref = a.astype(np.float64) @ b.astype(np.float64).T
        np.testing.assert_allclose(_run(kernels["fp8_wgmma"], a, b), ref, rtol=1e-5, atol=1e-4)


def test_fp8_wgmma_reads_the_isa_layout(rng, kernels):
    """A kernel that stores the K halves swapped gets a different product; bytes read as
    another element type (e5m2) or as bf16-shadow pairs would not match float64 e4m3 either."""
    a, b = _operands(rng)
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    assert not np.allclose(_run(kernels["fp8_wgmma_swapped"], a, b), ref, rtol=1e-3, atol=1e-2)
    as_e5m2 = a.view(np.uint8).view(ml_dtypes.float8_e5m2).astype(np.float64) @ \
        b.view(np.uint8).view(ml_dtypes.float8_e5m2).astype(np.float64).T
    got = _run(kernels["fp8_wgmma"], a, b)
    assert not np.allclose(got, as_e5m2, rtol=1e-3, atol=1e-2)
    # one-hot: A(m, k) * B(n, k) lands at D(m, n) only, for k in each 16-byte half of both k32 steps
    for m, k, n in [(0, 0, 0), (37, 17, 5), (63, 33, 23), (8, 63, 9)]:
        a1 = np.zeros((64, K), E4M3)
        b1 = np.zeros((N, K), E4M3)
        a1[m, k], b1[n, k] = 3.0, -0.5
        want = np.zeros((64, N))
        want[m, n] = -1.5
        np.testing.assert_array_equal(_run(kernels["fp8_wgmma"], a1, b1), want)


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_fp8_wgmma_is_qgmma_in_sass(tmp_path):
    """The same device code compiled for sm_90a is a native fp8 tensor-core instruction."""
    from kernforge.backends.cuda.backend import disassemble

    src = tmp_path / "fp8.cu"
    src.write_text('#include <cstdint>\n#include "kf/common.cuh"\n' + SOURCE)
    cubin = tmp_path / "fp8.cubin"
    subprocess.run(["nvcc", "-O3", "-std=c++17", "--expt-relaxed-constexpr", "-cubin", "-arch=sm_90a",
                    f"-I{INCLUDE_DIR}", "-o", str(cubin), str(src)], check=True, capture_output=True, text=True)
    sass = disassemble(str(cubin))
    assert "QGMMA.64x24x32.F32.E4M3.E4M3" in sass
    # two kernels x K/32 instructions, no bf16 tensor-core instruction
    assert sass.count("QGMMA.") == 2 * (K // 32) and "HGMMA" not in sass
