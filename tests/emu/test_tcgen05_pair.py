"""sm_100a 2-CTA MMA (issue 21 item 6): ``tcgen05.mma.cta_group::2`` over a cluster of two CTAs on
host emulation, against float64 numpy, with the pair forms of ``tcgen05.alloc/dealloc`` and the
multicast ``tcgen05.commit`` (kf/tcgen05.cuh's ``*_cg2``, kf/emu/tcgen05.h).

The kernel restates DeepGEMM's SM100 2-CTA shape itself: a pair of CTAs (cluster rank r and
r ^ 1) computes D[256 x N]; each CTA holds its 128 rows of A and N/2 rows of B^T (K-major, 8 x
16-byte core matrices) in its own shared memory, at the same offsets; the even CTA's thread 0
issues one M = 256 MMA per 32 bytes of K (descriptor ``tcgen05.instr_desc(cta_group=2)``) and
commits with ``.multicast::cluster`` mask 0b11, so both CTAs' barriers complete; each CTA reads
its 128 rows back from its own TMEM.  Two K tiles refill the same stage, so the result also
depends on the accumulate flag and on the MMA wait before the refill.

Planted bugs: in the kernel (a commit without the multicast mask: the odd CTA never completes
and the launch must report a deadlock, not hang; the odd CTA never joins the collective alloc;
a cta_group::1 commit in a cta_group::2 kernel; each CTA loading the same half of B: a wrong
result; the odd CTA writing its A tile between the issue and the completion of the MMA: the
operand digest must report it); and in the emulator, rebuilt from a copied include tree (B's halves swapped, A's rows
all from the issuing CTA, both halves of D in the even CTA's TMEM, the multicast commit
arriving on the issuer only, one TMEM for the whole cluster).  "CUDA semantics verified on host
emulation", never GPU verified.
"""
from __future__ import annotations

import re
import shutil

import ml_dtypes
import numpy as np
import pytest

from kernforge import dtypes
from kernforge.backends.cuda import tcgen05
from kernforge.backends.cuda_emu import backend as emu_backend
from kernforge.backends.cuda_emu.backend import (EmulatedModule, EmulationError, HostParam, cluster_smem_bytes,
                                                 emu_source)

BF16, E4M3 = ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn
DEADLOCK_MS = 3000  # the planted deadlocks' wait bound; every other kernel keeps the default 20 s

SOURCE = r'''
#include "kf/tcgen05.cuh"
#include "kf/cluster.cuh"
#include "kf/tma.cuh"
#include "kf/fence.cuh"
// D[M x N] = A[M x K] B[N x K]^T; A, B in ES-byte elements (bf16 or e4m3), 128-byte K tiles.
// CTA pair p = blockIdx.x / 2 computes rows 256 p .. 256 p + 255.
// PLANT: 0 none, 1 every CTA loads B's first half, 2 the odd CTA never allocates, 3 commit without
// the multicast mask, 4 a cta_group::1 commit, 5 the odd CTA writes its A tile while the MMA is in
// flight (after the issue: the cluster barrier orders it; before the wait that completes the MMA).
template <int ES, int N, uint32_t IDESC, int PLANT>
__device__ void pair_run(const unsigned char* A, const unsigned char* B, float* D, int K) {
  KF_CTA_SMEM(smem);
  constexpr int COLS = N <= 32 ? 32 : N <= 64 ? 64 : N <= 128 ? 128 : 256;
  unsigned char* sA = smem;                // 128 rows x 128 bytes, 8 x 16-byte core matrices
  unsigned char* sB = sA + 128 * 128;      // N / 2 rows of B^T, same layout
  uint64_t* bar = reinterpret_cast<uint64_t*>(sB + (N / 2) * 128);
  uint32_t* slot = reinterpret_cast<uint32_t*>(bar + 1);
  const uint32_t rank = kf::cluster_ctarank(), odd = rank & 1u;
  const int tid = threadIdx.x, row_bytes = K * ES;
  const int m0 = int(blockIdx.x / 2) * 256 + 128 * int(odd);
  const int n0 = PLANT == 1 ? 0 : (N / 2) * int(odd);
  const bool allocates = !(PLANT == 2 && odd);
  if (tid < 32 && allocates) {
    kf::tmem_alloc_cg2(slot, COLS);
    kf::tmem_relinquish_alloc_permit_cg2();
  }
  if (tid == 0) {
    kf::mbarrier_init(bar, 1);
    kf::mbarrier_init_fence();
  }
  kf::tcgen05_fence_before();
  kf::cluster_sync();  // both CTAs: barriers initialised, TMEM allocated
  kf::tcgen05_fence_after();
  const uint32_t tmem = *slot;
  for (int kt = 0; kt < row_bytes / 128; ++kt) {
    for (int i = tid; i < 128 * 128; i += blockDim.x) {
      const int r = i / 128, c = i % 128;
      sA[((r / 8) * 8 + c / 16) * 128 + (r % 8) * 16 + c % 16] = A[size_t(m0 + r) * row_bytes + kt * 128 + c];
    }
    for (int i = tid; i < (N / 2) * 128; i += blockDim.x) {
      const int r = i / 128, c = i % 128;
      sB[((r / 8) * 8 + c / 16) * 128 + (r % 8) * 16 + c % 16] = B[size_t(n0 + r) * row_bytes + kt * 128 + c];
    }
    kf::fence_proxy_async();  // generic stores, read by the async proxy (tcgen05.mma)
    kf::cluster_sync();       // both CTAs' tiles are in place before the pair MMA reads them
    if (odd == 0 && tid == 0) {
      kf::tcgen05_fence_after();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)  // 32 bytes of K per MMA: 16 bf16 or 32 e4m3
        if constexpr (ES == 2)
          kf::tcgen05_mma_f16_cg2(tmem, kf::make_umma_desc(sA + 256 * kk, 128, 1024),
                                  kf::make_umma_desc(sB + 256 * kk, 128, 1024), IDESC, kt > 0 || kk > 0);
        else
          kf::tcgen05_mma_f8f6f4_cg2(tmem, kf::make_umma_desc(sA + 256 * kk, 128, 1024),
                                     kf::make_umma_desc(sB + 256 * kk, 128, 1024), IDESC, kt > 0 || kk > 0);
      if constexpr (PLANT == 3) kf::tcgen05_commit_cg2(bar);
      else if constexpr (PLANT == 4) kf::tcgen05_commit(bar);
      else kf::tcgen05_commit_cg2_multicast(bar, 0x3);
    }
    if constexpr (PLANT == 5) {  // after the issue (the first barrier), before any wait (the second)
      kf::cluster_sync();
      if (odd) sA[tid] = 0;
      kf::cluster_sync();
    }
    kf::mbarrier_wait_parity(bar, uint32_t(kt & 1));  // the MMAs are done: the stage may be refilled
    kf::tcgen05_fence_after();
  }
  const int w = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  for (int half = 0; half < 2; ++half) {  // M = 256 over the pair: row r % 128 in lane r % 128
    float d[N / 2];
    kf::tmem_ld_16x256b<N / 8>(d, tmem + (uint32_t(32 * w + 16 * half) << 16));
    kf::tmem_wait_ld();
    for (int j = 0; j < N / 8; ++j)
      for (int q = 0; q < 4; ++q)
        D[size_t(m0 + 32 * w + 16 * half + g + 8 * (q / 2)) * N + 8 * j + 2 * t + q % 2] = d[4 * j + q];
  }
  kf::tcgen05_fence_before();
  kf::cluster_sync();  // both CTAs done with TMEM and with each other
  if (tid < 32 && allocates) {
    kf::tcgen05_fence_after();
    kf::tmem_dealloc_cg2(tmem, COLS);
  }
}
'''

# The protocol a generated 2-CTA GEMM follows, with TMA and a ring (DeepGEMM's SM100 shape): D[M x N]
# fp32 = A[M x K] B[N x K]^T, bf16, K-major.  Grid (2 * ceil(M / 256), ceil(N / PBN)), cluster 2
# along x: CTA 2p + r loads rows 256 p + 128 r .. + 127 of A and rows PBN y + (PBN / 2) r .. of B
# (its half of the pair's B tile), 128-byte-swizzled boxes, into stage s of its own shared
# memory with its own full[s] barrier.  The odd CTA's thread 0 waits for its full[s] and arrives
# on the even CTA's ready[s] (mapa + remote arrive); the even CTA's thread 0 waits for its own
# full[s] and ready[s], issues the pair MMAs and commits them with multicast 0b11 to done[s] of
# both CTAs; each CTA's thread 0 waits done[s] before refilling stage s.  RING_PLANT: 1 the
# leader does not wait for the peer's tile, 2 the peer arrives on its own ready[s], 3 a stage is
# refilled without waiting for the MMAs that read it.
PAIR_RING = r"""
#ifdef KF_HOST_EMULATION
#include <unistd.h>
#endif
constexpr int PBN = 128, PBK = 64, PS = 2;  // pair N tile, K tile (128 bytes of bf16), stages
constexpr uint32_t kPairStage = (128 + PBN / 2) * PBK * 2;
template <int RING_PLANT>
__device__ void pair_ring_run(float* D, int M, int N, int K, const CUtensorMap* map_a, const CUtensorMap* map_b) {
  KF_CTA_SMEM(smem);
  unsigned char* sa = smem;                            // PS x 128 rows x 128 bytes, 1024-aligned
  unsigned char* sb = sa + PS * 128 * 128;             // PS x PBN / 2 rows x 128 bytes
  uint64_t* full = reinterpret_cast<uint64_t*>(sb + PS * (PBN / 2) * 128);
  uint64_t* ready = full + PS;  // used in the even CTA: the odd CTA's tile of the stage landed
  uint64_t* done = ready + PS;  // the pair MMAs reading the stage completed (multicast commit)
  uint32_t* slot = reinterpret_cast<uint32_t*>(done + PS);
  const uint32_t rank = kf::cluster_ctarank(), odd = rank & 1u, even = rank & ~1u;
  const int tid = threadIdx.x, nk = (K + PBK - 1) / PBK;
  const int m0 = int(blockIdx.x / 2) * 256 + 128 * int(odd), nb = int(blockIdx.y) * PBN + (PBN / 2) * int(odd);
  if (tid < 32) {
    kf::tmem_alloc_cg2(slot, PBN);
    kf::tmem_relinquish_alloc_permit_cg2();
  }
  if (tid == 0) {
    for (int s = 0; s < PS; ++s) {
      kf::mbarrier_init(full + s, 1);
      kf::mbarrier_init(ready + s, 1);
      kf::mbarrier_init(done + s, 1);
    }
    kf::mbarrier_init_fence();
  }
  kf::tcgen05_fence_before();
  kf::cluster_sync();
  kf::tcgen05_fence_after();
  const uint32_t tmem = *slot;
  if (tid == 0) {
    for (int k = 0; k < nk && k < PS; ++k) {
      kf::mbarrier_arrive_expect_tx(full + k, kPairStage);
      kf::tma_load_2d(sa + k * 128 * 128, map_a, k * PBK, m0, full + k);
      kf::tma_load_2d(sb + k * (PBN / 2) * 128, map_b, k * PBK, nb, full + k);
    }
    for (int k = 0; k < nk; ++k) {
      const int s = k % PS;
      const uint32_t ph = uint32_t(k / PS) & 1u;
#ifdef KF_HOST_EMULATION
      if (odd) usleep(k == 0 ? 20000 : 2000);  // the peer's tiles land late: an issue not waiting for them shows
#endif
      kf::mbarrier_wait_parity(full + s, ph);
      if (odd) {
        kf::mbarrier_arrive_cluster(ready + s, RING_PLANT == 2 ? rank : even);
      } else {
        if (RING_PLANT != 1) kf::mbarrier_wait_parity(ready + s, ph);
        kf::tcgen05_fence_after();
#pragma unroll
        for (int kk = 0; kk < PBK / 16; ++kk)  // start: byte 32 kk of row 0 (unswizzled address)
          kf::tcgen05_mma_f16_cg2(tmem, kf::make_umma_desc(sa + s * 128 * 128 + 32 * kk, 16, 1024, 2),
                                  kf::make_umma_desc(sb + s * (PBN / 2) * 128 + 32 * kk, 16, 1024, 2), PAIR_IDESC,
                                  k > 0 || kk > 0);
        kf::tcgen05_commit_cg2_multicast(done + s, 0x3);
      }
      if (k + PS < nk) {
        if (RING_PLANT != 3) kf::mbarrier_wait_parity(done + s, ph);  // the MMAs read the stage: free
        kf::mbarrier_arrive_expect_tx(full + s, kPairStage);
        kf::tma_load_2d(sa + s * 128 * 128, map_a, (k + PS) * PBK, m0, full + s);
        kf::tma_load_2d(sb + s * (PBN / 2) * 128, map_b, (k + PS) * PBK, nb, full + s);
      }
    }
  }
  __syncthreads();
  if (nk > 0)  // the last commit tracks every earlier MMA of the issuing thread
    kf::mbarrier_wait_parity(done + (nk - 1) % PS, uint32_t((nk - 1) / PS) & 1u);
  kf::tcgen05_fence_after();
  const int w = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  for (int half = 0; half < 2; ++half) {
    float d[PBN / 2];
    kf::tmem_ld_16x256b<PBN / 8>(d, tmem + (uint32_t(32 * w + 16 * half) << 16));
    kf::tmem_wait_ld();
    for (int j = 0; j < PBN / 8; ++j)
      for (int q = 0; q < 4; ++q) {
        const int m = m0 + 32 * w + 16 * half + g + 8 * (q / 2), n = int(blockIdx.y) * PBN + 8 * j + 2 * t + q % 2;
        if (nk > 0 && m < M && n < N) D[size_t(m) * N + n] = d[4 * j + q];
      }
  }
  kf::tcgen05_fence_before();
  kf::cluster_sync();
  if (tid < 32) {
    kf::tcgen05_fence_after();
    kf::tmem_dealloc_cg2(tmem, PBN);
  }
}
"""
PAIR_RING = PAIR_RING.replace(
    "PAIR_IDESC", f"{tcgen05.instr_desc(256, 128, dtypes.bfloat16, False, False, cta_group=2):#x}u")
RING_SMEM = 2 * (128 + 64) * 128 + 3 * 2 * 8 + 16
RING_KERNELS = {"ring": 0, "ring_no_ready_wait": 1, "ring_ready_to_self": 2, "ring_refill_in_flight": 3}
RING_PARAMS = [HostParam("float*", "buffer")] + [HostParam("int", "scalar")] * 3 + \
    [HostParam("CUtensorMap", "tensormap")] * 2


def ring_kernel_source(name: str, plant: int) -> str:
    """The extern "C" entry of PAIR_RING (``__cluster_dims__(2, 1, 1)``, as a generated kernel)."""
    return (f'extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(128, 1) {name}(float* D, '
            'int M, int N, int K, const __grid_constant__ CUtensorMap map_a, '
            f'const __grid_constant__ CUtensorMap map_b) {{ pair_ring_run<{plant}>(D, M, N, K, &map_a, &map_b); }}')


def _swizzled_map(arr: np.ndarray, rows: int) -> np.ndarray:
    """Packed 2-D tensor map of a row-major bf16 matrix: box 64 columns (128 bytes) x ``rows``,
    128-byte swizzle (``cuda_tma.TensorMapArgs.packed``)."""
    r, c = arr.shape
    return np.array([2, arr.itemsize, arr.ctypes.data, c, r, c * arr.itemsize, 64, rows, 128], np.int64)


# name -> (element bytes, N, plant)
KERNELS = {
    "bf16_n256": (2, 256, 0),
    "bf16_n64": (2, 64, 0),
    "e4m3_n128": (1, 128, 0),
    "same_b_half": (2, 64, 1),
    "odd_never_allocates": (2, 64, 2),
    "commit_no_multicast": (2, 64, 3),
    "commit_cta_group_1": (2, 64, 4),
    "peer_overwrites_in_flight": (2, 64, 5),
}
PARAMS = [HostParam("const unsigned char*", "buffer"), HostParam("const unsigned char*", "buffer"),
          HostParam("float*", "buffer"), HostParam("int", "scalar")]


def _idesc(es: int, n: int) -> int:
    return tcgen05.instr_desc(256, n, dtypes.bfloat16 if es == 2 else dtypes.float8_e4m3, False, False, cta_group=2)


def _smem(n: int) -> int:
    return 128 * 128 + n // 2 * 128 + 16


def _source(names) -> str:
    parts = [SOURCE, PAIR_RING]
    for name in names:
        if name in RING_KERNELS:
            parts.append(emu_source(ring_kernel_source(name, RING_KERNELS[name]), name=name, entry=name,
                                    params=RING_PARAMS, threads=128, grid_rank=2, cluster=2))
            continue
        es, n, plant = KERNELS[name]
        parts.append(emu_source(
            f'extern "C" __global__ void {name}(const unsigned char* A, const unsigned char* B, float* D, int K) '
            f'{{ pair_run<{es}, {n}, {_idesc(es, n):#x}u, {plant}>(A, B, D, K); }}',
            name=name, entry=name, params=PARAMS, threads=128, grid_rank=1, cluster=2))
    return "\n".join(parts)


def _module(tag: str, names, short_timeout=()) -> dict:
    """One module; the kernels named in ``short_timeout`` give up waiting after DEADLOCK_MS."""
    smem = max(_smem(256), RING_SMEM)
    module = EmulatedModule(tag, _source(names), dynamic_smem=cluster_smem_bytes(smem, 2), arch="sm_100a")
    return {name: module.kernel(name, *([DEADLOCK_MS] if name in short_timeout else [])) for name in names}


@pytest.fixture(scope="module")
def kernels():
    return _module("emu_test_tcgen05_pair", [*KERNELS, *RING_KERNELS],
                   short_timeout=("odd_never_allocates", "commit_no_multicast", "ring_ready_to_self"))


def _operands(rng, es: int, n: int, pairs: int):
    k = 2 * 128 // es  # two K tiles: the second accumulates onto the first and refills the stage
    m = 256 * pairs
    dt = BF16 if es == 2 else E4M3
    a = (rng.standard_normal((m, k)) * 2).astype(dt)
    b = (rng.standard_normal((n, k)) * 2).astype(dt)
    return a, b


def _run(kern, a, b, pairs: int):
    d = np.full((a.shape[0], b.shape[0]), np.nan, np.float32)
    kern([a.view(np.uint8), b.view(np.uint8), d, np.array(a.shape[1], np.int32)], [], [2 * pairs])
    return d


def _check(d, a, b):
    """float64 reference; the MMA sums each 16/32-K product in double and rounds to f32 once per
    instruction (4 per K tile), so the error is a few f32 roundings of the running sum."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want = a64 @ b64.T
    bound = (np.abs(a64) @ np.abs(b64).T) * 2.0 ** -21
    err = np.abs(d.astype(np.float64) - want)
    bad = ~(err <= bound)
    assert not bad.any(), f"{bad.sum()} elements off, first {np.argwhere(bad)[:3].tolist()}, max err {np.nanmax(err)}"


@pytest.mark.parametrize("name,pairs", [("bf16_n256", 1), ("bf16_n64", 2), ("e4m3_n128", 1)])
def test_pair_mma_matches_float64(kernels, name, pairs):
    es, n, _ = KERNELS[name]
    rng = np.random.default_rng(7 + n)
    a, b = _operands(rng, es, n, pairs)
    _check(_run(kernels[name], a, b, pairs), a, b)


def test_each_cta_holds_its_own_rows_and_columns(kernels):
    """One-hot operands: A row i is e_{i % 64} and B^T row j is (j + 1) e_{j % 64} scaled per CTA
    half, so D[i, j] = (j + 1) [i = j mod 64] says exactly which CTA's A rows and B half
    reached which TMEM (a swap of halves or of CTAs moves the ones)."""
    es, n, _ = KERNELS["bf16_n64"]
    k = 2 * 128 // es
    a = np.zeros((512, k), np.float32)
    a[np.arange(512), np.arange(512) % 64] = 1.0 + np.arange(512) // 128  # CTA rank + 1 per 128 rows
    b = np.zeros((n, k), np.float32)
    b[np.arange(n), np.arange(n) % 64] = np.arange(n) + 1.0
    d = _run(kernels["bf16_n64"], a.astype(BF16), b.astype(BF16), 2)
    np.testing.assert_array_equal(d, a @ b.T)


def test_instr_desc_cta_group_2():
    desc = tcgen05.instr_desc(256, 128, dtypes.bfloat16, False, False, cta_group=2)
    assert (desc >> 24) & 31 == 16 and (desc >> 17) & 63 == 16 and (desc >> 7) & 7 == 1
    for m, n in ((128, 128), (256, 24), (256, 16), (256, 272)):
        with pytest.raises(ValueError, match="cta_group::2"):
            tcgen05.instr_desc(m, n, dtypes.bfloat16, False, False, cta_group=2)
    with pytest.raises(ValueError, match="cta_group must be"):
        tcgen05.instr_desc(128, 128, dtypes.bfloat16, False, False, cta_group=4)


# kernel -> text its emulation error must contain (None: a wrong result).  The two deadlocks are
# reported by whichever bounded wait gives up first: the stranded one (the alloc, the odd CTA's
# mbarrier) or the cluster barrier the other CTA then waits at.
KERNEL_BUGS = {
    "same_b_half": None,
    "odd_never_allocates": "deadlock: ",
    "commit_no_multicast": "deadlock: ",
    "commit_cta_group_1": "must name the same .cta_group",
    "peer_overwrites_in_flight": "changed between the issue and the completion",
}


@pytest.mark.parametrize("bug", sorted(KERNEL_BUGS))
def test_planted_kernel_bug_is_caught(kernels, bug):
    es, n, _ = KERNELS[bug]
    a, b = _operands(np.random.default_rng(3), es, n, 1)
    message = KERNEL_BUGS[bug]
    if message is None:
        with pytest.raises(AssertionError):
            _check(_run(kernels[bug], a, b, 1), a, b)
        return
    with pytest.raises(EmulationError, match=message):
        _run(kernels[bug], a, b, 1)


# emulator bug -> mutation of kf/emu/tcgen05.h; the clean bf16 kernel must fail (wrong result or error)
EMULATOR_BUGS = {
    "b_halves_swapped": lambda s: s.replace("desc_elem(b[c / (id.n / 2)]", "desc_elem(b[1 - c / (id.n / 2)]"),
    "a_rows_from_issuer_only": lambda s: s.replace("desc_elem(a[r / 128]", "desc_elem(a[0]"),
    "d_in_even_cta_only": lambda s: s.replace("Tmem& t = tmem_of(p.even + uint32_t(r / 128));",
                                              "Tmem& t = tmem_of(p.even);"),
    "multicast_commit_to_issuer_only": lambda s: s.replace(
        "const void* target = cta_mask ? smem_ptr(mapa_shared(addr, r)) : bar;", "const void* target = bar;"),
    "one_tmem_per_cluster": lambda s: s.replace("return g_tmem.cta[rank];", "return g_tmem.cta[0];"),
}


@pytest.fixture(scope="module")
def emulator_include(tmp_path_factory):
    root = tmp_path_factory.mktemp("emu_include_pair")
    shutil.copytree(emu_backend.TEMPLATES / "include", root / "include")
    return root / "include"


@pytest.mark.parametrize("bug", sorted(EMULATOR_BUGS))
def test_planted_emulator_bug_is_caught(emulator_include, monkeypatch, bug):
    clean = (emu_backend.TEMPLATES / "include" / "kf" / "emu" / "tcgen05.h").read_text()
    mutated = EMULATOR_BUGS[bug](clean)
    assert mutated != clean, f"planting {bug} changed nothing"
    (emulator_include / "kf" / "emu" / "tcgen05.h").write_text(mutated)
    monkeypatch.setattr(emu_backend, "INCLUDE_DIRS", (emu_backend.INCLUDE_DIRS[0], str(emulator_include)))
    kern = _module(f"emu_pair_bug_{bug}", ["bf16_n64"], short_timeout=("bf16_n64",))["bf16_n64"]
    a, b = _operands(np.random.default_rng(5), 2, 64, 2)
    try:
        d = _run(kern, a, b, 2)
    except EmulationError:
        return
    with pytest.raises(AssertionError):
        _check(d, a, b)



def _ring_run(kern, a, b):
    m, n = a.shape[0], b.shape[0]
    d = np.full((m, n), np.nan, np.float32)
    kern([d, np.array(m, np.int32), np.array(n, np.int32), np.array(a.shape[1], np.int32),
          _swizzled_map(a, 128), _swizzled_map(b, 64)], [], [2 * -(-m // 256), -(-n // 128)])
    return d


@pytest.mark.parametrize("m,n,k", [(256, 128, 320), (300, 200, 72)])
def test_ring_pair_gemm_matches_float64(kernels, m, n, k):
    """TMA ring (two stages over five K tiles, or one ragged tile), ragged M / N (zero-filled boxes,
    masked stores), two pairs along M and two N tiles in the second case."""
    rng = np.random.default_rng(m + n + k)
    a = (rng.standard_normal((m, k)) * 2).astype(BF16)
    b = (rng.standard_normal((n, k)) * 2).astype(BF16)
    _check(_ring_run(kernels["ring"], a, b), a, b)


# Races on the GPU.  Here: the MMA is caught reading a stage that changed under it, or, since the
# emulator completes a commit's phase only when a thread waits on it, the leader running a phase
# ahead of its peer makes the next multicast commit over-arrive on the peer's barrier.
RACE = "changed between the issue and the completion|more arrivals than the count"


@pytest.mark.parametrize("bug,message", [
    ("ring_no_ready_wait", RACE),
    ("ring_ready_to_self", "deadlock: "),
    ("ring_refill_in_flight", RACE),
])
def test_planted_ring_bug_is_caught(kernels, bug, message):
    rng = np.random.default_rng(11)
    a = (rng.standard_normal((256, 320)) * 2).astype(BF16)
    b = (rng.standard_normal((128, 320)) * 2).astype(BF16)
    try:
        d = _ring_run(kernels[bug], a, b)
    except EmulationError as e:
        assert re.search(message, str(e)), str(e)
        return
    assert message == RACE, f"{bug} ran to completion"
    with pytest.raises(AssertionError):  # the MMA read a tile that had not landed (poison)
        _check(d, a, b)
