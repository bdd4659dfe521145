// The emulated GPU: a persistent pool of host threads that runs a grid block by
// block, with timed barriers so that misuse aborts with a message instead of
// hanging.
//
// Model (docs/backends/cuda-emu.md):
//  * blocks run in sequence; the threads of a block are `blockDim.x` real host
//    threads, created once per launch and reused for every block;
//  * `__syncthreads` is a reusable barrier over the block's live threads; every
//    warp (32 consecutive threads) has its own barrier plus a double-buffered
//    exchange area for shuffles, votes, mma.sync and ldmatrix;
//  * every wait is bounded by a timeout; a barrier that some threads can never
//    reach (because they returned) is reported at once, not after the timeout;
//  * the first error aborts the launch: waiting threads unwind with
//    kf_emu::Abort, and the host entry returns a nonzero code whose message
//    kf_emu_last_error() returns.
#pragma once
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "sys/vector_types.h"

namespace kf_emu {

constexpr int kWarpSize = 32;
constexpr int kExchangeWords = 8;  // 64-bit words each lane may post to its warp per collective

struct Abort {};  // unwinds a thread of an aborted launch

// ---- launch-wide error state --------------------------------------------------
struct LaunchError {
  std::atomic<bool> aborted{false};
  std::mutex mu;
  std::string message;
  std::atomic<int64_t> timeout_ms{20000};
};
// Namespace-scope statics, not function-local ones: with -fno-weak an inline
// function's static would be duplicated (the emulation is one translation unit).
static LaunchError g_launch_error;
inline LaunchError& launch_error() { return g_launch_error; }

void wake_all_waiters();  // defined below, after Block

// Records the first failure of the launch and wakes every waiting thread.
inline void record_failure(const std::string& msg) {
  LaunchError& e = launch_error();
  {
    std::lock_guard<std::mutex> g(e.mu);
    if (e.message.empty()) e.message = msg;
  }
  e.aborted.store(true, std::memory_order_release);
  wake_all_waiters();
}
[[noreturn]] inline void fail(const std::string& msg) { record_failure(msg); throw Abort{}; }
inline void check_abort() {
  if (launch_error().aborted.load(std::memory_order_acquire)) throw Abort{};
}

// ---- futex-based waiting --------------------------------------------------------
inline void futex_wake(std::atomic<uint32_t>* w) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(w), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

// Waits until *w != old; fails the launch after the timeout, naming `what`.
inline void wait_changed(std::atomic<uint32_t>& w, uint32_t old, const char* what) {
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + std::chrono::milliseconds(launch_error().timeout_ms.load());
  while (w.load(std::memory_order_acquire) == old) {
    check_abort();
    auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - clock::now()).count();
    if (left <= 0)
      fail(std::string("deadlock: timed out after ") + std::to_string(launch_error().timeout_ms.load()) +
           " ms waiting at " + what + " (not every thread reached it?)");
    if (left > 50000000) left = 50000000;  // re-check the abort flag every 50 ms
    timespec ts{0, long(left)};
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&w), FUTEX_WAIT_PRIVATE, old, &ts, nullptr, 0);
  }
}

// ---- barrier ----------------------------------------------------------------------
// A reusable barrier for a fixed set of n threads.  `arrived` counts threads
// waiting in the current phase and `exited` those that returned from the kernel:
// once arrived + exited == n with both nonzero, the waiters can never be
// released, which is reported immediately.
class Barrier {
 public:
  void reset(uint32_t n, const char* what) {
    n_ = n;
    what_ = what;
    state_.store(0, std::memory_order_relaxed);
  }
  void arrive_and_wait() {
    const uint32_t g = gen_.load(std::memory_order_acquire);
    const uint64_t v = state_.fetch_add(1, std::memory_order_acq_rel) + 1;
    const uint32_t arrived = uint32_t(v), exited = uint32_t(v >> 32);
    if (arrived == n_) {
      state_.fetch_sub(n_, std::memory_order_relaxed);
      gen_.fetch_add(1, std::memory_order_acq_rel);
      futex_wake(&gen_);
      return;
    }
    if (exited && arrived + exited == n_) fail(stranded(arrived, exited));
    wait_changed(gen_, g, what_);
  }
  void on_exit() {
    const uint64_t v = state_.fetch_add(uint64_t(1) << 32, std::memory_order_acq_rel) + (uint64_t(1) << 32);
    const uint32_t arrived = uint32_t(v), exited = uint32_t(v >> 32);
    if (arrived && arrived + exited == n_) record_failure(stranded(arrived, exited));
  }
  void wake() { gen_.fetch_add(1, std::memory_order_acq_rel); futex_wake(&gen_); }

 private:
  std::string stranded(uint32_t arrived, uint32_t exited) const {
    return std::string("deadlock: ") + what_ + " reached by " + std::to_string(arrived) + " of " +
           std::to_string(n_) + " threads; the other " + std::to_string(exited) + " returned without reaching it";
  }
  std::atomic<uint64_t> state_{0};
  std::atomic<uint32_t> gen_{0};
  uint32_t n_ = 0;
  const char* what_ = "";
};

// ---- warps and blocks ---------------------------------------------------------------
struct alignas(64) Warp {
  Barrier bar;
  uint32_t lanes = kWarpSize;  // live lanes: the last warp of a block may be partial
  uint64_t slot[2][kWarpSize][kExchangeWords];
};

struct Block;

// Per host thread: its coordinates and the state its collectives need.
struct ThreadCtx {
  uint3 thread_idx{0, 0, 0};
  uint3 block_idx{0, 0, 0};
  uint32_t tid = 0, lane = 0, warp = 0;
  uint32_t warp_phase = 0;   // which half of the exchange area the next warp collective uses
  uint32_t block_phase = 0;  // same for __syncthreads_count/and/or
  Block* block = nullptr;
};
static thread_local ThreadCtx g_ctx;
inline ThreadCtx& ctx() { return g_ctx; }

// Hooks other headers register to reset per-block state and to finish a
// thread's outstanding asynchronous copies when it returns.
struct Hooks {
  std::vector<void (*)()> block_start;    // called by the launching thread before each block
  std::vector<void (*)()> thread_start;   // called by each thread before the kernel body
  std::vector<void (*)()> thread_finish;  // called by each thread after the kernel body returns
  std::vector<void (*)()> wake;           // called on abort, to wake waiters of other kinds
};
static Hooks g_hooks;
inline Hooks& hooks() { return g_hooks; }
struct RegisterHook {
  RegisterHook(std::vector<void (*)()>& list, void (*fn)()) { list.push_back(fn); }
};

struct Block {
  uint32_t nthreads = 0;
  Barrier bar;
  std::vector<Warp> warps;
  std::atomic<uint32_t> counts[2];  // __syncthreads_count / _and / _or accumulators, double-buffered
  void reset(uint32_t n) {
    nthreads = n;
    bar.reset(n, "__syncthreads()");
    const uint32_t nw = (n + kWarpSize - 1) / kWarpSize;
    if (warps.size() != nw) warps = std::vector<Warp>(nw);
    for (uint32_t w = 0; w < nw; ++w) {
      warps[w].lanes = std::min<uint32_t>(kWarpSize, n - w * kWarpSize);
      warps[w].bar.reset(warps[w].lanes, "a warp-synchronous operation (__syncwarp/__shfl_sync/vote/mma.sync/ldmatrix)");
    }
    counts[0] = counts[1] = 0;
  }
};
static Block* g_current_block = nullptr;
inline Block*& current_block() { return g_current_block; }

inline void wake_all_waiters() {
  if (Block* b = current_block()) {
    b->bar.wake();
    for (Warp& w : b->warps) w.bar.wake();
  }
  for (auto fn : hooks().wake) fn();
}

inline Warp& my_warp() { return ctx().block->warps[ctx().warp]; }

struct LaunchDims { dim3 grid, block; };
static LaunchDims g_launch_dims;
inline LaunchDims& launch_dims() { return g_launch_dims; }

// ---- the launch ------------------------------------------------------------------------
// Runs `body` for every block of `grid` with `threads` host threads per block.
// Returns 0, or 1 with the message in launch_error().message.
class Launch {
 public:
  Launch(uint3 grid, uint32_t threads, std::function<void()> body)
      : grid_(grid), threads_(threads), body_(std::move(body)) {}

  int run() {
    LaunchError& e = launch_error();
    e.aborted = false;
    e.message.clear();
    if (threads_ == 0 || threads_ > 1024) {
      e.message = "block size " + std::to_string(threads_) + " outside 1..1024";
      return 1;
    }
    launch_dims() = LaunchDims{dim3(grid_), dim3(threads_, 1, 1)};
    current_block() = &block_;
    for (uint32_t t = 0; t < threads_; ++t) pool_.emplace_back([this, t] { worker(t); });
    for (uint32_t z = 0; z < grid_.z && !e.aborted; ++z)
      for (uint32_t y = 0; y < grid_.y && !e.aborted; ++y)
        for (uint32_t x = 0; x < grid_.x && !e.aborted; ++x) run_block(uint3{x, y, z});
    stop_ = true;
    start_.fetch_add(1);
    futex_wake(&start_);
    for (auto& t : pool_) t.join();
    current_block() = nullptr;
    return e.aborted ? 1 : 0;
  }

 private:
  void run_block(uint3 b) {
    block_.reset(threads_);
    for (auto fn : hooks().block_start) fn();
    block_idx_ = b;
    done_.store(0);
    start_.fetch_add(1, std::memory_order_acq_rel);
    futex_wake(&start_);
    for (uint32_t d; (d = done_.load(std::memory_order_acquire)) != threads_;)
      syscall(SYS_futex, reinterpret_cast<uint32_t*>(&done_), FUTEX_WAIT_PRIVATE, d, nullptr, nullptr, 0);
  }

  void worker(uint32_t t) {
    uint32_t seen = 0;
    ThreadCtx& c = ctx();
    for (;;) {
      for (uint32_t s; (s = start_.load(std::memory_order_acquire)) == seen;)
        syscall(SYS_futex, reinterpret_cast<uint32_t*>(&start_), FUTEX_WAIT_PRIVATE, s, nullptr, nullptr, 0);
      seen = start_.load(std::memory_order_acquire);
      if (stop_) return;
      c = ThreadCtx{};
      c.thread_idx = uint3{t, 0, 0};
      c.block_idx = block_idx_;
      c.tid = t;
      c.lane = t % kWarpSize;
      c.warp = t / kWarpSize;
      c.block = &block_;
      for (auto fn : hooks().thread_start) fn();
      try {
        body_();
        for (auto fn : hooks().thread_finish) fn();
      } catch (Abort&) {
      } catch (std::exception& ex) {
        record_failure(std::string("exception in emulated thread: ") + ex.what());
      }
      block_.bar.on_exit();
      block_.warps[c.warp].bar.on_exit();
      if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == threads_) futex_wake(&done_);
    }
  }

  uint3 grid_;
  uint32_t threads_;
  std::function<void()> body_;
  Block block_;
  uint3 block_idx_{0, 0, 0};
  std::vector<std::thread> pool_;
  std::atomic<uint32_t> start_{0};
  std::atomic<uint32_t> done_{0};
  std::atomic<bool> stop_{false};
};

static std::mutex g_one_launch_at_a_time;

// The host entry's launch: one launch at a time per process (the emulated GPU
// is global state), grid given as up to three extents.
inline int launch_grid(const int64_t* grid, int rank, uint32_t threads, std::function<void()> body) {
  std::lock_guard<std::mutex> g(g_one_launch_at_a_time);
  uint32_t ext[3] = {1, 1, 1};
  for (int i = 0; i < rank; ++i) {
    if (grid[i] < 0 || grid[i] > INT32_MAX) {
      launch_error().message = "grid extent " + std::to_string(grid[i]) + " out of range";
      return 1;
    }
    ext[i] = uint32_t(grid[i]);
  }
  if (ext[0] == 0 || ext[1] == 0 || ext[2] == 0) return 0;  // an empty grid launches nothing
  return Launch(uint3{ext[0], ext[1], ext[2]}, threads, std::move(body)).run();
}
inline const char* last_error() { return launch_error().message.c_str(); }

}  // namespace kf_emu

// Module-wide exports next to the generated kf_emu_<name> entries (one module
// may hold several kernels): the last launch's error and the deadlock timeout.
extern "C" const char* kf_emu_last_error() { return kf_emu::last_error(); }
extern "C" void kf_emu_set_timeout_ms(long long ms) { kf_emu::launch_error().timeout_ms = ms; }
