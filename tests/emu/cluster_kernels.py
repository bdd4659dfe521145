"""Hand-written cluster kernels shared by the cluster tests (host emulation and the nvcc/SASS
check): a GEMM whose 2-CTA clusters share the A tile by TMA multicast, and a distributed
shared-memory exchange.  Comments ``KF_PLANT_*`` mark the lines the planted-bug tests mutate."""
from __future__ import annotations

import numpy as np

from kernforge.backends.cuda.cluster import ClusterPlan, plan_multicast
from kernforge.backends.cuda_emu.backend import HostParam

# C[M, N] (fp32) = A[M, K] @ B[K, N] (bf16).  Grid (gx, ceil(M / BM)) with gx = ceil(N / BN)
# rounded up to a multiple of the cluster: the CTAs of a cluster compute adjacent N blocks of
# the same rows, so they need the same A tile; CTA r loads rows [r * BM / CL, (r + 1) * BM / CL)
# of it and multicasts them to every CTA of the cluster.  A CTA whose N block is past N still
# loads and multicasts its half of A and takes part in every barrier (its B box is zero-filled
# and its stores are masked).  Ring of S stages: full[s] (one producer arrival + the stage's
# bytes, both halves of A included), empty[s] (one release from every CTA of the cluster: a
# CTA's multicast writes every CTA's stage, so a stage is free once all of them are done).
CLUSTER_GEMM = r'''
#include "kf/cluster.cuh"
#ifdef KF_HOST_EMULATION
#include <unistd.h>
#endif
constexpr int BM = 32, BN = 32, BK = 32, S = 2, CL = 2;
constexpr uint32_t kStageBytes = (BM * BK + BK * BN) * 2;  // KF_PLANT_EXPECT
extern "C" __global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(128, 1)
cgemm(float* C, int M, int N, int K, const __grid_constant__ CUtensorMap map_a,
      const __grid_constant__ CUtensorMap map_b) {
  KF_CTA_SMEM(smem);
  kf_bf16* a_s = reinterpret_cast<kf_bf16*>(smem);
  kf_bf16* b_s = reinterpret_cast<kf_bf16*>(smem + S * BM * BK * 2);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + S * (BM * BK + BK * BN) * 2);
  uint64_t* empty = full + S;
  const uint32_t rank = kf::cluster_ctarank();
  const int bx = blockIdx.x, by = blockIdx.y, tid = threadIdx.x;
  const int nk = (K + BK - 1) / BK;  // KF_PLANT_PADDED
  if (tid == 0) {
    for (int s = 0; s < S; ++s) {
      kf::mbarrier_init(full + s, 1);
      kf::mbarrier_init(empty + s, CL);
    }
    kf::mbarrier_init_fence();
  }
  kf::cluster_sync();  // KF_PLANT_START
  for (int k = 0; tid == 0 && k < nk && k < S; ++k) {
    kf::mbarrier_arrive_expect_tx(full + k, kStageBytes);
    kf::tma_load_2d_multicast(a_s + k * BM * BK + rank * (BM / CL) * BK, &map_a, k * BK, by * BM + rank * (BM / CL),
                              full + k, (1u << CL) - 1);
    kf::tma_load_2d(b_s + k * BK * BN, &map_b, bx * BN, k * BK, full + k);
  }
  const int row = tid / 4, col = (tid % 4) * 8;
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int k = 0; k < nk; ++k) {
    const int s = k % S;
    kf::mbarrier_wait_parity(full + s, (k / S) & 1);
#ifdef KF_HOST_EMULATION
    if (rank == 0 && tid == 0) usleep(20000);  // CTA 0 reads each stage late: an early refill by its peer shows
#endif
    const kf_bf16* a = a_s + s * BM * BK + row * BK;
    const kf_bf16* b = b_s + s * BK * BN + col;
    for (int kk = 0; kk < BK; ++kk)
      for (int j = 0; j < 8; ++j) acc[j] += kf_to_float(a[kk]) * kf_to_float(b[kk * BN + j]);
    __syncthreads();
    if (tid == 0) {
      for (int r = 0; r < CL; ++r) kf::mbarrier_arrive_cluster(empty + s, r);  // KF_PLANT_RELEASE
      const int next = k + S;
      if (next < nk) {
        kf::mbarrier_wait_parity(empty + s, (k / S) & 1);
        kf::mbarrier_arrive_expect_tx(full + s, kStageBytes);
        kf::tma_load_2d_multicast(a_s + s * BM * BK + rank * (BM / CL) * BK, &map_a, next * BK,
                                  by * BM + rank * (BM / CL), full + s, (1u << CL) - 1);
        kf::tma_load_2d(b_s + s * BK * BN, &map_b, bx * BN, next * BK, full + s);
      }
    }
  }
  const int m = by * BM + row;
  for (int j = 0; j < 8; ++j) {
    const int n = bx * BN + col + j;
    if (m < M && n < N) C[(int64_t)m * N + n] = acc[j];
  }
  kf::cluster_sync();  // KF_PLANT_EXIT
}
'''
GEMM_BM, GEMM_BN, GEMM_BK, GEMM_CLUSTER = 32, 32, 32, 2
GEMM_SMEM = 2 * (32 * 32 + 32 * 32) * 2 + 4 * 8  # two stages of A and B tiles, four mbarriers
GEMM_PARAMS = [HostParam("float*", "buffer")] + [HostParam("int", "scalar")] * 3 + \
    [HostParam("CUtensorMap", "tensormap")] * 2

# Distributed shared memory: CTA r writes 1000 * (r + 1) + tid into its own shared word tid, the
# cluster syncs, and each thread reads word tid of CTA r ^ 1 through a mapa'd pointer.  CTA 1 is
# slowed down before it writes (host emulation only), so a cluster barrier that does not wait
# shows as poisoned reads.
DSMEM_EXCHANGE = r'''
#include "kf/cluster.cuh"
#ifdef KF_HOST_EMULATION
#include <unistd.h>
#endif
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(64, 1) dsmem(int* out) {
  KF_CTA_SMEM(smem);
  int* mine = reinterpret_cast<int*>(smem);
  const uint32_t rank = kf::cluster_ctarank();
#ifdef KF_HOST_EMULATION
  if (rank == 1) usleep(20000);
#endif
  mine[threadIdx.x] = 1000 * int(rank + 1) + int(threadIdx.x);
  kf::cluster_sync();
  const int* peer = kf::map_shared_rank(mine, rank ^ 1u);
  out[blockIdx.x * blockDim.x + threadIdx.x] = peer[threadIdx.x] + 100000 * int(kf::cluster_nctarank());
  kf::cluster_sync();
}
'''

# Named barriers are per CTA: in each CTA threads 32..63 read what threads 0..31 wrote behind
# `bar.sync 1, 64`.  CTA 1's readers arrive first, CTA 0 20 ms later, CTA 1's writers 50 ms later
# (host emulation only), so one barrier shared by the cluster's CTAs releases CTA 1's readers
# with CTA 0's threads, before their data is written.
NAMED_BARRIER = r'''
#include "kf/cluster.cuh"
#include "kf/fence.cuh"
#ifdef KF_HOST_EMULATION
#include <unistd.h>
#endif
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(64, 1) nbar(int* out) {
  KF_CTA_SMEM(smem);
  int* w = reinterpret_cast<int*>(smem);
  const uint32_t rank = kf::cluster_ctarank();
#ifdef KF_HOST_EMULATION
  if (rank == 0) usleep(20000);
  if (rank == 1 && threadIdx.x < 32) usleep(50000);
#endif
  if (threadIdx.x < 32) w[threadIdx.x] = 100 * int(rank + 1) + int(threadIdx.x);
  kf::named_barrier_sync(1, 64);
  if (threadIdx.x >= 32) out[blockIdx.x * 32 + threadIdx.x - 32] = w[threadIdx.x - 32];
  kf::cluster_sync();
}
'''


def tensor_map(arr: np.ndarray, box: tuple[int, int]) -> np.ndarray:
    """The packed 2-D tensor map (``cuda_tma.TensorMapArgs.packed``) of a row-major matrix: box
    ``(columns, rows)``, no swizzle."""
    rows, cols = arr.shape
    return np.array([2, arr.itemsize, arr.ctypes.data, cols, rows, cols * arr.itemsize, box[0], box[1], 0], np.int64)


def gemm_plan(M: int, N: int, arch: str = "sm_90a") -> ClusterPlan:
    """The cluster plan of CLUSTER_GEMM's grid: A's BM x BK bf16 tile is the shared one."""
    return plan_multicast(arch, (-(-N // GEMM_BN), -(-M // GEMM_BM)), GEMM_BM, GEMM_BK * 2, size=GEMM_CLUSTER)


def gemm_args(A: np.ndarray, B: np.ndarray, C: np.ndarray) -> list:
    """CLUSTER_GEMM's arguments; A's tensor map box is one CTA's slice of the shared tile."""
    M, K = A.shape
    N = B.shape[1]
    plan = gemm_plan(M, N)
    return [C, np.array(M, np.int32), np.array(N, np.int32), np.array(K, np.int32),
            tensor_map(A, (GEMM_BK, plan.slice_rows)), tensor_map(B, (GEMM_BN, GEMM_BK))]
