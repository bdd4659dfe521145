// The emulated GPU: a persistent pool of host threads that runs a grid block by
// block, with timed barriers so that misuse aborts with a message instead of
// hanging.
//
// Model (docs/backends/cuda-emu.md):
//  * blocks run in sequence; the threads of a block are `blockDim.x` real host
//    threads, created once per launch and reused for every block;
//  * a cluster launch (cluster size C along x or y, `__cluster_dims__`) runs the C CTAs of a
//    cluster at the same time: C * blockDim.x host threads, each CTA with its own Block
//    (its __syncthreads, warps) and its own slice of the shared arena (kf/emu/cluster.h);
//  * `__syncthreads` is a reusable barrier over the block's threads; every warp
//    (32 consecutive threads) has its own barrier plus a double-buffered
//    exchange area for shuffles, votes, mma.sync and ldmatrix;
//  * every wait is bounded by a timeout; a barrier that some threads can never
//    reach (because they returned) is reported at once, not after the timeout, and so
//    is a launch step whose every thread waits with nothing progressing (Quiescence);
//  * the first error aborts the launch: waiting threads unwind with
//    kf_emu::Abort, and the host entry returns a nonzero code whose message
//    kf_emu_last_error() returns.
// Only light headers (C library, <atomic>, <type_traits>): every emulated
// kernel parses this, and the heavy C++ library headers would double the
// compile time of a typical kernel.
#pragma once
#include <linux/futex.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>

#include "sys/vector_types.h"

namespace kf_emu {

constexpr int kWarpSize = 32;
constexpr int kMaxThreads = 1024;  // host threads of one launch step (a block, or a whole cluster)
constexpr int kMaxCluster = 8;     // the portable cluster size limit
constexpr int kExchangeWords = 8;  // 64-bit words each lane may post to its warp per collective

struct Abort {};  // unwinds a thread of an aborted launch

// ---- small utilities ---------------------------------------------------------------
class Mutex {
 public:
  void lock() { pthread_mutex_lock(&m_); }
  void unlock() { pthread_mutex_unlock(&m_); }

 private:
  pthread_mutex_t m_ = PTHREAD_MUTEX_INITIALIZER;
};
class Lock {
 public:
  explicit Lock(Mutex& m) : m_(m) { m_.lock(); }
  ~Lock() { m_.unlock(); }
  Lock(const Lock&) = delete;

 private:
  Mutex& m_;
};

// A growable array of trivially copyable items (the async-copy and wgmma queues).
template <class T>
class Vec {
  static_assert(std::is_trivially_copyable<T>::value, "Vec holds trivially copyable items");

 public:
  Vec() = default;
  Vec(const Vec&) = delete;
  ~Vec() { std::free(data_); }
  void push(const T& v) {
    if (n_ == cap_) {
      cap_ = cap_ ? 2 * cap_ : 16;
      data_ = static_cast<T*>(std::realloc(static_cast<void*>(data_), cap_ * sizeof(T)));
      if (!data_) throw std::bad_alloc();
    }
    data_[n_++] = v;
  }
  void clear() { n_ = 0; }
  size_t size() const { return n_; }
  T& operator[](size_t i) { return data_[i]; }
  // Keeps the items for which keep(item) is true, in order.
  template <class F>
  void retain(F&& keep) {
    size_t out = 0;
    for (size_t i = 0; i < n_; ++i)
      if (keep(data_[i])) data_[out++] = data_[i];
    n_ = out;
  }

 private:
  T* data_ = nullptr;
  size_t n_ = 0, cap_ = 0;
};

inline int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// ---- launch-wide error state --------------------------------------------------
struct LaunchError {
  std::atomic<bool> aborted{false};
  Mutex mu;
  char message[2048] = {0};
  std::atomic<int64_t> timeout_ms{20000};
};
// Namespace-scope statics: the emulation is one translation unit per module.
static LaunchError g_launch_error;
inline LaunchError& launch_error() { return g_launch_error; }

void wake_all_waiters();  // defined below, after Block

// Records the first failure of the launch (printf-style) and wakes every waiting thread.
__attribute__((format(printf, 1, 0))) inline void record_failure_v(const char* fmt, va_list ap) {
  LaunchError& e = launch_error();
  {
    Lock g(e.mu);
    if (!e.message[0]) vsnprintf(e.message, sizeof e.message, fmt, ap);
  }
  e.aborted.store(true, std::memory_order_release);
  wake_all_waiters();
}
__attribute__((format(printf, 1, 2))) inline void record_failure(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  record_failure_v(fmt, ap);
  va_end(ap);
}
[[noreturn]] __attribute__((format(printf, 1, 2))) inline void fail(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  record_failure_v(fmt, ap);
  va_end(ap);
  throw Abort{};
}
inline void check_abort() {
  if (launch_error().aborted.load(std::memory_order_acquire)) throw Abort{};
}

// ---- quiescence: a deadlock seen before its timeout ------------------------------------
// Every wait loop counts itself in `waiting` (WaitScope); every wake, every thread leaving a
// wait and every thread returning bumps `progress`.  Nothing outside the launch step's threads
// completes anything (asynchronous copies and MMAs are performed by threads inside their
// waits), so once every live thread has been waiting for kQuietMs with no progress, none can
// ever release another: the wait fails then instead of at the timeout.  The quiet time is far
// above a 50 ms poll, so a thread whose condition came true re-checks and leaves in time.
struct Quiescence {
  std::atomic<int32_t> live{0}, waiting{0};
  std::atomic<uint64_t> progress{0};
};
static Quiescence g_quiescence;
constexpr int64_t kQuietMs = 400;

class WaitScope {
 public:
  explicit WaitScope(int64_t quiet_ms = kQuietMs)
      : quiet_ns_((quiet_ms < 50 ? 50 : quiet_ms) * 1000000), seen_(g_quiescence.progress.load()), since_(now_ns()) {
    g_quiescence.waiting.fetch_add(1, std::memory_order_acq_rel);
  }
  ~WaitScope() {
    g_quiescence.waiting.fetch_sub(1, std::memory_order_acq_rel);
    g_quiescence.progress.fetch_add(1, std::memory_order_acq_rel);
  }
  WaitScope(const WaitScope&) = delete;
  WaitScope& operator=(const WaitScope&) = delete;
  // Whether every live thread has been waiting, with no progress, for the quiet time.
  bool stuck() {
    const uint64_t p = g_quiescence.progress.load(std::memory_order_acquire);
    const int64_t now = now_ns();
    if (p != seen_ || g_quiescence.waiting.load(std::memory_order_acquire) < g_quiescence.live.load()) {
      seen_ = p;
      since_ = now;
      return false;
    }
    return now - since_ >= quiet_ns_;
  }

 private:
  int64_t quiet_ns_;
  uint64_t seen_;
  int64_t since_;
};

// ---- futex-based waiting --------------------------------------------------------
inline void futex_wake(std::atomic<uint32_t>* w) {
  g_quiescence.progress.fetch_add(1, std::memory_order_acq_rel);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(w), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}
inline void futex_wait(std::atomic<uint32_t>* w, uint32_t old, int64_t timeout_ns) {
  timespec ts{time_t(timeout_ns / 1000000000), long(timeout_ns % 1000000000)};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(w), FUTEX_WAIT_PRIVATE, old, timeout_ns >= 0 ? &ts : nullptr,
          nullptr, 0);
}

// Waits until *w != old; fails the launch after the timeout, naming `what`.
inline void wait_changed(std::atomic<uint32_t>& w, uint32_t old, const char* what) {
  const int64_t timeout_ms = launch_error().timeout_ms.load();
  const int64_t deadline = now_ns() + timeout_ms * 1000000;
  WaitScope scope;
  while (w.load(std::memory_order_acquire) == old) {
    check_abort();
    int64_t left = deadline - now_ns();
    if (left <= 0)
      fail("deadlock: timed out after %lld ms waiting at %s (not every thread reached it?)", (long long)timeout_ms,
           what);
    if (scope.stuck())
      fail("deadlock: every emulated thread is waiting and none can release another; this one waits at %s", what);
    futex_wait(&w, old, left < 50000000 ? left : 50000000);  // re-check the abort flag every 50 ms
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
    if (exited && arrived + exited == n_) fail(kStranded, what_, arrived, n_, exited);
    wait_changed(gen_, g, what_);
  }
  void on_exit() {
    const uint64_t v = state_.fetch_add(uint64_t(1) << 32, std::memory_order_acq_rel) + (uint64_t(1) << 32);
    const uint32_t arrived = uint32_t(v), exited = uint32_t(v >> 32);
    if (arrived && arrived + exited == n_) record_failure(kStranded, what_, arrived, n_, exited);
  }
  void wake() {
    gen_.fetch_add(1, std::memory_order_acq_rel);
    futex_wake(&gen_);
  }

 private:
  static constexpr const char* kStranded =
      "deadlock: %s reached by %u of %u threads; the other %u returned without reaching it";
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
  uint32_t cta_rank = 0;     // %cluster_ctarank: this CTA's rank in its cluster (0 without clusters)
  uint32_t warp_phase = 0;   // which half of the exchange area the next warp collective uses
  uint32_t block_phase = 0;  // same for __syncthreads_count/and/or
  Block* block = nullptr;
};
static thread_local ThreadCtx g_ctx;
inline ThreadCtx& ctx() { return g_ctx; }

// Hooks other headers register to reset per-block state, to set up and finish
// a thread's asynchronous-copy queues, and to wake their waiters on abort.
struct HookList {
  void (*fns[16])() = {};
  int n = 0;
  void run() const {
    for (int i = 0; i < n; ++i) fns[i]();
  }
};
struct Hooks {
  HookList block_start;   // by the launching thread before each block
  HookList thread_start;  // by each thread before the kernel body
  HookList thread_finish; // by each thread after the kernel body returns
  HookList wake;          // on abort
};
static Hooks g_hooks;
inline Hooks& hooks() { return g_hooks; }
struct RegisterHook {
  RegisterHook(HookList& list, void (*fn)()) { list.fns[list.n++] = fn; }
};

struct Block {
  uint32_t nthreads = 0;
  Barrier bar;
  Warp warps[kMaxThreads / kWarpSize];
  std::atomic<uint32_t> counts[2];  // __syncthreads_count / _and / _or accumulators, double-buffered
  void reset(uint32_t n) {
    nthreads = n;
    bar.reset(n, "__syncthreads()");
    for (uint32_t w = 0; w * kWarpSize < n; ++w) {
      warps[w].lanes = n - w * kWarpSize < uint32_t(kWarpSize) ? n - w * kWarpSize : uint32_t(kWarpSize);
      warps[w].bar.reset(warps[w].lanes, "a warp-synchronous operation (__syncwarp/__shfl_sync/vote/mma.sync/ldmatrix)");
    }
    counts[0] = counts[1] = 0;
  }
  uint32_t nwarps() const { return (nthreads + kWarpSize - 1) / kWarpSize; }
};
static Block* g_current_block = nullptr;
inline Block*& current_block() { return g_current_block; }

// The running cluster: its size and every CTA's Block (cta[0] is current_block()).
struct ClusterRun {
  uint32_t size = 1;
  Block* cta[kMaxCluster] = {};
};
static ClusterRun g_cluster_run;
inline ClusterRun& cluster_run() { return g_cluster_run; }

inline void wake_all_waiters() {
  for (uint32_t r = 0; r < cluster_run().size; ++r)
    if (Block* b = cluster_run().cta[r]) {
      b->bar.wake();
      for (uint32_t w = 0; w < b->nwarps(); ++w) b->warps[w].bar.wake();
    }
  hooks().wake.run();
}

inline Warp& my_warp() { return ctx().block->warps[ctx().warp]; }

struct LaunchDims {
  dim3 grid, block;
};
static LaunchDims g_launch_dims;
inline LaunchDims& launch_dims() { return g_launch_dims; }

// ---- the launch ------------------------------------------------------------------------
// Runs `body(arg)` for every block of `grid` with `threads` host threads per block; with a
// cluster size > 1 the CTAs of each cluster (consecutive blockIdx.x, or blockIdx.y with
// `axis` 1: __cluster_dims__(1, C, 1), CTA rank = y offset in the cluster) run together.
// Returns 0, or 1 with the message in launch_error().message.
class Launch {
 public:
  Launch(uint3 grid, uint32_t threads, void (*body)(void*), void* arg, uint32_t cluster = 1, uint32_t axis = 0)
      : grid_(grid), threads_(threads), cluster_(cluster), axis_(axis), body_(body), arg_(arg) {}

  int run() {
    LaunchError& e = launch_error();
    e.aborted = false;
    e.message[0] = 0;
    if (threads_ == 0 || threads_ > uint32_t(kMaxThreads)) {
      snprintf(e.message, sizeof e.message, "block size %u outside 1..%d", threads_, kMaxThreads);
      return 1;
    }
    const uint32_t along = axis_ == 1 ? grid_.y : grid_.x;
    if (cluster_ < 1 || cluster_ > uint32_t(kMaxCluster) || axis_ > 1 || along % cluster_ ||
        threads_ * cluster_ > kMaxThreads) {
      snprintf(e.message, sizeof e.message,
               "cluster size %u: must be 1..%d, along x or y (axis %u), divide gridDim.%c (%u) and fit %d host threads "
               "with %u per block", cluster_, kMaxCluster, axis_, axis_ == 1 ? 'y' : 'x', along, kMaxThreads, threads_);
      return 1;
    }
    launch_dims() = LaunchDims{dim3(grid_), dim3(threads_, 1, 1)};
    cluster_run().size = cluster_;
    for (uint32_t r = 0; r < cluster_; ++r) cluster_run().cta[r] = blocks_[r] = new Block;
    current_block() = blocks_[0];
    const uint32_t total = threads_ * cluster_;
    uint32_t started = 0;
    for (; started < total; ++started) {
      args_[started] = WorkerArg{this, started};
      if (pthread_create(&pool_[started], nullptr, &Launch::worker_main, &args_[started]) != 0) {
        record_failure("could not start emulated thread %u of %u", started, total);
        break;
      }
    }
    if (started == total)
      for (uint32_t z = 0; z < grid_.z && !e.aborted; ++z)
        for (uint32_t y = 0; y < grid_.y && !e.aborted; y += axis_ == 1 ? cluster_ : 1)
          for (uint32_t x = 0; x < grid_.x && !e.aborted; x += axis_ == 1 ? 1 : cluster_) run_block(uint3{x, y, z});
    stop_ = true;
    start_.fetch_add(1);
    futex_wake(&start_);
    for (uint32_t t = 0; t < started; ++t) pthread_join(pool_[t], nullptr);
    current_block() = nullptr;
    cluster_run() = ClusterRun{};
    return e.aborted ? 1 : 0;
  }

 private:
  struct WorkerArg {
    Launch* self;
    uint32_t tid;
  };
  static void* worker_main(void* p) {
    auto* a = static_cast<WorkerArg*>(p);
    a->self->worker(a->tid);
    return nullptr;
  }

  // Runs one block, or the cluster whose first CTA is `b`.
  void run_block(uint3 b) {
    for (uint32_t r = 0; r < cluster_; ++r) blocks_[r]->reset(threads_);
    hooks().block_start.run();
    block_idx_ = b;
    done_.store(0);
    start_.fetch_add(1, std::memory_order_acq_rel);
    futex_wake(&start_);
    const uint32_t total = threads_ * cluster_;
    g_quiescence.live.store(int32_t(total));
    for (uint32_t d; (d = done_.load(std::memory_order_acquire)) != total;) futex_wait(&done_, d, -1);
  }

  void worker(uint32_t t) {
    uint32_t seen = 0;
    ThreadCtx& c = ctx();
    for (;;) {
      for (uint32_t s; (s = start_.load(std::memory_order_acquire)) == seen;) futex_wait(&start_, s, -1);
      seen = start_.load(std::memory_order_acquire);
      if (stop_) return;
      c = ThreadCtx{};
      const uint32_t local = t % threads_;
      c.cta_rank = t / threads_;
      c.thread_idx = uint3{local, 0, 0};
      c.block_idx = axis_ == 1 ? uint3{block_idx_.x, block_idx_.y + c.cta_rank, block_idx_.z}
                               : uint3{block_idx_.x + c.cta_rank, block_idx_.y, block_idx_.z};
      c.tid = local;
      c.lane = local % kWarpSize;
      c.warp = local / kWarpSize;
      c.block = blocks_[c.cta_rank];
      hooks().thread_start.run();
      try {
        body_(arg_);
        hooks().thread_finish.run();
      } catch (Abort&) {
      } catch (...) {
        record_failure("a C++ exception escaped emulated thread %u", t);
      }
      g_quiescence.live.fetch_sub(1, std::memory_order_acq_rel);
      g_quiescence.progress.fetch_add(1, std::memory_order_acq_rel);
      c.block->bar.on_exit();
      c.block->warps[c.warp].bar.on_exit();
      if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == threads_ * cluster_) futex_wake(&done_);
    }
  }

  uint3 grid_;
  uint32_t threads_;
  uint32_t cluster_;
  uint32_t axis_;  // the grid axis the cluster spans: 0 (x) or 1 (y)
  void (*body_)(void*);
  void* arg_;
  Block* blocks_[kMaxCluster] = {};  // one per CTA of a cluster; large (the warps' exchange areas): on the heap
  uint3 block_idx_{0, 0, 0};
  pthread_t pool_[kMaxThreads];
  WorkerArg args_[kMaxThreads];
  std::atomic<uint32_t> start_{0};
  std::atomic<uint32_t> done_{0};
  std::atomic<bool> stop_{false};

 public:
  ~Launch() {
    for (Block* b : blocks_) delete b;
  }
  Launch(const Launch&) = delete;
};

static Mutex g_one_launch_at_a_time;

// The host entry's launch: one launch at a time per module (the emulated GPU is
// global state), grid given as up to three extents; `cluster`: CTAs per cluster along `axis`
// (0: x, 1: y).
template <class F>
inline int launch_grid(const int64_t* grid, int rank, uint32_t threads, F&& body, uint32_t cluster = 1,
                       uint32_t axis = 0) {
  Lock g(g_one_launch_at_a_time);
  uint32_t ext[3] = {1, 1, 1};
  for (int i = 0; i < rank; ++i) {
    if (grid[i] < 0 || grid[i] > INT32_MAX) {
      snprintf(launch_error().message, sizeof launch_error().message, "grid extent %lld out of range",
               (long long)grid[i]);
      return 1;
    }
    ext[i] = uint32_t(grid[i]);
  }
  if (ext[0] == 0 || ext[1] == 0 || ext[2] == 0) return 0;  // an empty grid launches nothing
  using Body = typename std::remove_reference<F>::type;
  auto trampoline = [](void* p) { (*static_cast<Body*>(p))(); };
  Launch* launch = new Launch(uint3{ext[0], ext[1], ext[2]}, threads, trampoline, &body, cluster, axis);
  const int status = launch->run();
  delete launch;
  return status;
}
inline const char* last_error() { return launch_error().message; }

}  // namespace kf_emu

// Module-wide exports next to the generated kf_emu_<name> entries (one module
// may hold several kernels): the last launch's error and the deadlock timeout.
extern "C" const char* kf_emu_last_error() { return kf_emu::last_error(); }
extern "C" void kf_emu_set_timeout_ms(long long ms) { kf_emu::launch_error().timeout_ms = ms; }
