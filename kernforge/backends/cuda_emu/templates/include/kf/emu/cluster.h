// Host emulation of thread-block clusters (sm_90): distributed shared memory, cluster
// barriers, remote mbarrier arrivals and multicast TMA loads (kf/cluster.cuh says what
// each instruction does on the GPU).
//
// Model: the C CTAs of a cluster run at the same time (kf/emu/runtime.h, Launch with a
// cluster size).  The dynamic shared arena (kf/emu/shared.h, sized for the whole cluster by
// the build) is cut into C slices of `cta_smem_stride()` bytes, 1024-byte aligned so that
// swizzles and descriptors keep their meaning; CTA r's dynamic shared memory is slice r.
// mbarriers are keyed by shared address, so every CTA's barriers are distinct objects.
//  * mapa(addr, r): the same offset in slice r;
//  * barrier.cluster.arrive / wait: a split barrier over every thread of the cluster;
//  * a remote mbarrier arrive: an arrive on the peer slice's barrier;
//  * a multicast TMA load: the box goes to the same offset in every CTA of the mask and its
//    bytes complete on the barrier at the same offset in each.  The issuing CTA's copy is
//    attached to its barrier as any TMA load (performed at a wait: the latest the data may
//    land, so reads before the wait see poison); a peer's copy is written and completed at
//    once (the earliest it may land, so a refill that a peer still reads, a missing
//    release, corrupts what the peer computes).
// Checks that turn a GPU race into a deterministic failure:
//  * a thread's first access to another CTA (remote arrive, multicast into a peer, mapa'd
//    pointer) must come after it passed a cluster barrier: before that the peer may not
//    have initialised its mbarriers;
//  * a thread may not exit while accesses to another CTA happened since the last completed
//    cluster barrier: its CTA (or the peer) could be gone while the access is in flight
//    (the kernel must end with cluster_arrive + cluster_wait);
//  * a multicast or remote arrive into a CTA that already had a thread exit fails.
#pragma once
#include <cstdint>

#include "kf/emu/mbarrier.h"
#include "kf/emu/shared.h"
#include "kf/emu/tma.h"

namespace kf_emu {

// Bytes of dynamic shared memory per CTA of the running cluster (all of it without a cluster).
inline uint32_t cta_smem_stride() {
  const uint32_t n = cluster_run().size;
  return n <= 1 ? uint32_t(KF_EMU_DYNAMIC_SMEM_BYTES) : uint32_t(KF_EMU_DYNAMIC_SMEM_BYTES / n) & ~1023u;
}

// The dynamic shared memory of the calling thread's CTA.
inline unsigned char* cta_dynamic_smem() {
  if (cluster_run().size > 1 && cta_smem_stride() == 0)
    fail("cluster launch: the shared arena (%d bytes) has no 1024-byte slice per CTA of a %u-CTA cluster",
         int(KF_EMU_DYNAMIC_SMEM_BYTES), cluster_run().size);
  return dynamic_smem() + size_t(ctx().cta_rank) * cta_smem_stride();
}

struct ClusterState {
  Mutex mu;
  uint32_t arrived = 0;                   // threads arrived on the current cluster-barrier phase
  std::atomic<uint32_t> gen{0};           // completed cluster-barrier phases
  uint32_t exited_threads = 0;            // threads of the cluster that returned
  uint32_t exited_by_cta[kMaxCluster] = {};
  uint64_t remote_since_barrier = 0;      // cross-CTA accesses since the last completed phase
};
static ClusterState g_cluster;

struct ClusterThread {
  bool arrived = false;  // arrived on the current phase, not yet waited
  uint32_t arrive_gen = 0;
  bool synced = false;   // passed at least one cluster barrier
};
static thread_local ClusterThread g_cluster_thread;

inline uint32_t cluster_threads() { return cluster_run().size * launch_dims().block.x; }

inline uint32_t cluster_ctarank() { return ctx().cta_rank; }
inline uint32_t cluster_nctarank() { return cluster_run().size; }

inline void check_rank(uint32_t r, const char* op) {
  if (r >= cluster_run().size) fail("%s: CTA rank %u outside the %u-CTA cluster", op, r, cluster_run().size);
}

// Called under g_cluster.mu: the phase completes when every thread of the cluster arrived.
inline void cluster_complete_if_done_locked() {
  if (g_cluster.arrived && g_cluster.arrived + g_cluster.exited_threads == cluster_threads()) {
    if (g_cluster.exited_threads)
      fail("deadlock: barrier.cluster reached by %u of %u threads of the cluster; the other %u returned",
           g_cluster.arrived, cluster_threads(), g_cluster.exited_threads);
    g_cluster.arrived = 0;
    g_cluster.remote_since_barrier = 0;
    g_cluster.gen.fetch_add(1, std::memory_order_acq_rel);
    futex_wake(&g_cluster.gen);
  }
}

// barrier.cluster.arrive.aligned (release)
inline void cluster_arrive() {
  ClusterThread& t = g_cluster_thread;
  if (t.arrived) fail("barrier.cluster.arrive: thread %u of CTA %u arrived twice without a wait", ctx().tid,
                      ctx().cta_rank);
  Lock g(g_cluster.mu);
  t.arrived = true;
  t.arrive_gen = g_cluster.gen.load(std::memory_order_acquire);
  g_cluster.arrived += 1;
  cluster_complete_if_done_locked();
}

// barrier.cluster.wait.aligned (acquire)
inline void cluster_wait() {
  ClusterThread& t = g_cluster_thread;
  if (!t.arrived) fail("barrier.cluster.wait: thread %u of CTA %u waits without having arrived", ctx().tid,
                       ctx().cta_rank);
  wait_changed(g_cluster.gen, t.arrive_gen, "barrier.cluster.wait (not every thread of the cluster arrived?)");
  check_abort();  // an aborted launch wakes the waiters too
  t.arrived = false;
  t.synced = true;
}

// Bookkeeping of an access from the calling CTA into CTA `r`.
inline void note_access(uint32_t r, const char* op) {
  check_rank(r, op);
  if (r == ctx().cta_rank) return;
  if (!g_cluster_thread.synced)
    fail("%s: thread %u of CTA %u accesses CTA %u before any cluster barrier (the peer's mbarriers may not be "
         "initialised yet: cluster_arrive + cluster_wait after mbarrier init)", op, ctx().tid, ctx().cta_rank, r);
  Lock g(g_cluster.mu);
  if (g_cluster.exited_by_cta[r])
    fail("%s: CTA %u accesses CTA %u after %u of its threads exited (missing cluster barrier before exit?)", op,
         ctx().cta_rank, r, g_cluster.exited_by_cta[r]);
  g_cluster.remote_since_barrier += 1;
}

// mapa: the address of the same shared location in CTA `r` (shared::cluster window).
inline uint32_t mapa_shared(uint32_t addr, uint32_t r) {
  check_rank(r, "mapa");
  const uint32_t me = ctx().cta_rank, stride = cta_smem_stride();
  const uint32_t base = smem_addr(dynamic_smem()) + me * stride;
  if (addr < base || addr >= base + stride)
    fail("mapa: shared address %u is outside this CTA's shared memory", addr);
  return addr - me * stride + r * stride;
}
template <class T>
inline T* map_shared_rank(T* p, uint32_t r) {
  note_access(r, "mapa");
  return static_cast<T*>(smem_ptr(mapa_shared(smem_addr(p), r)));
}

// mbarrier.arrive.shared::cluster.b64 _, [mapa(bar, r)]
inline void mbarrier_arrive_cluster(const void* bar, uint32_t r) {
  note_access(r, "mbarrier.arrive.shared::cluster");
  mbarrier_arrive(smem_ptr(mapa_shared(smem_addr(bar), r)));
}

// cp.async.bulk.tensor.Nd.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster
inline void tma_load_multicast(void* dst, const CUtensorMap* map, const int32_t* coords, const void* bar,
                               uint16_t mask) {
  const uint32_t n = cluster_run().size;
  if (mask == 0 || (n < 16 && (mask >> n)))
    fail("cp.async.bulk.tensor.multicast: ctaMask 0x%x names CTAs outside the %u-CTA cluster", mask, n);
  const uint32_t d = smem_addr(dst), b = smem_addr(bar);
  for (uint32_t r = 0; r < n; ++r) {
    if (!((mask >> r) & 1u)) continue;
    note_access(r, "cp.async.bulk.tensor.multicast");
    void* peer_dst = smem_ptr(mapa_shared(d, r));
    const void* peer_bar = smem_ptr(mapa_shared(b, r));
    if (r == ctx().cta_rank) {
      tma_load(peer_dst, map, coords, peer_bar);
      continue;
    }
    int64_t bytes = 0;
    const TmaCopy t = tma_copy(peer_dst, map, coords, &bytes);
    perform_tma_copy(reinterpret_cast<const unsigned char*>(&t));
    mbarrier_complete_tx(peer_bar, uint32_t(bytes));
  }
}

inline void cluster_block_start() {
  Lock g(g_cluster.mu);
  g_cluster.arrived = 0;
  g_cluster.exited_threads = 0;
  for (uint32_t& e : g_cluster.exited_by_cta) e = 0;
  g_cluster.remote_since_barrier = 0;
}
inline void cluster_thread_start() { g_cluster_thread = ClusterThread{}; }
// Runs for every thread that returned from the kernel body (after an abort too: then quietly).
inline void cluster_thread_finish() {
  if (cluster_run().size <= 1) return;
  Lock g(g_cluster.mu);
  g_cluster.exited_threads += 1;
  g_cluster.exited_by_cta[ctx().cta_rank] += 1;
  if (g_cluster.remote_since_barrier)
    fail("thread %u of CTA %u exits with %llu cross-CTA accesses since the last cluster barrier: a peer may still "
         "write its shared memory or arrive on its mbarriers (end the kernel with cluster_arrive + cluster_wait)",
         ctx().tid, ctx().cta_rank, (unsigned long long)g_cluster.remote_since_barrier);
  if (g_cluster.arrived && g_cluster.arrived + g_cluster.exited_threads == cluster_threads())
    record_failure("deadlock: barrier.cluster reached by %u of %u threads of the cluster; the other %u returned",
                   g_cluster.arrived, cluster_threads(), g_cluster.exited_threads);
}
inline void cluster_wake() {
  g_cluster.gen.fetch_add(1, std::memory_order_acq_rel);
  futex_wake(&g_cluster.gen);
}
static RegisterHook cluster_block_hook(hooks().block_start, cluster_block_start);
static RegisterHook cluster_thread_hook(hooks().thread_start, cluster_thread_start);
static RegisterHook cluster_finish_hook(hooks().thread_finish, cluster_thread_finish);
static RegisterHook cluster_wake_hook(hooks().wake, cluster_wake);

}  // namespace kf_emu
