// ascend-emu: the per-block state behind the Ascend C shim (kernel_operator.h).
//
// Why a shim: no NPU and no bisheng exist where kernforge is built, so the
// generated Ascend C is compiled *unchanged* with g++ against this header set,
// which mirrors the public signatures of the subset kernforge emits
// (shared/specs/ascend-c-subset.md) and enforces the hardware's rules.  Every
// violation throws RuleError naming the rule; the launcher (runtime.h) turns the
// first one into the launch's error string, which the Python side raises as
// AscendEmuError(rule=...).
//
// What one block owns (a thread runs it): its core type (AIV or AIC), on-chip
// memories of the arch's capacities (poisoned at block start), the TPipe's pools,
// queue buffer states, event flags, and a hazard shadow per 32-byte DataBlock that
// records the last writer (and DMA reader) pipe of each block with the pipe's
// epoch: an access by another pipe to a block whose writer has not been retired by
// a WaitFlag is the missing-synchronisation error the NPU would turn into a race.
// Retirement is per pipe pair (a vector clock): WaitFlag<SRC_DST> orders only DST after
// SRC's earlier work (plus what SRC itself had waited for when it set the flag), so
// WaitFlag<M_MTE1> does not let FIX read what M wrote.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#ifndef __NPU_ARCH__
#error "ascend-emu: compile with -D__NPU_ARCH__=2201 (dav-c220) or 3510"
#endif

namespace kf_emu {

// ---------------------------------------------------------------- errors

struct RuleError : std::runtime_error {
  std::string rule;
  RuleError(const std::string& r, const std::string& detail) : std::runtime_error(r + ": " + detail), rule(r) {}
};

[[noreturn]] inline void fail(const char* rule, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
[[noreturn]] inline void fail(const char* rule, const char* fmt, ...) {
  char buf[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  throw RuleError(rule, buf);
}

// ---------------------------------------------------------------- arch tables (spec section 2)

enum class Mem : uint8_t { GM, UB, L1, L0A, L0B, L0C, COUNT };

inline const char* mem_name(Mem m) {
  static const char* n[] = {"GM", "UB", "L1", "L0A", "L0B", "L0C"};
  return n[static_cast<int>(m)];
}

inline uint32_t capacity(Mem m) {
#if __NPU_ARCH__ == 2201
  static const uint32_t cap[] = {0, 192 * 1024, 512 * 1024 - 128, 64 * 1024, 64 * 1024, 128 * 1024};
#elif __NPU_ARCH__ == 3510
  static const uint32_t cap[] = {0, 248 * 1024, 512 * 1024, 64 * 1024, 64 * 1024, 256 * 1024};
#else
#error "ascend-emu: __NPU_ARCH__ must be 2201 or 3510"
#endif
  return cap[static_cast<int>(m)];
}

inline const char* arch_name() { return __NPU_ARCH__ == 2201 ? "dav-c220 (2201)" : "dav-3510"; }

// start-address alignment of operands in each memory
inline uint32_t alignment(Mem m) {
  static const uint32_t a[] = {1, 32, 32, 512, 512, 64};
  return a[static_cast<int>(m)];
}

// ---------------------------------------------------------------- pipes and events

enum Pipe : uint8_t { P_S = 0, P_V, P_M, P_MTE1, P_MTE2, P_MTE3, P_FIX, P_COUNT };

inline const char* pipe_name(int p) {
  static const char* n[] = {"S", "V", "M", "MTE1", "MTE2", "MTE3", "FIX"};
  return n[p];
}

enum class Core : uint8_t { AIV, AIC };

// One queue buffer's state (spec section 3): FREE -> OCCUPIED -> ENQUE -> DEQUE -> FREE.
enum class BufState : uint8_t { FREE, OCCUPIED, ENQUE, DEQUE };

inline const char* state_name(BufState s) {
  static const char* n[] = {"FREE", "OCCUPIED", "ENQUE", "DEQUE"};
  return n[static_cast<int>(s)];
}

// ---------------------------------------------------------------- GM registry

// The buffers the host entry passed, so that every GM access can be checked against
// the allocation it falls in (GmAlloc's role in ICPU_RUN_KF).
struct GmRegion {
  const uint8_t* base;
  uint64_t bytes;
  std::string name;
};

inline std::vector<GmRegion>& gm_regions() {
  static std::vector<GmRegion> r;
  return r;
}

inline const GmRegion* gm_find(const void* p) {
  const uint8_t* q = static_cast<const uint8_t*>(p);
  for (const GmRegion& r : gm_regions())
    if (q >= r.base && q < r.base + std::max<uint64_t>(r.bytes, 1)) return &r;
  return nullptr;
}

// [p, p + bytes) must lie inside one registered GM buffer
inline void gm_check(const void* p, uint64_t bytes, const char* what) {
  const GmRegion* r = gm_find(p);
  if (r == nullptr)
    fail("GM out of bounds", "%s at %p is outside every kernel GM buffer", what, p);
  const uint64_t off = static_cast<const uint8_t*>(p) - r->base;
  if (off + bytes > r->bytes)
    fail("GM out of bounds", "%s reads/writes bytes [%llu, %llu) of GM buffer %s (%llu bytes)", what,
         (unsigned long long)off, (unsigned long long)(off + bytes), r->name.c_str(), (unsigned long long)r->bytes);
}

// ---------------------------------------------------------------- the block context

constexpr int kMaxEvents = 256;  // HardEvent values are src * 16 + dst
constexpr int kEventIds = 8;
constexpr int kMaxQueueBuffers = 64;

struct QueueBuf {
  Mem mem;
  int position;
  uint32_t offset, bytes;
  BufState state;
};

struct Group;  // the cross-core flag counters of one AIC + 2 AIV group (MIX launches, cross_core.h)

// The cross-core record of one on-chip memory that the other cores of a dav-3510 MIX group
// write directly (UB -> L1 into the AIC's L1, Fixpipe L0C -> UB into an AIV's UB), per
// 32-byte block.  `local`: the owner's cross-core set count + 1 at its last access (the
// owner's CrossCoreSetFlag number that publishes the access); `remote`: (writer role + 1) << 24
// | the writer's set count + 1 at the write (the set that publishes it).  Atomics because the
// writer and the owner are different threads; a correct protocol orders them by the flags.
struct CrossRecord {
  std::unique_ptr<std::atomic<uint32_t>[]> local, remote;
  uint32_t blocks = 0;
  void reset(uint32_t n) {
    local.reset(new std::atomic<uint32_t>[n]);
    remote.reset(new std::atomic<uint32_t>[n]);
    for (uint32_t b = 0; b < n; ++b) local[b].store(0), remote[b].store(0);
    blocks = n;
  }
};

inline const char* role_name(int role);

struct Ctx {
  Core core = Core::AIV;
  int64_t block_idx = 0, block_num = 1, sub_idx = 0;
  bool mix = false;       // launched as one AIC + two AIV per group (KERNEL_TYPE_MIX_AIC_1_2)
  Group* group = nullptr;  // MIX only
  // dav-3510 MIX: this core's role (0 AIC, 1 + sub AIV), its CrossCoreSetFlag count and, per
  // role, how many of that core's sets its own waits have received (cross_core.h); the records
  // of UB and L1, the memories the direct paths write from another core
  int xrole = -1;
  const uint32_t* xsets = nullptr;
  const uint32_t* xconsumed = nullptr;
  CrossRecord xrec[static_cast<int>(Mem::COUNT)];
  std::vector<uint8_t> mem[static_cast<int>(Mem::COUNT)];
  // hazard shadows per 32-byte block: (pipe << 28) | epoch, 0 = none
  std::vector<uint32_t> writer[static_cast<int>(Mem::COUNT)];
  std::vector<uint32_t> reader[static_cast<int>(Mem::COUNT)];
  uint32_t epoch[P_COUNT];
  uint32_t retired[P_COUNT][P_COUNT];  // [reader pipe][writer pipe]: epochs the reader has waited for
  uint32_t flag_known[kMaxEvents][kEventIds][P_COUNT];  // the source pipe's knowledge at SetFlag
  bool flag_set[kMaxEvents][kEventIds];
  uint32_t flag_epoch[kMaxEvents][kEventIds];
  // the TPipe
  bool pipe_live = false;
  uint32_t used[static_cast<int>(Mem::COUNT)] = {};
  int buffers = 0;
  int queue_buffers_per_position[16] = {};
  std::vector<QueueBuf> qbufs;

  void reset(Core c, int64_t idx, int64_t num, int64_t sub) {
    core = c;
    block_idx = idx;
    block_num = num;
    sub_idx = sub;
    for (int m = 1; m < static_cast<int>(Mem::COUNT); ++m) {
      const uint32_t cap = capacity(static_cast<Mem>(m));
      mem[m].assign(cap, 0xFF);  // poison: NaN for floats, all ones for integers
      writer[m].assign(cap / 32 + 1, 0);
      reader[m].assign(cap / 32 + 1, 0);
      used[m] = 0;
    }
    xrole = -1;
    for (CrossRecord& r : xrec) r.blocks = 0;
    for (int p = 0; p < P_COUNT; ++p) epoch[p] = 1;
    std::memset(retired, 0, sizeof retired);
    std::memset(flag_set, 0, sizeof flag_set);
    std::memset(flag_epoch, 0, sizeof flag_epoch);
    pipe_live = false;
    buffers = 0;
    std::memset(queue_buffers_per_position, 0, sizeof queue_buffers_per_position);
    qbufs.clear();
  }

  // An access of [off, off + bytes) of memory m by pipe p.  Scalar reads are synchronous
  // (never pending as readers); DMA/vector reads are, and a later write by another pipe
  // must wait for them (write after read).
  void touch(Mem m, uint32_t off, uint32_t bytes, int p, bool write) {
    if (bytes == 0) return;
    const int mi = static_cast<int>(m);
    uint32_t* const wr = writer[mi].data();
    if (xrole >= 0 && xrec[mi].blocks) cross_touch(mi, off, bytes);
    for (uint32_t b = off / 32, e = (off + bytes - 1) / 32; b <= e; ++b) {
      const uint32_t w = wr[b];
      if (w != 0) {
        const int q = w >> 28;
        if (q != p && (w & 0x0FFFFFFF) > retired[p][q])
          fail("missing SetFlag/WaitFlag",
               "pipe %s %s %s bytes [%u, %u) while pipe %s's write there is not waited for "
               "(SetFlag/WaitFlag<HardEvent::%s_%s> missing)",
               pipe_name(p), write ? "writes" : "reads", mem_name(m), b * 32, b * 32 + 32, pipe_name(q),
               pipe_name(q), pipe_name(p));
      }
      if (write) {
        const uint32_t r = reader[mi][b];
        if (r != 0) {
          const int q = r >> 28;
          if (q != p && (r & 0x0FFFFFFF) > retired[p][q])
            fail("missing SetFlag/WaitFlag",
                 "pipe %s overwrites %s bytes [%u, %u) that pipe %s still reads "
                 "(SetFlag/WaitFlag<HardEvent::%s_%s> missing)",
                 pipe_name(p), mem_name(m), b * 32, b * 32 + 32, pipe_name(q), pipe_name(q), pipe_name(p));
        }
        writer[mi][b] = (uint32_t(p) << 28) | epoch[p];
      } else if (p != P_S) {
        reader[mi][b] = (uint32_t(p) << 28) | epoch[p];
      }
    }
  }

  // The owner's access to blocks another core may write directly: data that core wrote must
  // have been published by a CrossCoreSetFlag this core has waited for (else the NPU reads it
  // before it lands); the access is recorded so that the next direct write checks it was.
  void cross_touch(int mi, uint32_t off, uint32_t bytes) {
    CrossRecord& r = xrec[mi];
    const uint32_t stamp = *xsets + 1;
    for (uint32_t b = off / 32, e = std::min((off + bytes - 1) / 32, r.blocks - 1); b <= e; ++b) {
      const uint32_t w = r.remote[b].load(std::memory_order_relaxed);
      if (w != 0) {
        const int src = int(w >> 24) - 1;
        if (xconsumed[src] < (w & 0xFFFFFF))
          fail("cross-core missing wait",
               "%s reads %s bytes [%u, %u) that %s wrote directly before its CrossCoreSetFlag #%u, which %s has not "
               "waited for (CrossCoreWaitFlag missing: on the NPU the data may not have landed)",
               role_name(xrole), mem_name(Mem(mi)), b * 32, b * 32 + 32, role_name(src), w & 0xFFFFFF,
               role_name(xrole));
        r.remote[b].store(0, std::memory_order_relaxed);
      }
      r.local[b].store(stamp, std::memory_order_relaxed);
    }
  }

  // A direct write into this core's memory by `src` (another core of the group, whose set
  // count is src_sets and who has received src_consumed of this core's sets; called under the
  // group's lock): every access this core made to the blocks must have been published to the
  // writer (WAR across cores), and data the writer published earlier must have been waited
  // for by this core before the writer replaces it.
  void cross_write(int src, uint32_t src_sets, uint32_t src_consumed, Mem m, uint32_t off, uint32_t bytes) {
    CrossRecord& r = xrec[static_cast<int>(m)];
    if (r.blocks == 0) fail("position", "a direct write into %s of %s: not a dav-3510 MIX group", mem_name(m), role_name(xrole));
    for (uint32_t b = off / 32, e = (off + bytes - 1) / 32; b <= e && b < r.blocks; ++b) {
      const uint32_t l = r.local[b].load(std::memory_order_relaxed);
      if (l != 0 && src_consumed < l)
        fail("cross-core missing wait",
             "%s writes %s bytes [%u, %u) of %s, which %s used after its last CrossCoreSetFlag that %s waited for "
             "(CrossCoreWaitFlag missing: on the NPU it overwrites data still in use)",
             role_name(src), mem_name(m), b * 32, b * 32 + 32, role_name(xrole), role_name(xrole), role_name(src));
      const uint32_t prev = r.remote[b].load(std::memory_order_relaxed), n = prev & 0xFFFFFF;
      if (prev != 0 && int(prev >> 24) - 1 == src && n <= src_sets && xconsumed[src] < n)
        fail("cross-core missing wait",
             "%s overwrites %s bytes [%u, %u) of %s that it published with CrossCoreSetFlag #%u, which %s has not "
             "waited for yet (a CrossCoreWaitFlag for %s's answer missing: on the NPU the first data is lost)",
             role_name(src), mem_name(m), b * 32, b * 32 + 32, role_name(xrole), n, role_name(xrole), role_name(xrole));
      r.remote[b].store((uint32_t(src + 1) << 24) | (src_sets + 1), std::memory_order_relaxed);
      writer[static_cast<int>(m)][b] = reader[static_cast<int>(m)][b] = 0;  // ordered by the cross-core flags
    }
  }

  // A queue hand-off (EnQue/DeQue) synchronises the buffer's producer and consumer.
  void retire_range(Mem m, uint32_t off, uint32_t bytes) {
    const int mi = static_cast<int>(m);
    for (uint32_t b = off / 32, e = (off + bytes + 31) / 32; b < e && b < writer[mi].size(); ++b)
      writer[mi][b] = reader[mi][b] = 0;
  }

  void set_flag(int src, int dst, int ev, int id) {
    if (id < 0 || id >= kEventIds) fail("event id", "SetFlag<%s_%s>(%d): event ids are 0..7", pipe_name(src), pipe_name(dst), id);
    if (flag_set[ev][id])
      fail("unbalanced SetFlag/WaitFlag", "SetFlag<HardEvent::%s_%s>(%d) twice without a WaitFlag between",
           pipe_name(src), pipe_name(dst), id);
    flag_set[ev][id] = true;
    flag_epoch[ev][id] = epoch[src]++;
    for (int q = 0; q < P_COUNT; ++q) flag_known[ev][id][q] = retired[src][q];
  }

  void wait_flag(int src, int dst, int ev, int id) {
    if (id < 0 || id >= kEventIds) fail("event id", "WaitFlag<%s_%s>(%d): event ids are 0..7", pipe_name(src), pipe_name(dst), id);
    if (!flag_set[ev][id])
      fail("unbalanced SetFlag/WaitFlag", "WaitFlag<HardEvent::%s_%s>(%d) without a SetFlag (hangs on the NPU)",
           pipe_name(src), pipe_name(dst), id);
    flag_set[ev][id] = false;
    for (int q = 0; q < P_COUNT; ++q) retired[dst][q] = std::max(retired[dst][q], flag_known[ev][id][q]);
    retired[dst][src] = std::max(retired[dst][src], flag_epoch[ev][id]);
  }

  void barrier_all() {
    for (int q = 0; q < P_COUNT; ++q) {
      const uint32_t e = epoch[q]++;
      for (int p = 0; p < P_COUNT; ++p) retired[p][q] = e;
    }
  }

  // block end: every SetFlag must have had its WaitFlag
  void finish() {
    for (int ev = 0; ev < kMaxEvents; ++ev)
      for (int id = 0; id < kEventIds; ++id)
        if (flag_set[ev][id])
          fail("unbalanced SetFlag/WaitFlag", "SetFlag<HardEvent::%s_%s>(%d) never waited for at kernel end",
               pipe_name(ev >> 4), pipe_name(ev & 15), id);
  }
};

inline Ctx*& current() {
  static thread_local Ctx* c = nullptr;
  return c;
}

inline Ctx& ctx() {
  Ctx* c = current();
  if (c == nullptr) fail("launch", "an Ascend C API was called outside a kernel launch");
  return *c;
}

}  // namespace kf_emu
