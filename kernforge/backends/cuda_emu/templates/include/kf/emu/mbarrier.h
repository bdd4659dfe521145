// Host emulation of the sm_90 mbarrier and of the bulk asynchronous copies that
// complete on it (cp.async.bulk and cp.async.bulk.tensor, i.e. TMA).
//
// Semantics (PTX ISA, "mbarrier"): a barrier has an expected arrival count, a
// pending arrival count and a transaction (tx) count in bytes.  The current
// phase completes when the pending arrivals reach zero *and* the tx count is
// zero; the phase number then advances and the pending count is re-armed.
// `try_wait.parity p` succeeds once the phase of parity p has completed.
//
// Completion semantics of the copies: a bulk copy issued with an mbarrier does
// not move data when issued.  It is attached to its barrier and performed (its
// bytes then counted off the tx count) when some thread tests or waits on that
// barrier, i.e. never before a correct kernel could rely on it and always
// before the phase it belongs to can complete.  So a kernel that reads the
// destination without waiting reads poison, and one whose expect_tx bytes do
// not match the copies never completes the phase: the wait times out with a
// message naming the missing arrivals and bytes.
//
// Phase bits: a wait on parity p returns once the current phase has the other parity, i.e. on
// the newest completed phase.  Each thread remembers, per barrier object (and per init of it),
// the newest phase its waits returned on; a wait that returns on "the phase before phase 0" (no
// phase completed yet) or again on a phase it already returned on fails the launch: the parity
// bit was wrong.  (PTX allows both; CUTLASS producers use the first to skip their first
// empty-barrier wait.  kernforge's rings wait for each phase of a barrier once per thread and
// never before phase 0, so on this emulator either is a bug report, not a pass.)
//
// State lives beside shared memory, keyed by the barrier's shared address, and
// is reset before every block.
#pragma once
#include <cstdint>
#include <cstring>

#include "kf/emu/shared.h"

namespace kf_emu {

// An asynchronous copy waiting on its barrier: `perform(payload)` moves the bytes
// (and zero-fills / swizzles, for TMA).
struct BulkCopy {
  void (*perform)(const unsigned char* payload);
  int64_t bytes;
  unsigned char payload[192];
};

struct Mbarrier {
  uint32_t addr = 0;
  uint32_t expected = 0, pending = 0;
  int64_t tx = 0;
  uint32_t phase = 0;  // completed phases
  uint32_t generation = 0;  // bumped by every init: a thread's phase memory of an older object is stale
  Vec<BulkCopy>* copies = nullptr;
};

constexpr int kMaxMbarriers = 64;
struct MbarrierTable {
  Mutex mu;
  Mbarrier bars[kMaxMbarriers];
  int n = 0;
  std::atomic<uint32_t> epoch{0};  // bumped on every phase completion; waiters sleep on it
};
static MbarrierTable g_mbarriers;

inline Mbarrier& find_locked(uint32_t addr, const char* op) {
  for (int i = 0; i < g_mbarriers.n; ++i)
    if (g_mbarriers.bars[i].addr == addr) return g_mbarriers.bars[i];
  fail("%s: mbarrier at shared address %u was never initialised", op, addr);
}

inline void complete_if_done_locked(Mbarrier& b) {
  if (b.pending == 0 && b.tx == 0) {
    b.phase += 1;
    b.pending = b.expected;
    g_mbarriers.epoch.fetch_add(1, std::memory_order_acq_rel);
    futex_wake(&g_mbarriers.epoch);
  }
}

inline void mbarrier_init(const void* bar, uint32_t count) {
  if (count == 0 || count > (1u << 20)) fail("mbarrier.init: count must be in 1..2^20");
  const uint32_t addr = smem_addr(bar);
  if (addr % 8) fail("mbarrier.init: barrier object is not 8-byte aligned");
  Lock g(g_mbarriers.mu);
  Mbarrier* b = nullptr;
  for (int i = 0; i < g_mbarriers.n && !b; ++i)
    if (g_mbarriers.bars[i].addr == addr) b = &g_mbarriers.bars[i];
  if (!b) {
    if (g_mbarriers.n == kMaxMbarriers) fail("mbarrier.init: more than %d mbarriers in one block", kMaxMbarriers);
    b = &g_mbarriers.bars[g_mbarriers.n++];
    if (!b->copies) b->copies = new Vec<BulkCopy>;  // slots and their queues are reused by later blocks
  }
  b->addr = addr;
  b->expected = b->pending = count;
  b->tx = 0;
  b->phase = 0;
  b->generation += 1;
  b->copies->clear();
}

// mbarrier.inval: the object stops being a barrier (a later use fails as uninitialised)
// until the next mbarrier.init.
inline void mbarrier_inval(const void* bar) {
  Lock g(g_mbarriers.mu);
  Mbarrier& b = find_locked(smem_addr(bar), "mbarrier.inval");
  if (b.copies->size()) fail("mbarrier.inval: %zu bulk copies still attached", b.copies->size());
  b.addr = UINT32_MAX;
}

inline void mbarrier_expect_tx(const void* bar, uint32_t bytes) {
  Lock g(g_mbarriers.mu);
  find_locked(smem_addr(bar), "mbarrier.expect_tx").tx += bytes;
}

// Returns the state token (the phase the arrival belongs to).
inline uint64_t mbarrier_arrive(const void* bar, uint32_t count = 1, uint32_t tx_bytes = 0) {
  Lock g(g_mbarriers.mu);
  Mbarrier& b = find_locked(smem_addr(bar), "mbarrier.arrive");
  if (count > b.pending)
    fail("mbarrier.arrive: %u arrivals on a phase with only %u pending (more arrivals than the count it was "
         "initialised with)", count, b.pending);
  const uint64_t token = b.phase;
  b.tx += tx_bytes;
  b.pending -= count;
  complete_if_done_locked(b);
  return token;
}

inline void mbarrier_complete_tx(const void* bar, uint32_t bytes) {
  Lock g(g_mbarriers.mu);
  Mbarrier& b = find_locked(smem_addr(bar), "mbarrier.complete_tx");
  b.tx -= bytes;
  complete_if_done_locked(b);
}

// Attaches an asynchronous copy of `bytes` to the barrier (performed on a wait).
template <class Payload>
inline void mbarrier_attach_copy(const void* bar, void (*perform)(const unsigned char*), const Payload& p,
                                 int64_t bytes) {
  static_assert(sizeof(Payload) <= sizeof(BulkCopy::payload), "bulk-copy payload too large");
  BulkCopy c;
  c.perform = perform;
  c.bytes = bytes;
  std::memcpy(c.payload, &p, sizeof p);
  Lock g(g_mbarriers.mu);
  find_locked(smem_addr(bar), "cp.async.bulk").copies->push(c);
}

inline bool try_wait_locked(Mbarrier& b, uint32_t parity) {
  if (b.copies->size()) {
    for (size_t i = 0; i < b.copies->size(); ++i) {
      BulkCopy& c = (*b.copies)[i];
      c.perform(c.payload);
      b.tx -= c.bytes;
    }
    b.copies->clear();
    complete_if_done_locked(b);
  }
  return (b.phase & 1u) != (parity & 1u);
}

// mbarrier.test_wait / try_wait .parity without suspending: has the phase of this parity completed?
inline bool mbarrier_test_wait_parity(const void* bar, uint32_t parity) {
  Lock g(g_mbarriers.mu);
  return try_wait_locked(find_locked(smem_addr(bar), "mbarrier.test_wait"), parity);
}

// The newest phase each thread has seen complete, per barrier slot (see the header comment).
struct SeenPhase {
  uint32_t addr = UINT32_MAX, generation = 0;
  int64_t phase = -1;
};
static thread_local SeenPhase g_seen[kMaxMbarriers];
inline void seen_reset() {
  for (SeenPhase& p : g_seen) p = SeenPhase{};
}

// Called under the table lock once a wait on `parity` succeeded: it returned on phase b.phase - 1.
inline void check_phase_locked(const Mbarrier& b, uint32_t parity) {
  const int64_t observed = int64_t(b.phase) - 1;
  if (observed < 0)
    fail("mbarrier wait (parity %u) returned before any phase completed: the phase bit is wrong", parity & 1u);
  SeenPhase& seen = g_seen[&b - g_mbarriers.bars];
  if (seen.addr != b.addr || seen.generation != b.generation) seen = SeenPhase{b.addr, b.generation, -1};
  if (observed <= seen.phase)
    fail("mbarrier wait (parity %u) returned on phase %lld, which this thread already waited for: the phase "
         "bit is wrong", parity & 1u, (long long)observed);
  seen.phase = observed;
}

// Blocks until the phase of this parity completed; fails the launch after the timeout.
inline void mbarrier_wait_parity(const void* bar, uint32_t parity) {
  const int64_t timeout_ms = launch_error().timeout_ms.load();
  const int64_t deadline = now_ns() + timeout_ms * 1000000;
  WaitScope scope;
  for (;;) {
    const uint32_t seen = g_mbarriers.epoch.load(std::memory_order_acquire);
    uint32_t pending, expected;
    long long tx;
    {
      Lock g(g_mbarriers.mu);
      Mbarrier& b = find_locked(smem_addr(bar), "mbarrier.try_wait");
      if (try_wait_locked(b, parity)) {
        check_phase_locked(b, parity);
        return;
      }
      pending = b.pending;
      expected = b.expected;
      tx = b.tx;
    }
    check_abort();
    const int64_t left = deadline - now_ns();
    if (left <= 0)
      fail("deadlock: mbarrier wait (parity %u) timed out after %lld ms with %u of %u arrivals and %lld tx bytes "
           "outstanding", parity & 1u, (long long)timeout_ms, pending, expected, tx);
    if (scope.stuck())
      fail("deadlock: mbarrier wait (parity %u) with %u of %u arrivals and %lld tx bytes outstanding while every "
           "emulated thread waits", parity & 1u, pending, expected, tx);
    futex_wait(&g_mbarriers.epoch, seen, left < 50000000 ? left : 50000000);
  }
}

struct PlainCopy {
  void* dst;
  const void* src;
  uint32_t bytes;
};
inline void perform_plain_copy(const unsigned char* payload) {
  PlainCopy c;
  std::memcpy(&c, payload, sizeof c);
  std::memcpy(c.dst, c.src, c.bytes);
}

// cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [dst], [src], size, [bar]
inline void bulk_copy_g2s(void* dst, const void* src, uint32_t bytes, const void* bar) {
  if (!is_shared(dst)) fail("cp.async.bulk: destination is not in shared memory");
  if (smem_addr(dst) % 16 || reinterpret_cast<uintptr_t>(src) % 16 || bytes % 16)
    fail("cp.async.bulk: addresses and size must be multiples of 16 bytes");
  mbarrier_attach_copy(bar, perform_plain_copy, PlainCopy{dst, src, bytes}, bytes);
}

inline void mbarrier_reset() {
  Lock g(g_mbarriers.mu);
  for (int i = 0; i < g_mbarriers.n; ++i) g_mbarriers.bars[i].copies->clear();
  g_mbarriers.n = 0;
}
inline void mbarrier_wake() {
  g_mbarriers.epoch.fetch_add(1, std::memory_order_acq_rel);
  futex_wake(&g_mbarriers.epoch);
}
static RegisterHook mbarrier_reset_hook(hooks().block_start, mbarrier_reset);
static RegisterHook mbarrier_wake_hook(hooks().wake, mbarrier_wake);
static RegisterHook mbarrier_seen_hook(hooks().thread_start, seen_reset);

}  // namespace kf_emu
