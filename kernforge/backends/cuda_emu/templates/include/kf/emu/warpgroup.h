// Host emulation of the warp-specialization instructions (kf/fence.cuh):
// named barriers (`bar.sync id, count`) and `setmaxnreg.{inc,dec}.sync.aligned`.
//
// Named barrier id (1..15; 0 is __syncthreads'): the first thread to arrive in a phase
// fixes its thread count; a thread arriving with another count fails the launch; the
// phase completes when `count` threads have arrived.  Waits are bounded by the deadlock
// timeout (a producer that never reaches a barrier its consumers wait on is reported).
//
// setmaxnreg (register *accounting* only: the host has no register file).  Why model it:
// a wrong count is a launch failure or a silent deadlock on the GPU, and no CPU test
// would see it otherwise.  The CTA's pool is 64K registers; each warpgroup starts with
// the launch's even share, min(256, 65536 / blockDim rounded down to 8) per thread.
// An instruction is checked when its warpgroup's 128th thread reaches it:
//  * the count must be a multiple of 8 in [24, 256];
//  * the block must be whole warpgroups, and all 128 threads must execute the same
//    instruction (same action, same count: `.sync.aligned`); the threads wait for each other;
//  * .dec returns registers to the pool at once; .inc blocks until the pool holds them
//    (as the hardware does), so a block whose counts can never fit 64K times out with a
//    message naming setmaxnreg.
// State is per block (per CTA of a cluster launch: each CTA has its own barriers and register
// file), reset before every block.
#pragma once
#include <cstdint>

#include "kf/emu/runtime.h"

namespace kf_emu {

constexpr int kNamedBarriers = 16;
constexpr int64_t kRegisterFile = 65536;
constexpr uint32_t kWarpgroup = 128;

struct NamedBarrierState {
  Mutex mu;
  uint32_t expected = 0, arrived = 0;
  std::atomic<uint32_t> gen{0};
};

struct WarpgroupRegs {
  Mutex mu;
  uint32_t arrived = 0;  // threads of the warpgroup at the pending setmaxnreg
  int32_t count = 0;     // its count and action, fixed by the first thread to arrive
  bool inc = false;
  int32_t regs = 0;      // the warpgroup's current per-thread count
  std::atomic<uint32_t> gen{0};
};

struct WarpgroupState {
  NamedBarrierState bars[kNamedBarriers];
  WarpgroupRegs wg[kMaxThreads / kWarpgroup];
  Mutex pool_mu;
  int64_t used = 0;                // registers held by the block's warpgroups
  std::atomic<uint32_t> released{0};  // bumped by every .dec (an .inc waiting for room re-checks)
};
static WarpgroupState g_warpgroups[kMaxCluster];
inline WarpgroupState& my_warpgroups() { return g_warpgroups[ctx().cta_rank]; }

inline int32_t initial_regs(uint32_t nthreads) {
  const int64_t share = kRegisterFile / nthreads / 8 * 8;
  return int32_t(share < 256 ? share : 256);
}

inline void warpgroup_reset() {
  const uint32_t n = current_block()->nthreads;
  for (WarpgroupState& s : g_warpgroups) {
    for (auto& b : s.bars) {
      b.expected = b.arrived = 0;
    }
    for (auto& w : s.wg) {
      w.arrived = 0;
      w.regs = initial_regs(n);
    }
    s.used = int64_t(initial_regs(n)) * n;
  }
}

inline void warpgroup_wake() {
  for (WarpgroupState& s : g_warpgroups) {
    for (auto& b : s.bars) {
      b.gen.fetch_add(1);
      futex_wake(&b.gen);
    }
    for (auto& w : s.wg) {
      w.gen.fetch_add(1);
      futex_wake(&w.gen);
    }
    s.released.fetch_add(1);
    futex_wake(&s.released);
  }
}

inline void named_barrier_sync(int id, int count) {
  const uint32_t n = ctx().block->nthreads;
  if (id <= 0 || id >= kNamedBarriers)
    fail("bar.sync %d, %d: barrier id must be in 1..%d (0 is __syncthreads')", id, count, kNamedBarriers - 1);
  if (count <= 0 || count % kWarpSize || uint32_t(count) > n)
    fail("bar.sync %d, %d: the thread count must be a positive multiple of 32 and at most the block's %u", id,
         count, n);
  NamedBarrierState& b = my_warpgroups().bars[id];
  uint32_t g;
  {
    Lock l(b.mu);
    if (b.expected == 0) b.expected = uint32_t(count);
    if (b.expected != uint32_t(count))
      fail("bar.sync %d: thread %u arrives with count %d, threads already waiting use %u", id, ctx().tid, count,
           b.expected);
    g = b.gen.load(std::memory_order_acquire);
    if (++b.arrived == b.expected) {
      b.arrived = b.expected = 0;
      b.gen.fetch_add(1, std::memory_order_acq_rel);
      futex_wake(&b.gen);
      return;
    }
  }
  wait_changed(b.gen, g, "a named barrier (bar.sync id, count: fewer threads than its count reached it)");
  check_abort();
}

// wait_changed (runtime.h) with its own time limit: the setmaxnreg waits are scaled so that the
// cause of a hang reports first.  An .inc waiting for registers gives up after half the deadlock
// timeout (everything else in the block is then waiting on it); a thread waiting for its
// warpgroup's last thread waits twice the timeout (that thread may be the waiting .inc).
inline void wait_within(std::atomic<uint32_t>& w, uint32_t old, int64_t timeout_ms, const char* what) {
  const int64_t deadline = now_ns() + timeout_ms * 1000000;
  // the quiet time scales as the timeout does, so the cause of a hang still reports first
  const int64_t launch_timeout_ms = launch_error().timeout_ms.load();
  WaitScope scope(kQuietMs * timeout_ms / (launch_timeout_ms > 0 ? launch_timeout_ms : 1));
  while (w.load(std::memory_order_acquire) == old) {
    check_abort();
    const int64_t left = deadline - now_ns();
    if (left <= 0) fail("deadlock: timed out after %lld ms waiting at %s", (long long)timeout_ms, what);
    if (scope.stuck()) fail("deadlock: every emulated thread is waiting; this one waits at %s", what);
    futex_wait(&w, old, left < 50000000 ? left : 50000000);
  }
  check_abort();
}

// Applied once per warpgroup instruction, by its last-arriving thread.
inline void setmaxnreg_apply(WarpgroupRegs& w) {
  WarpgroupState& s = my_warpgroups();
  for (;;) {
    uint32_t seen;
    {
      Lock l(s.pool_mu);
      const int64_t used = s.used + int64_t(w.count - w.regs) * kWarpgroup;
      if (!w.inc || used <= kRegisterFile) {
        s.used = used;
        w.regs = w.count;
        if (!w.inc) {
          s.released.fetch_add(1, std::memory_order_acq_rel);
          futex_wake(&s.released);
        }
        return;
      }
      seen = s.released.load(std::memory_order_acquire);
    }
    wait_within(s.released, seen, launch_error().timeout_ms.load() / 2,
                "setmaxnreg.inc: the CTA's register pool cannot supply the warpgroup's new count (the "
                "block's setmaxnreg counts exceed 64K registers)");
  }
}

inline void setmaxnreg(bool inc, int count) {
  const char* act = inc ? "inc" : "dec";
  if (count < 24 || count > 256 || count % 8)
    fail("setmaxnreg.%s %d: the count must be a multiple of 8 in [24, 256]", act, count);
  const uint32_t n = ctx().block->nthreads;
  if (n % kWarpgroup) fail("setmaxnreg.%s %d: the block's %u threads are not whole warpgroups", act, count, n);
  const uint32_t wg = ctx().tid / kWarpgroup;
  WarpgroupRegs& w = my_warpgroups().wg[wg];
  uint32_t g;
  bool last;
  {
    Lock l(w.mu);
    if (w.arrived == 0) {
      w.count = count;
      w.inc = inc;
    } else if (w.count != count || w.inc != inc) {
      fail("setmaxnreg is not warpgroup-uniform: thread %u of warpgroup %u executes .%s %d, its warpgroup .%s %d",
           ctx().tid, wg, act, count, w.inc ? "inc" : "dec", w.count);
    }
    g = w.gen.load(std::memory_order_acquire);
    last = ++w.arrived == kWarpgroup;
  }
  if (!last) {
    wait_within(w.gen, g, 2 * launch_error().timeout_ms.load(),
                "setmaxnreg (.sync.aligned: every thread of the warpgroup must execute it)");
    return;
  }
  setmaxnreg_apply(w);
  {
    Lock l(w.mu);
    w.arrived = 0;
  }
  w.gen.fetch_add(1, std::memory_order_acq_rel);
  futex_wake(&w.gen);
}

static RegisterHook warpgroup_reset_hook(hooks().block_start, warpgroup_reset);
static RegisterHook warpgroup_wake_hook(hooks().wake, warpgroup_wake);

}  // namespace kf_emu
