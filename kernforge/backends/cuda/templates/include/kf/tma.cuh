// mbarrier + TMA tile loads (sm_90): the stage ring of T.Pipelined on sm_90a.
//
// Exact semantics (PTX ISA, "mbarrier" and "cp.async.bulk.tensor"):
//  * mbarrier_init(bar, count): `mbarrier.init.shared::cta.b64 [bar], count;`
//    the 8-byte shared object `bar` expects `count` arrivals per phase, tx-count 0,
//    current phase 0.
//  * mbarrier_init_fence(): `fence.mbarrier_init.release.cluster;` makes the initialising
//    thread's mbarrier.init visible to the async proxy (the copy engine's complete_tx);
//    other threads may use the barriers after it and a __syncthreads().
//  * mbarrier_inval(bar): `mbarrier.inval.shared::cta.b64 [bar];` ends the object's life as a
//    barrier (required before its memory is initialised again); no thread may still wait on it.
//  * mbarrier_arrive_expect_tx(bar, bytes):
//    `mbarrier.arrive.expect_tx.shared::cta.b64 _, [bar], bytes;` adds `bytes` to the
//    phase's expected transaction count, then arrives once.  The phase completes when
//    all arrivals happened *and* every expected byte has been delivered by the copies
//    that complete on `bar` (a copy may deliver before the expect: the count is signed).
//  * mbarrier_arrive(bar): `mbarrier.arrive.shared::cta.b64 _, [bar];` one arrival, no
//    transaction bytes (a consumer releasing a stage on the ring's empty barrier);
//  * mbarrier_wait_parity(bar, parity): loops on
//    `mbarrier.try_wait.parity.shared::cta.b64 p, [bar], parity;` until the phase with
//    parity `parity` (0 for phases 0, 2, ...; 1 for 1, 3, ...) has completed.  The data
//    of copies completing on that phase is then visible to the waiting thread.
//  * tma_load_<N>d(dst, map, c0..c{N-1}, bar):
//    `cp.async.bulk.tensor.Nd.shared::cluster.global.mbarrier::complete_tx::bytes
//     [dst], [map, {c0, ..}], [bar];` copies the box of the tensor map whose first
//    element is at coordinates (c0 innermost, ..) into shared `dst` (128-byte aligned),
//    box order, dimension 0 innermost.  Elements outside the tensor are written as 0.
//    The full box size in bytes (zero-filled elements included) is delivered to `bar`.
//    `map` is the address of a `const __grid_constant__ CUtensorMap` kernel parameter.
//    With a 128-byte-swizzle tensor map (CU_TENSOR_MAP_SWIZZLE_128B) the box's inner extent is
//    at most 128 bytes, `dst` must be 1024-byte aligned, and the 16-byte piece p of box row r
//    lands at piece p ^ (r % 8) (shared address bits [4:6] ^= [7:9]; kf/wgmma.cuh).
//  * tma_load_<N>d(dst, map, c0..c{N-1}, bar, policy): the same with `.L2::cache_hint` and the
//    64-bit L2 cache policy `policy` (an eviction priority for the lines this copy reads).
//  * l2_policy_evict_first(): `createpolicy.fractional.L2::evict_first.b64 p, 1.0;` a policy
//    that makes every line it is used on first in line for eviction (streamed data read once).
// Host emulation (kf/emu/mbarrier.h, kf/emu/tma.h) implements the same signatures:
// a copy is attached to its barrier and performed when a thread waits on it; a wait
// whose arrivals or bytes never come fails the launch with a deadlock report.
#pragma once
#include "kf/common.cuh"
#include "kf/fence.cuh"

#ifndef KF_HOST_EMULATION
#include <cuda.h>
namespace kf {

KF_DEVICE uint32_t tma_smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

KF_DEVICE void mbarrier_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(tma_smem_addr(bar)), "r"(count) : "memory");
}

KF_DEVICE void mbarrier_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

KF_DEVICE void mbarrier_inval(uint64_t* bar) {
  asm volatile("mbarrier.inval.shared::cta.b64 [%0];\n" ::"r"(tma_smem_addr(bar)) : "memory");
}

KF_DEVICE void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(tma_smem_addr(bar)), "r"(bytes)
               : "memory");
}

KF_DEVICE void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(tma_smem_addr(bar)) : "memory");
}

KF_DEVICE void mbarrier_wait_parity(uint64_t* bar, uint32_t parity) {
  const uint32_t addr = tma_smem_addr(bar);
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done) : "r"(addr), "r"(parity) : "memory");
  } while (!done);
}

KF_DEVICE void tma_load_2d(void* dst, const CUtensorMap* map, int32_t c0, int32_t c1, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
      ::"r"(tma_smem_addr(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(tma_smem_addr(bar))
      : "memory");
}

KF_DEVICE void tma_load_3d(void* dst, const CUtensorMap* map, int32_t c0, int32_t c1, int32_t c2, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];\n" ::"r"(tma_smem_addr(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2),
      "r"(tma_smem_addr(bar))
      : "memory");
}

KF_DEVICE void tma_load_4d(void* dst, const CUtensorMap* map, int32_t c0, int32_t c1, int32_t c2, int32_t c3,
                           uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(tma_smem_addr(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
      "r"(tma_smem_addr(bar))
      : "memory");
}

KF_DEVICE uint64_t l2_policy_evict_first() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

KF_DEVICE void tma_load_2d(void* dst, const CUtensorMap* map, int32_t c0, int32_t c1, uint64_t* bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3}], [%4], %5;\n"
      ::"r"(tma_smem_addr(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(tma_smem_addr(bar)),
      "l"(policy)
      : "memory");
}

KF_DEVICE void tma_load_3d(void* dst, const CUtensorMap* map, int32_t c0, int32_t c1, int32_t c2, uint64_t* bar,
                           uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3, %4}], [%5], %6;\n"
      ::"r"(tma_smem_addr(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2),
      "r"(tma_smem_addr(bar)), "l"(policy)
      : "memory");
}

KF_DEVICE void tma_load_4d(void* dst, const CUtensorMap* map, int32_t c0, int32_t c1, int32_t c2, int32_t c3,
                           uint64_t* bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3, %4, %5}], [%6], %7;\n"
      ::"r"(tma_smem_addr(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
      "r"(tma_smem_addr(bar)), "l"(policy)
      : "memory");
}

}  // namespace kf
#else
#include "kf/emu/tma.h"
namespace kf {

KF_DEVICE void mbarrier_init(uint64_t* bar, uint32_t count) { kf_emu::mbarrier_init(bar, count); }
KF_DEVICE void mbarrier_init_fence() {}  // one memory view on the host
KF_DEVICE void mbarrier_inval(uint64_t* bar) { kf_emu::mbarrier_inval(bar); }
KF_DEVICE void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) { kf_emu::mbarrier_arrive(bar, 1, bytes); }
KF_DEVICE void mbarrier_arrive(uint64_t* bar) { kf_emu::mbarrier_arrive(bar); }
KF_DEVICE void mbarrier_wait_parity(uint64_t* bar, uint32_t parity) { kf_emu::mbarrier_wait_parity(bar, parity); }

KF_DEVICE void tma_load_2d(void* dst, const CUtensorMap* map, int32_t c0, int32_t c1, uint64_t* bar) {
  const int32_t c[2] = {c0, c1};
  kf_emu::tma_load(dst, map, c, bar);
}
KF_DEVICE void tma_load_3d(void* dst, const CUtensorMap* map, int32_t c0, int32_t c1, int32_t c2, uint64_t* bar) {
  const int32_t c[3] = {c0, c1, c2};
  kf_emu::tma_load(dst, map, c, bar);
}
KF_DEVICE void tma_load_4d(void* dst, const CUtensorMap* map, int32_t c0, int32_t c1, int32_t c2, int32_t c3,
                           uint64_t* bar) {
  const int32_t c[4] = {c0, c1, c2, c3};
  kf_emu::tma_load(dst, map, c, bar);
}
// the L2 policy steers a cache the host does not have: same copy, policy unused
KF_DEVICE uint64_t l2_policy_evict_first() { return kf_emu::kL2PolicyEvictFirst; }
KF_DEVICE void tma_load_2d(void* dst, const CUtensorMap* map, int32_t c0, int32_t c1, uint64_t* bar, uint64_t) {
  tma_load_2d(dst, map, c0, c1, bar);
}
KF_DEVICE void tma_load_3d(void* dst, const CUtensorMap* map, int32_t c0, int32_t c1, int32_t c2, uint64_t* bar,
                           uint64_t) {
  tma_load_3d(dst, map, c0, c1, c2, bar);
}
KF_DEVICE void tma_load_4d(void* dst, const CUtensorMap* map, int32_t c0, int32_t c1, int32_t c2, int32_t c3,
                           uint64_t* bar, uint64_t) {
  tma_load_4d(dst, map, c0, c1, c2, c3, bar);
}

}  // namespace kf
#endif
