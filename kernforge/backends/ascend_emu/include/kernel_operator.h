// ascend-emu: a g++ shim of the Ascend C API subset kernforge emits (and the hand-written
// test programs use), with the signatures of the public headers (asc-devkit basic_api) and
// the rules of shared/specs/ascend-c-subset.md section 9 enforced at every call.
//
// It is not the CANN CPU-debug library: it has no model of timing, pipes run in program
// order, and only the calls listed here exist (an unknown call is a g++ error, which is
// how the shim says "not in the subset").  See docs/backends/ascend.md.
#pragma once

#include <cmath>
#include <deque>
#include <type_traits>

#include "kf_emu/half.h"
#include "kf_emu/state.h"
#include "kf_emu/cross_core.h"

#define __global__
#define __aicore__
#define __gm__
#define __ubuf__
#define GM_ADDR uint8_t*

enum KernelMetaType { KERNEL_TYPE_AIV_ONLY, KERNEL_TYPE_AIC_ONLY, KERNEL_TYPE_MIX_AIV_1_0, KERNEL_TYPE_MIX_AIC_1_0,
                      KERNEL_TYPE_MIX_AIC_1_1, KERNEL_TYPE_MIX_AIC_1_2 };

namespace kf_emu {
// The kernel's declared task type must match the mode the launcher runs it in.
inline void declare_task_type(KernelMetaType t) {
  const bool aiv = t == KERNEL_TYPE_AIV_ONLY || t == KERNEL_TYPE_MIX_AIV_1_0;
  const bool aic = t == KERNEL_TYPE_AIC_ONLY || t == KERNEL_TYPE_MIX_AIC_1_0;
  const bool mix = t == KERNEL_TYPE_MIX_AIC_1_2;
  if (t == KERNEL_TYPE_MIX_AIC_1_1) fail("task type", "MIX_AIC_1_1 is not modelled (the shim runs 1 AIC + 2 AIV groups)");
  if (mix != ctx().mix)
    fail("task type", mix ? "a MIX_AIC_1_2 kernel launched without AIC + 2 AIV groups"
                          : "a single-core kernel type launched in MIX mode");
  if ((aiv && ctx().core != Core::AIV) || (aic && ctx().core != Core::AIC))
    fail("task type", "KERNEL_TASK_TYPE_DEFAULT does not match the core the block was launched on");
}
}  // namespace kf_emu

#define KERNEL_TASK_TYPE_DEFAULT(t) kf_emu::declare_task_type(t)
#define ASCEND_IS_AIV (kf_emu::ctx().core == kf_emu::Core::AIV)
#define ASCEND_IS_AIC (kf_emu::ctx().core == kf_emu::Core::AIC)

enum pipe_t { PIPE_S = kf_emu::P_S, PIPE_V = kf_emu::P_V, PIPE_M = kf_emu::P_M, PIPE_MTE1 = kf_emu::P_MTE1,
              PIPE_MTE2 = kf_emu::P_MTE2, PIPE_MTE3 = kf_emu::P_MTE3, PIPE_FIX = kf_emu::P_FIX, PIPE_ALL = 15 };

namespace AscendC {

using kf_emu::fail;
using kf_emu::Mem;

enum class TPosition : uint8_t { GM, A1, A2, B1, B2, C1, C2, CO1, CO2, VECIN, VECOUT, VECCALC, MAX };
using QuePosition = TPosition;

#define KF_EV(s, d) (kf_emu::P_##s * 16 + kf_emu::P_##d)
enum class HardEvent : uint8_t {
  MTE2_V = KF_EV(MTE2, V), V_MTE3 = KF_EV(V, MTE3), MTE3_V = KF_EV(MTE3, V), V_MTE2 = KF_EV(V, MTE2),
  MTE3_MTE2 = KF_EV(MTE3, MTE2), MTE2_MTE3 = KF_EV(MTE2, MTE3), S_V = KF_EV(S, V), V_S = KF_EV(V, S),
  MTE2_S = KF_EV(MTE2, S), S_MTE2 = KF_EV(S, MTE2), S_MTE3 = KF_EV(S, MTE3), MTE3_S = KF_EV(MTE3, S),
  MTE2_MTE1 = KF_EV(MTE2, MTE1), MTE1_MTE2 = KF_EV(MTE1, MTE2), MTE1_M = KF_EV(MTE1, M), M_MTE1 = KF_EV(M, MTE1),
  M_FIX = KF_EV(M, FIX), FIX_M = KF_EV(FIX, M), FIX_S = KF_EV(FIX, S), S_FIX = KF_EV(S, FIX),
  MTE3_MTE1 = KF_EV(MTE3, MTE1), FIX_MTE2 = KF_EV(FIX, MTE2),
};
#undef KF_EV

inline Mem position_mem(TPosition p) {
  switch (p) {
    case TPosition::VECIN: case TPosition::VECOUT: case TPosition::VECCALC: return Mem::UB;
    case TPosition::A1: case TPosition::B1: case TPosition::C1: return Mem::L1;
    case TPosition::A2: return Mem::L0A;
    case TPosition::B2: return Mem::L0B;
    case TPosition::CO1: return Mem::L0C;
    default: return Mem::GM;
  }
}

inline const char* position_name(TPosition p) {
  static const char* n[] = {"GM", "A1", "A2", "B1", "B2", "C1", "C2", "CO1", "CO2", "VECIN", "VECOUT", "VECCALC"};
  return n[static_cast<int>(p)];
}

// Split cores (2201): AIV code never touches L1/L0, AIC code never touches UB.
inline void check_core(Mem m, const char* what) {
#if __NPU_ARCH__ == 2201
  const kf_emu::Core c = kf_emu::ctx().core;
  if (m == Mem::UB && c == kf_emu::Core::AIC) fail("position", "%s: AIC code touches UB (AIC has no UB on dav-c220)", what);
  if (m != Mem::UB && m != Mem::GM && c == kf_emu::Core::AIV)
    fail("position", "%s: AIV code touches %s (AIV has only UB on dav-c220)", what, kf_emu::mem_name(m));
#else
  (void)m;
  (void)what;
#endif
}

// ---------------------------------------------------------------- tensors

template <typename T>
class LocalTensor {
 public:
  using PrimType = T;
  LocalTensor() = default;

  T GetValue(uint32_t i) const {
    kf_emu::Ctx& c = kf_emu::ctx();
    T v;
    std::memcpy(&v, scalar_access(c, i, false), sizeof(T));
    return v;
  }
  void SetValue(uint32_t i, T v) const {
    kf_emu::Ctx& c = kf_emu::ctx();
    std::memcpy(scalar_access(c, i, true), &v, sizeof(T));
  }
  LocalTensor operator[](uint32_t off) const {
    check_valid("operator[]");
    if (off > count_)
      fail("LocalTensor out of bounds", "[%u] of a %s tensor of %u elements", off, position_name(pos_), count_);
    LocalTensor t = *this;
    t.off_ += off * sizeof(T);
    t.count_ -= off;
    return t;
  }
  uint32_t GetSize() const { return count_; }
  template <typename U>
  LocalTensor<U> ReinterpretCast() const {
    LocalTensor<U> t;
    t.init(pos_, off_, uint32_t(uint64_t(count_) * sizeof(T) / sizeof(U)), qbuf_);
    return t;
  }
  T* GetPhyAddr() const { return reinterpret_cast<T*>(addr(0)); }

  // ---- shim internals (not Ascend C): where the tensor lives
  void init(TPosition pos, uint32_t off, uint32_t count, int qbuf) {
    pos_ = pos, off_ = off, count_ = count, qbuf_ = qbuf, valid_ = true;
  }
  TPosition pos() const { return pos_; }
  Mem mem() const { return position_mem(pos_); }
  uint32_t byte_offset() const { return off_; }
  int qbuf() const { return qbuf_; }
  uint8_t* addr(uint32_t i) const {
    return kf_emu::ctx().mem[static_cast<int>(mem())].data() + off_ + uint64_t(i) * sizeof(T);
  }
  void check_valid(const char* what) const {
    if (!valid_) fail("LocalTensor", "%s on a LocalTensor that no TBuf/TQue handed out", what);
  }
  // The tensor may be used: its queue buffer (if any) is held by the caller.
  void check_usable(const char* what) const {
    check_valid(what);
    check_core(mem(), what);
    if (qbuf_ >= 0) {
      const kf_emu::BufState s = kf_emu::ctx().qbufs[qbuf_].state;
      if (s != kf_emu::BufState::OCCUPIED && s != kf_emu::BufState::DEQUE)
        fail("queue state", "%s on a queue tensor in state %s (use it after AllocTensor or DeQue, before "
             "EnQue/FreeTensor)", what, kf_emu::state_name(s));
    }
  }
  // A footprint [first, first + n) elements inside the tensor, aligned for the operand.
  void check_operand(uint32_t n, const char* what, uint32_t align = 0) const {
    check_usable(what);
    if (n > count_)
      fail("LocalTensor out of bounds", "%s covers %u elements of a %s tensor of %u", what, n, position_name(pos_), count_);
    const uint32_t a = align ? align : kf_emu::alignment(mem());
    if (off_ % a)
      fail("alignment", "%s: %s operand at byte %u is not %u-byte aligned", what, kf_emu::mem_name(mem()), off_, a);
  }

 private:
  // The hot path of scalar code: one context lookup, the state checks, the hazard shadow.
  uint8_t* scalar_access(kf_emu::Ctx& c, uint32_t i, bool write) const {
    const char* what = write ? "SetValue" : "GetValue";
    check_valid(what);
    if (mem() != Mem::UB)
      fail("position", "%s on a %s tensor: scalar access is for VECIN/VECOUT/VECCALC only", what, position_name(pos_));
#if __NPU_ARCH__ == 2201
    if (c.core == kf_emu::Core::AIC) fail("position", "%s: AIC code touches UB (AIC has no UB on dav-c220)", what);
#endif
    if (qbuf_ >= 0 && c.qbufs[qbuf_].state != kf_emu::BufState::OCCUPIED && c.qbufs[qbuf_].state != kf_emu::BufState::DEQUE)
      check_usable(what);  // reports the state
    if (i >= count_)
      fail("LocalTensor out of bounds", "%s(%u) of a tensor of %u elements", what, i, count_);
    const uint32_t off = off_ + i * uint32_t(sizeof(T));
    c.touch(Mem::UB, off, sizeof(T), kf_emu::P_S, write);
    return c.mem[static_cast<int>(Mem::UB)].data() + off;
  }
  TPosition pos_ = TPosition::VECCALC;
  uint32_t off_ = 0, count_ = 0;
  int qbuf_ = -1;
  bool valid_ = false;
};

template <typename T>
class GlobalTensor {
 public:
  using PrimType = T;
  void SetGlobalBuffer(__gm__ T* p, uint64_t n) { ptr_ = p, size_ = n; }
  void SetGlobalBuffer(__gm__ T* p) { ptr_ = p, size_ = 0; }
  T GetValue(uint64_t i) const {
    check(i, 1, "GlobalTensor::GetValue");
    T v;
    std::memcpy(&v, ptr_ + i, sizeof(T));
    return v;
  }
  void SetValue(uint64_t i, T v) const {
    check(i, 1, "GlobalTensor::SetValue");
    std::memcpy(ptr_ + i, &v, sizeof(T));
  }
  GlobalTensor operator[](uint64_t off) const {
    GlobalTensor g = *this;
    g.ptr_ += off;
    g.size_ = size_ > off ? size_ - off : 0;
    return g;
  }
  __gm__ T* GetPhyAddr() const { return ptr_; }
  uint64_t GetSize() const { return size_; }
  template <typename U>
  GlobalTensor<U> ReinterpretCast() const {
    GlobalTensor<U> g;
    g.SetGlobalBuffer(reinterpret_cast<__gm__ U*>(ptr_), size_ * sizeof(T) / sizeof(U));
    return g;
  }
  // shim internals: elements [i, i + n) exist in the GM buffer (and in SetGlobalBuffer's size)
  void check(uint64_t i, uint64_t n, const char* what) const {
    if (size_ && i + n > size_)
      fail("GM out of bounds", "%s: elements [%llu, %llu) of a GlobalTensor of %llu", what, (unsigned long long)i,
           (unsigned long long)(i + n), (unsigned long long)size_);
    kf_emu::gm_check(ptr_ + i, n * sizeof(T), what);
  }

 private:
  __gm__ T* ptr_ = nullptr;
  uint64_t size_ = 0;
};

// ---------------------------------------------------------------- TPipe, TBuf, TQue

class TPipe;

template <TPosition Pos>
class TBuf {
 public:
  template <typename T>
  LocalTensor<T> Get() const { return Get<T>(bytes_ / sizeof(T)); }
  template <typename T>
  LocalTensor<T> Get(uint32_t n) const { return GetWithOffset<T>(n, 0); }
  template <typename T>
  LocalTensor<T> GetWithOffset(uint32_t n, uint32_t byteOff) const {
    if (!init_) fail("TBuf", "Get on a TBuf that TPipe::InitBuffer did not initialise");
    if (byteOff % 32) fail("alignment", "GetWithOffset(%u, %u): the byte offset must be a multiple of 32", n, byteOff);
    if (uint64_t(byteOff) + uint64_t(n) * sizeof(T) > bytes_)
      fail("TBuf out of bounds", "GetWithOffset(%u elements of %zu bytes, offset %u) exceeds the %u-byte TBuf", n,
           sizeof(T), byteOff, bytes_);
    LocalTensor<T> t;
    t.init(Pos, off_ + byteOff, n, -1);
    return t;
  }
  // shim internals
  void init(uint32_t off, uint32_t bytes) { off_ = off, bytes_ = bytes, init_ = true; }

 private:
  uint32_t off_ = 0, bytes_ = 0;
  bool init_ = false;
};

template <TPosition Pos, int32_t Depth>
class TQue {
 public:
  template <typename T>
  LocalTensor<T> AllocTensor() {
    kf_emu::Ctx& c = kf_emu::ctx();
    for (int b : bufs_) {
      kf_emu::QueueBuf& q = c.qbufs[b];
      if (q.state == kf_emu::BufState::FREE) {
        q.state = kf_emu::BufState::OCCUPIED;
        c.retire_range(q.mem, q.offset, q.bytes);  // the allocation waits for the buffer's release
        LocalTensor<T> t;
        t.init(Pos, q.offset, q.bytes / sizeof(T), b);
        return t;
      }
    }
    fail("queue: AllocTensor with no free buffer", "all %zu buffers of the %s queue are in use (hangs on the NPU)",
         bufs_.size(), position_name(Pos));
  }
  template <typename T>
  bool EnQue(const LocalTensor<T>& t) {
    kf_emu::Ctx& c = kf_emu::ctx();
    const int b = own(t, "EnQue");
    if (c.qbufs[b].state != kf_emu::BufState::OCCUPIED)
      fail("queue state", "EnQue of a buffer in state %s (EnQue takes an AllocTensor'ed buffer)",
           kf_emu::state_name(c.qbufs[b].state));
    if (int32_t(fifo_.size()) >= std::max<int32_t>(Depth, 1))
      fail("queue: EnQue over depth", "the %s queue of depth %d already holds %zu tensors", position_name(Pos),
           std::max<int32_t>(Depth, 1), fifo_.size());
    c.qbufs[b].state = kf_emu::BufState::ENQUE;
    fifo_.push_back(b);
    return true;
  }
  template <typename T>
  LocalTensor<T> DeQue() {
    kf_emu::Ctx& c = kf_emu::ctx();
    if (fifo_.empty()) fail("queue: DeQue on an empty queue", "the %s queue holds no tensor (hangs on the NPU)", position_name(Pos));
    const int b = fifo_.front();
    fifo_.pop_front();
    kf_emu::QueueBuf& q = c.qbufs[b];
    q.state = kf_emu::BufState::DEQUE;
    c.retire_range(q.mem, q.offset, q.bytes);  // DeQue waits for the producer's pipe
    LocalTensor<T> t;
    t.init(Pos, q.offset, q.bytes / sizeof(T), b);
    return t;
  }
  template <typename T>
  void FreeTensor(const LocalTensor<T>& t) {
    kf_emu::Ctx& c = kf_emu::ctx();
    const int b = own(t, "FreeTensor");
    if (c.qbufs[b].state == kf_emu::BufState::FREE)
      fail("queue: FreeTensor of a free buffer", "the %s queue's buffer is already free", position_name(Pos));
    if (c.qbufs[b].state == kf_emu::BufState::ENQUE)
      fail("queue state", "FreeTensor of a buffer still in the queue (DeQue it first)");
    c.qbufs[b].state = kf_emu::BufState::FREE;
  }
  bool VacantInQue() const { return int32_t(fifo_.size()) < std::max<int32_t>(Depth, 1); }
  bool HasTensorInQue() const { return !fifo_.empty(); }
  // shim internals
  void add_buffer(int b) { bufs_.push_back(b); }

 private:
  template <typename T>
  int own(const LocalTensor<T>& t, const char* what) const {
    for (int b : bufs_)
      if (b == t.qbuf()) return b;
    fail("queue state", "%s of a tensor that this queue did not hand out", what);
  }
  std::vector<int> bufs_;
  std::deque<int> fifo_;
};

template <TPosition Pos>
using TQueBind = TQue<Pos, 1>;

class TPipe {
 public:
  TPipe() {
    kf_emu::Ctx& c = kf_emu::ctx();
    if (c.pipe_live) fail("one TPipe", "a second TPipe while one is alive (one TPipe per kernel)");
    c.pipe_live = true;
  }
  ~TPipe() { Destroy(); }
  template <TPosition Pos, int32_t Depth>
  bool InitBuffer(TQue<Pos, Depth>& que, uint8_t num, uint32_t len) {
    kf_emu::Ctx& c = kf_emu::ctx();
    const int p = static_cast<int>(Pos);
    if (c.queue_buffers_per_position[p] + num > 8)
      fail("queue buffers", "more than 8 queue buffers at position %s (event ids run out on A2/A3)", position_name(Pos));
    c.queue_buffers_per_position[p] += num;
    for (int i = 0; i < num; ++i) {
      const uint32_t off = carve(Pos, len, "TQue");
      c.qbufs.push_back({position_mem(Pos), p, off, round32(len), kf_emu::BufState::FREE});
      que.add_buffer(int(c.qbufs.size()) - 1);
    }
    return true;
  }
  template <TPosition Pos>
  bool InitBuffer(TBuf<Pos>& buf, uint32_t len) {
    buf.init(carve(Pos, len, "TBuf"), round32(len));
    return true;
  }
  void Destroy() {
    if (!live_) return;
    live_ = false;
    kf_emu::Ctx* c = kf_emu::current();
    if (c) c->pipe_live = false;
  }
  void Reset() {
    kf_emu::Ctx& c = kf_emu::ctx();
    for (uint32_t& u : c.used) u = 0;
    c.buffers = 0;
  }

 private:
  static uint32_t round32(uint32_t n) { return (n + 31) / 32 * 32; }
  // Pools are carved sequentially; a pool that overflows its memory is an error naming the memory.
  uint32_t carve(TPosition pos, uint32_t len, const char* kind) {
    kf_emu::Ctx& c = kf_emu::ctx();
    const Mem m = position_mem(pos);
    if (m == Mem::GM) fail("position", "InitBuffer at position %s: only on-chip positions hold buffers", position_name(pos));
    check_core(m, "InitBuffer");
    if (++c.buffers > 64) fail("buffers", "more than 64 buffers in one TPipe");
    const int mi = static_cast<int>(m);
    const uint32_t a = kf_emu::alignment(m);
    const uint32_t off = (c.used[mi] + a - 1) / a * a;
    const uint64_t end = uint64_t(off) + round32(len);
    if (end > kf_emu::capacity(m))
      fail(m == Mem::UB ? "UB capacity" : m == Mem::L1 ? "L1 capacity" : m == Mem::L0A ? "L0A capacity"
           : m == Mem::L0B ? "L0B capacity" : "L0C capacity",
           "InitBuffer(%s, %u bytes) at %s needs bytes [%u, %llu) but %s holds %u bytes on %s", kind, len,
           position_name(pos), off, (unsigned long long)end, kf_emu::mem_name(m), kf_emu::capacity(m),
           kf_emu::arch_name());
    c.used[mi] = uint32_t(end);
    return off;
  }
  bool live_ = true;
};

// ---------------------------------------------------------------- system values and sync

inline int64_t GetBlockIdx() { return kf_emu::ctx().block_idx; }
inline int64_t GetBlockNum() { return kf_emu::ctx().block_num; }
inline int64_t GetSubBlockIdx() { return kf_emu::ctx().sub_idx; }

// Cross-core flags between the AIC and its two AIVs of a MIX group (kf_emu/cross_core.h).
template <uint8_t modeId, pipe_t pipe>
inline void CrossCoreSetFlag(uint16_t flagId) {
  kf_emu::cross_core_set(modeId, flagId);
}

inline void CrossCoreWaitFlag(uint16_t flagId) { kf_emu::cross_core_wait(flagId); }

template <HardEvent E>
inline void SetFlag(int32_t id) {
  const int ev = static_cast<int>(E);
  kf_emu::ctx().set_flag(ev >> 4, ev & 15, ev, id);
}

template <HardEvent E>
inline void WaitFlag(int32_t id) {
  const int ev = static_cast<int>(E);
  kf_emu::ctx().wait_flag(ev >> 4, ev & 15, ev, id);
}

// Orders one pipe against itself; the shim runs every pipe in program order, so only
// PIPE_ALL (which drains everything) changes what it tracks.
template <pipe_t P>
inline void PipeBarrier() {
  if (P == PIPE_ALL) kf_emu::ctx().barrier_all();
}

enum class CacheLine : uint8_t { SINGLE_CACHE_LINE, ENTIRE_DATA_CACHE };
enum class DcciDst : uint8_t { CACHELINE_ALL, CACHELINE_UB, CACHELINE_OUT, CACHELINE_ATOMIC };

// The shim's GM is coherent: scalar GM writes are visible at once (DCache staleness is one
// of the things it cannot catch).
template <typename T, CacheLine L, DcciDst D>
inline void DataCacheCleanAndInvalid(const GlobalTensor<T>&) {}

inline float ToFloat(const bfloat16_t& v) { return float(v); }
inline bfloat16_t ToBfloat16(const float& v) { return bfloat16_t(v); }

}  // namespace AscendC

#include "kf_emu/data_copy.h"
#include "kf_emu/vector.h"
#include "kf_emu/cube.h"
#include "kf_emu/runtime.h"
