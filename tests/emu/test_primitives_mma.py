"""mma.sync, ldmatrix and wgmma emulation against plain matrix products.

The kernels here restate the PTX ISA fragment maps themselves (which element
each lane's register holds), so a wrong map in the emulator shows up as a wrong
product or a wrong register dump.
"""
import ml_dtypes
import numpy as np
import pytest

from .conftest import CudaTestKernel, build_emu_module

BF16 = ml_dtypes.bfloat16

MMA_DIRECT = r'''
#include "kf/mma.cuh"
// A: 16x16 row-major, B: 16x8 row-major (k, n), C: 16x8 f32 in, D: 16x8 f32 out.
__device__ uint32_t pack16(const unsigned short* p0, const unsigned short* p1) {
  return uint32_t(*p0) | (uint32_t(*p1) << 16);
}
extern "C" __global__ void mma_direct(const unsigned short* A, const unsigned short* B, const float* C, float* D) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  uint32_t a[4], b[2];
  // PTX ISA m16n8k16 .bf16 A fragment: a0,a1:(g,2t..) a2,a3:(g+8,2t..) a4,a5:(g,2t+8..) a6,a7:(g+8,2t+8..)
  a[0] = pack16(&A[g * 16 + 2 * t], &A[g * 16 + 2 * t + 1]);
  a[1] = pack16(&A[(g + 8) * 16 + 2 * t], &A[(g + 8) * 16 + 2 * t + 1]);
  a[2] = pack16(&A[g * 16 + 2 * t + 8], &A[g * 16 + 2 * t + 9]);
  a[3] = pack16(&A[(g + 8) * 16 + 2 * t + 8], &A[(g + 8) * 16 + 2 * t + 9]);
  // B fragment: b0,b1:(k=2t..2t+1, n=g) b2,b3:(k=2t+8..2t+9, n=g)
  b[0] = pack16(&B[(2 * t) * 8 + g], &B[(2 * t + 1) * 8 + g]);
  b[1] = pack16(&B[(2 * t + 8) * 8 + g], &B[(2 * t + 9) * 8 + g]);
  float c[4] = {C[g * 8 + 2 * t], C[g * 8 + 2 * t + 1], C[(g + 8) * 8 + 2 * t], C[(g + 8) * 8 + 2 * t + 1]};
  float d[4];
  kf::mma_m16n8k16_f32_bf16(d, a, b, c);
  D[g * 8 + 2 * t] = d[0];
  D[g * 8 + 2 * t + 1] = d[1];
  D[(g + 8) * 8 + 2 * t] = d[2];
  D[(g + 8) * 8 + 2 * t + 1] = d[3];
}
'''
P4 = [("const unsigned short*", "buffer")] * 2 + [("const float*", "buffer"), ("float*", "buffer")]
U16 = ("const unsigned short*", "buffer")


def test_mma_m16n8k16_fragments_match_matmul(rng, kernels):
    kern = kernels["mma_direct"]
    for trial in range(3):
        A = rng.standard_normal((16, 16)).astype(BF16)
        B = rng.standard_normal((16, 8)).astype(BF16)
        C = rng.standard_normal((16, 8)).astype(np.float32)
        D = np.full((16, 8), np.nan, np.float32)
        kern([A.view(np.uint16), B.view(np.uint16), C, D], [], [1])
        ref = A.astype(np.float64) @ B.astype(np.float64) + C
        np.testing.assert_allclose(D, ref, rtol=1e-6, atol=1e-5)


def test_mma_one_hot_lands_in_the_right_lane(kernels):
    """A single nonzero A(m,k)*B(k,n) product must appear at D(m,n) only."""
    kern = kernels["mma_direct"]
    for m, k, n in [(0, 0, 0), (9, 3, 5), (15, 15, 7), (7, 8, 1), (8, 9, 6)]:
        A = np.zeros((16, 16), BF16)
        B = np.zeros((16, 8), BF16)
        A[m, k] = 3.0
        B[k, n] = 5.0
        C = np.zeros((16, 8), np.float32)
        D = np.full((16, 8), np.nan, np.float32)
        kern([A.view(np.uint16), B.view(np.uint16), C, D], [], [1])
        want = np.zeros((16, 8), np.float32)
        want[m, n] = 15.0
        np.testing.assert_array_equal(D, want)


LDMATRIX = r'''
#include "kf/mma.cuh"
// S: 32 rows x 8 u16 (four 8x8 matrices stacked); out[lane][0..3] normal, out[lane][4..7] trans.
extern "C" __global__ void ldmatrix_dump(const unsigned short* S, unsigned* out) {
  extern __shared__ __align__(128) unsigned char kf_smem[];
  unsigned short* tile = reinterpret_cast<unsigned short*>(kf_smem);
  for (int i = threadIdx.x; i < 32 * 8; i += blockDim.x) tile[i] = S[i];
  __syncthreads();
  const int lane = threadIdx.x % 32;
  uint32_t r[4], rt[4], r2[2], r1[1];
  kf::ldmatrix_x4(r, &tile[lane * 8]);
  kf::ldmatrix_x4_trans(rt, &tile[lane * 8]);
  kf::ldmatrix_x2(r2, &tile[(lane % 16) * 8]);
  kf_emu::ldmatrix<1>(r1, &tile[(lane % 8) * 8], false);  // .x1: not in the device library, emulated all the same
  for (int q = 0; q < 4; ++q) { out[lane * 11 + q] = r[q]; out[lane * 11 + 4 + q] = rt[q]; }
  out[lane * 11 + 8] = r2[0];
  out[lane * 11 + 9] = r2[1];
  out[lane * 11 + 10] = r1[0];
}
'''


def test_ldmatrix_register_contents(kernels):
    kern = kernels["ldmatrix_dump"]
    S = (np.arange(32 * 8, dtype=np.uint16) * 7 + 3).reshape(32, 8)
    out = np.full((32, 11), 0xDEADBEEF, np.uint32)
    kern([S, out], [], [1])
    mats = S.reshape(4, 8, 8)  # matrix q row r = S[8q + r]

    def pair(lo, hi):
        return np.uint32(lo) | (np.uint32(hi) << np.uint32(16))

    for lane in range(32):
        for q in range(4):
            # PTX ISA ldmatrix: lane holds (row lane/4, cols 2*(lane%4)..+1); .trans: the transpose.
            assert out[lane, q] == pair(mats[q, lane // 4, 2 * (lane % 4)], mats[q, lane // 4, 2 * (lane % 4) + 1])
            assert out[lane, 4 + q] == pair(mats[q, 2 * (lane % 4), lane // 4], mats[q, 2 * (lane % 4) + 1, lane // 4])
        assert out[lane, 8] == pair(mats[0, lane // 4, 2 * (lane % 4)], mats[0, lane // 4, 2 * (lane % 4) + 1])
        assert out[lane, 9] == pair(mats[1, lane // 4, 2 * (lane % 4)], mats[1, lane // 4, 2 * (lane % 4) + 1])
        assert out[lane, 10] == pair(mats[0, lane // 4, 2 * (lane % 4)], mats[0, lane // 4, 2 * (lane % 4) + 1])


LDMATRIX_GEMM = r'''
#include "kf/mma.cuh"
// C(32x16) = A(32x32, row-major) * B(32x16, row-major), 4 warps each owning a 16x8 tile:
// A fragments through ldmatrix.x4, B fragments through ldmatrix.x2.trans (B is k-major rows).
extern "C" __global__ void ldmatrix_gemm(const unsigned short* A, const unsigned short* B, float* C) {
  extern __shared__ __align__(128) unsigned char kf_smem[];
  unsigned short* sA = reinterpret_cast<unsigned short*>(kf_smem);
  unsigned short* sB = sA + 32 * 32;
  for (int i = threadIdx.x; i < 32 * 32; i += blockDim.x) sA[i] = A[i];
  for (int i = threadIdx.x; i < 32 * 16; i += blockDim.x) sB[i] = B[i];
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int m0 = (warp / 2) * 16, n0 = (warp % 2) * 8;
  float acc[4] = {0, 0, 0, 0};
  for (int k0 = 0; k0 < 32; k0 += 16) {
    uint32_t a[4], b[2];
    kf::ldmatrix_x4(a, &sA[(m0 + lane % 16) * 32 + k0 + (lane / 16) * 8]);
    kf::ldmatrix_x2_trans(b, &sB[(k0 + lane % 16) * 16 + n0]);
    kf::mma_m16n8k16_f32_bf16(acc, a, b, acc);
  }
  C[(m0 + g) * 16 + n0 + 2 * t] = acc[0];
  C[(m0 + g) * 16 + n0 + 2 * t + 1] = acc[1];
  C[(m0 + g + 8) * 16 + n0 + 2 * t] = acc[2];
  C[(m0 + g + 8) * 16 + n0 + 2 * t + 1] = acc[3];
}
'''


def test_ldmatrix_feeds_mma_gemm(rng, kernels):
    kern = kernels["ldmatrix_gemm"]
    A = rng.standard_normal((32, 32)).astype(BF16)
    B = rng.standard_normal((32, 16)).astype(BF16)
    C = np.full((32, 16), np.nan, np.float32)
    kern([A.view(np.uint16), B.view(np.uint16), C], [], [1])
    np.testing.assert_allclose(C, A.astype(np.float64) @ B.astype(np.float64), rtol=1e-5, atol=1e-5)


WGMMA = r'''
#include "kf/wgmma.cuh"
// D(64xN) = A(64x16) * B(16xN); A stored K-major (M x K), B K-major (N x K) or, with TB, MN-major (K x N),
// both in kernforge's core-matrix order (kf/wgmma.cuh).
template <int N, int TB>
__device__ void wgmma_run(const unsigned short* A, const unsigned short* B, float* D) {
  extern __shared__ __align__(128) unsigned char kf_smem[];
  unsigned short* sA = reinterpret_cast<unsigned short*>(kf_smem);
  unsigned short* sB = sA + 64 * 16;
  const int tid = threadIdx.x;
  __syncthreads();  // the previous call's wgmma reads (done at its wait) precede these writes
  for (int i = tid; i < 64 * 16; i += 128) {
    const int r = i / 16, c = i % 16;  // A(r, c), K = 16 -> 2 core matrices along K
    sA[((r / 8) * 2 + c / 8) * 64 + (r % 8) * 8 + c % 8] = A[i];
  }
  for (int i = tid; i < N * 16; i += 128) {
    if (TB == 0) {  // B^T stored N x K
      const int n = i / 16, c = i % 16;
      sB[((n / 8) * 2 + c / 8) * 64 + (n % 8) * 8 + c % 8] = B[c * N + n];
    } else {        // stored K x N, core matrices with rows along K
      const int kk = i / N, n = i % N;
      sB[((kk / 8) * (N / 8) + n / 8) * 64 + (kk % 8) * 8 + n % 8] = B[i];
    }
  }
  kf::fence_proxy_async();
  __syncthreads();
  float d[N / 2];
  for (int i = 0; i < N / 2; ++i) d[i] = 100.0f;
  const uint64_t da = kf::make_smem_desc(sA, 128, 2 * 128);
  const uint64_t db = TB == 0 ? kf::make_smem_desc(sB, 128, 2 * 128) : kf::make_smem_desc(sB, (N / 8) * 128, 128);
  kf::wgmma_fence();
  kf::wgmma_m64nNk16_f32_bf16<N, 0, TB>(d, da, db, 0);
  kf::wgmma_commit();
  kf::wgmma_wait<0>();
  const int w = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  for (int j = 0; j < N / 8; ++j)
    for (int q = 0; q < 4; ++q) D[(16 * w + g + 8 * (q / 2)) * N + 8 * j + 2 * t + q % 2] = d[4 * j + q];
}
extern "C" __global__ void wgmma_desc(const unsigned short* A, const unsigned short* B, float* D, float* D2) {
  wgmma_run<16, 0>(A, B, D);
  wgmma_run<16, 1>(A, B, D2);
}
'''


def test_wgmma_descriptors_and_accumulator_layout(rng, kernels):
    kern = kernels["wgmma_desc"]
    A = rng.standard_normal((64, 16)).astype(BF16)
    B = rng.standard_normal((16, 16)).astype(BF16)
    D = np.full((64, 16), np.nan, np.float32)
    D2 = np.full((64, 16), np.nan, np.float32)
    kern([A.view(np.uint16), B.view(np.uint16), D, D2], [], [1])
    ref = A.astype(np.float64) @ B.astype(np.float64)
    np.testing.assert_allclose(D, ref, rtol=1e-5, atol=1e-5)  # scale_d = 0 dropped the 100s
    np.testing.assert_allclose(D2, ref, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def kernels():
    return build_emu_module("emu_test_mma", [
        CudaTestKernel("mma_direct", MMA_DIRECT, P4, 32),
        CudaTestKernel("ldmatrix_dump", LDMATRIX, [U16, ("unsigned*", "buffer")], 32),
        CudaTestKernel("ldmatrix_gemm", LDMATRIX_GEMM, [U16, U16, ("float*", "buffer")], 128),
        CudaTestKernel("wgmma_desc", WGMMA, [U16, U16, ("float*", "buffer"), ("float*", "buffer")], 128),
    ], dynamic_smem=4096)
