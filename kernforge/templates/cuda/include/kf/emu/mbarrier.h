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
// State lives beside shared memory, keyed by the barrier's shared address, and
// is reset before every block.
#pragma once
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <vector>

#include "kf/emu/shared.h"

namespace kf_emu {

struct BulkCopy {
  std::function<void()> perform;  // moves the bytes (and zero-fills / swizzles, for TMA)
  int64_t bytes;
};

struct Mbarrier {
  uint32_t addr = 0;
  uint32_t expected = 0, pending = 0;
  int64_t tx = 0;
  uint32_t phase = 0;  // completed phases
  std::vector<BulkCopy> copies;
};

struct MbarrierTable {
  std::mutex mu;
  std::vector<Mbarrier> bars;
  std::atomic<uint32_t> epoch{0};  // bumped on every phase completion; waiters sleep on it
};
static MbarrierTable g_mbarriers;

inline Mbarrier& find_locked(uint32_t addr, const char* op) {
  for (Mbarrier& b : g_mbarriers.bars)
    if (b.addr == addr) return b;
  fail(std::string(op) + ": mbarrier at shared address " + std::to_string(addr) + " was never initialised");
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
  std::lock_guard<std::mutex> g(g_mbarriers.mu);
  for (Mbarrier& b : g_mbarriers.bars)
    if (b.addr == addr) {
      b = Mbarrier{};
      b.addr = addr;
      b.expected = b.pending = count;
      return;
    }
  Mbarrier b;
  b.addr = addr;
  b.expected = b.pending = count;
  g_mbarriers.bars.push_back(std::move(b));
}

inline void mbarrier_expect_tx(const void* bar, uint32_t bytes) {
  std::lock_guard<std::mutex> g(g_mbarriers.mu);
  find_locked(smem_addr(bar), "mbarrier.expect_tx").tx += bytes;
}

// Returns the state token (the phase the arrival belongs to).
inline uint64_t mbarrier_arrive(const void* bar, uint32_t count = 1, uint32_t tx_bytes = 0) {
  std::lock_guard<std::mutex> g(g_mbarriers.mu);
  Mbarrier& b = find_locked(smem_addr(bar), "mbarrier.arrive");
  if (count > b.pending)
    fail("mbarrier.arrive: " + std::to_string(count) + " arrivals on a phase with only " + std::to_string(b.pending) +
         " pending (more arrivals than the count it was initialised with)");
  const uint64_t token = b.phase;
  b.tx += tx_bytes;
  b.pending -= count;
  complete_if_done_locked(b);
  return token;
}

inline void mbarrier_complete_tx(const void* bar, uint32_t bytes) {
  std::lock_guard<std::mutex> g(g_mbarriers.mu);
  Mbarrier& b = find_locked(smem_addr(bar), "mbarrier.complete_tx");
  b.tx -= bytes;
  complete_if_done_locked(b);
}

// Attaches an asynchronous copy of `bytes` to the barrier (performed on a wait).
inline void mbarrier_attach_copy(const void* bar, std::function<void()> perform, int64_t bytes) {
  std::lock_guard<std::mutex> g(g_mbarriers.mu);
  find_locked(smem_addr(bar), "cp.async.bulk").copies.push_back(BulkCopy{std::move(perform), bytes});
}

inline bool try_wait_locked(Mbarrier& b, uint32_t parity) {
  if (!b.copies.empty()) {
    std::vector<BulkCopy> copies;
    copies.swap(b.copies);
    for (BulkCopy& c : copies) {
      c.perform();
      b.tx -= c.bytes;
    }
    complete_if_done_locked(b);
  }
  return (b.phase & 1u) != (parity & 1u);
}

// mbarrier.test_wait / try_wait .parity without suspending: has the phase of this parity completed?
inline bool mbarrier_test_wait_parity(const void* bar, uint32_t parity) {
  std::lock_guard<std::mutex> g(g_mbarriers.mu);
  return try_wait_locked(find_locked(smem_addr(bar), "mbarrier.test_wait"), parity);
}

// Blocks until the phase of this parity completed; fails the launch after the timeout.
inline void mbarrier_wait_parity(const void* bar, uint32_t parity) {
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + std::chrono::milliseconds(launch_error().timeout_ms.load());
  for (;;) {
    const uint32_t seen = g_mbarriers.epoch.load(std::memory_order_acquire);
    std::string state;
    {
      std::lock_guard<std::mutex> g(g_mbarriers.mu);
      Mbarrier& b = find_locked(smem_addr(bar), "mbarrier.try_wait");
      if (try_wait_locked(b, parity)) return;
      state = std::to_string(b.pending) + " of " + std::to_string(b.expected) + " arrivals and " +
              std::to_string(b.tx) + " tx bytes outstanding";
    }
    check_abort();
    auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - clock::now()).count();
    if (left <= 0)
      fail("deadlock: mbarrier wait (parity " + std::to_string(parity & 1u) + ") timed out after " +
           std::to_string(launch_error().timeout_ms.load()) + " ms with " + state);
    if (left > 50000000) left = 50000000;
    timespec ts{0, long(left)};
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&g_mbarriers.epoch), FUTEX_WAIT_PRIVATE, seen, &ts, nullptr, 0);
  }
}

// cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [dst], [src], size, [bar]
inline void bulk_copy_g2s(void* dst, const void* src, uint32_t bytes, const void* bar) {
  if (!is_shared(dst)) fail("cp.async.bulk: destination is not in shared memory");
  if (smem_addr(dst) % 16 || reinterpret_cast<uintptr_t>(src) % 16 || bytes % 16)
    fail("cp.async.bulk: addresses and size must be multiples of 16 bytes");
  mbarrier_attach_copy(bar, [dst, src, bytes] { std::memcpy(dst, src, bytes); }, bytes);
}

inline void mbarrier_reset() {
  std::lock_guard<std::mutex> g(g_mbarriers.mu);
  g_mbarriers.bars.clear();
}
inline void mbarrier_wake() {
  g_mbarriers.epoch.fetch_add(1, std::memory_order_acq_rel);
  futex_wake(&g_mbarriers.epoch);
}
static RegisterHook mbarrier_reset_hook(hooks().block_start, mbarrier_reset);
static RegisterHook mbarrier_wake_hook(hooks().wake, mbarrier_wake);

}  // namespace kf_emu
