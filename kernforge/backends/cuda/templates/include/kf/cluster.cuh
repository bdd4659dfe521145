// Thread-block clusters (sm_90): the CTAs of a cluster (`__cluster_dims__(C, 1, 1)`, or the
// launch attribute) run at the same time on neighbouring SMs and can reach each other's
// shared memory.  What kernforge uses them for: two CTAs that need the same operand tile
// (the same A rows for adjacent N blocks, or the same B columns for adjacent M blocks) each
// load half of it and multicast it to both, so L2 serves each tile once per cluster.
//
// Exact semantics (PTX ISA, "Cluster", "mapa", "barrier.cluster", "mbarrier",
// "cp.async.bulk.tensor"):
//  * cluster_ctarank() / cluster_nctarank(): `%cluster_ctarank` / `%cluster_nctarank`.
//  * cluster_arrive(): `barrier.cluster.arrive.aligned;` and cluster_wait():
//    `barrier.cluster.wait.aligned;` (release / acquire by default) -- a split barrier over every thread of every
//    CTA of the cluster (each thread arrives once, then waits).  A kernel that touches a peer
//    CTA's shared memory syncs once after initialising its mbarriers (so no peer arrives on
//    or multicasts into a barrier that is not initialised yet) and once before exiting (so
//    no CTA exits while a peer may still write its shared memory or arrive on its barriers).
//  * mapa_shared(addr, r): `mapa.shared::cluster.u32 d, addr, r;` the shared::cluster address
//    of the same variable in CTA r; map_shared_rank(p, r): `mapa.u64` on a generic pointer
//    (plain loads and stores through it reach CTA r's shared memory).
//  * mbarrier_arrive_cluster(bar, r): `mbarrier.arrive.shared::cluster.b64 _, [mapa(bar, r)];`
//    (release at CTA scope, as CUTLASS's ClusterBarrier: the releasing thread's reads of the
//    stage are ordered before the arrival) one arrival on CTA r's copy of `bar` (a consumer releasing a stage to
//    every producer that multicast into it).
//  * tma_load_2d_multicast(dst, map, c0, c1, bar, mask):
//    `cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes
//     .multicast::cluster [dst], [map, {c0, c1}], [bar], mask;` the box is written to `dst`
//    in every CTA r whose bit is set in the 16-bit `mask`, and its byte count is completed on
//    the mbarrier at `bar`'s offset in each of them: each destination CTA's expect_tx must
//    count the bytes every multicast into it delivers, not only its own loads.
//    tma_load_3d_multicast: the same with a 3-D box (`.3d`, coordinates {c0, c1, c2}).
//  * KF_CTA_SMEM(name): declares `name` as this CTA's dynamic shared memory (an extern
//    __shared__ array on the GPU; under emulation this CTA's slice of the cluster's arena).
// Host emulation: kf/emu/cluster.h (the CTAs of a cluster run concurrently; races the GPU
// would hide become deterministic failures).
#pragma once
#include "kf/common.cuh"
#include "kf/tma.cuh"

#ifndef KF_HOST_EMULATION
#define KF_CTA_SMEM(name) extern __shared__ __align__(1024) unsigned char name[]
namespace kf {

KF_DEVICE uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
KF_DEVICE uint32_t cluster_nctarank() {
  uint32_t n;
  asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(n));
  return n;
}
KF_DEVICE void cluster_arrive() { asm volatile("barrier.cluster.arrive.aligned;\n" ::: "memory"); }
KF_DEVICE void cluster_wait() { asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory"); }

KF_DEVICE uint32_t mapa_shared(uint32_t addr, uint32_t rank) {
  uint32_t out;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(out) : "r"(addr), "r"(rank));
  return out;
}
template <class T>
KF_DEVICE T* map_shared_rank(T* p, uint32_t rank) {
  uint64_t out;
  asm volatile("mapa.u64 %0, %1, %2;\n" : "=l"(out) : "l"(reinterpret_cast<uint64_t>(p)), "r"(rank));
  return reinterpret_cast<T*>(out);
}

KF_DEVICE void mbarrier_arrive_cluster(uint64_t* bar, uint32_t rank) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(
                   mapa_shared(tma_smem_addr(bar), rank))
               : "memory");
}

KF_DEVICE void tma_load_2d_multicast(void* dst, const CUtensorMap* map, int32_t c0, int32_t c1, uint64_t* bar,
                                     uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%2, %3}], [%4], %5;\n"
      ::"r"(tma_smem_addr(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(tma_smem_addr(bar)),
      "h"(mask)
      : "memory");
}

KF_DEVICE void tma_load_3d_multicast(void* dst, const CUtensorMap* map, int32_t c0, int32_t c1, int32_t c2,
                                     uint64_t* bar, uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%2, %3, %4}], [%5], %6;\n"
      ::"r"(tma_smem_addr(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2),
      "r"(tma_smem_addr(bar)), "h"(mask)
      : "memory");
}

}  // namespace kf
#else
#include "kf/emu/cluster.h"
#define KF_CTA_SMEM(name) unsigned char* const name = kf_emu::cta_dynamic_smem()
namespace kf {

KF_DEVICE uint32_t cluster_ctarank() { return kf_emu::cluster_ctarank(); }
KF_DEVICE uint32_t cluster_nctarank() { return kf_emu::cluster_nctarank(); }
KF_DEVICE void cluster_arrive() { kf_emu::cluster_arrive(); }
KF_DEVICE void cluster_wait() { kf_emu::cluster_wait(); }
KF_DEVICE uint32_t mapa_shared(uint32_t addr, uint32_t rank) { return kf_emu::mapa_shared(addr, rank); }
template <class T>
KF_DEVICE T* map_shared_rank(T* p, uint32_t rank) { return kf_emu::map_shared_rank(p, rank); }
KF_DEVICE void mbarrier_arrive_cluster(uint64_t* bar, uint32_t rank) { kf_emu::mbarrier_arrive_cluster(bar, rank); }
KF_DEVICE void tma_load_2d_multicast(void* dst, const CUtensorMap* map, int32_t c0, int32_t c1, uint64_t* bar,
                                     uint16_t mask) {
  const int32_t c[2] = {c0, c1};
  kf_emu::tma_load_multicast(dst, map, c, bar, mask);
}
KF_DEVICE void tma_load_3d_multicast(void* dst, const CUtensorMap* map, int32_t c0, int32_t c1, int32_t c2,
                                     uint64_t* bar, uint16_t mask) {
  const int32_t c[3] = {c0, c1, c2};
  kf_emu::tma_load_multicast(dst, map, c, bar, mask);
}

}  // namespace kf
#endif

namespace kf {
// Both halves of the split cluster barrier.
KF_DEVICE void cluster_sync() {
  cluster_arrive();
  cluster_wait();
}
}  // namespace kf
