// Warp and block collectives, emulated over the warp's exchange area.
//
// Every lane posts its operand into slot[phase][lane], the warp barrier makes
// all posts visible, and each lane reads what it needs.  The exchange is
// double-buffered by phase: a lane can only overwrite a phase's slots after
// the next barrier, which every lane reaches only once it finished reading.
// One barrier per collective; the same scheme serves mma.sync and ldmatrix.
//
// Only collectives over every live lane of the warp are emulated (the mask must
// cover them); the generated code never uses partial masks, and a partial mask
// fails the launch with a message instead of being guessed at.
#pragma once
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "runtime.h"

namespace kf_emu {

inline uint32_t full_mask(const Warp& w) { return w.lanes == 32 ? 0xffffffffu : ((1u << w.lanes) - 1u); }

inline void check_mask(unsigned mask, const char* what) {
  const Warp& w = my_warp();
  const uint32_t need = full_mask(w);
  if ((mask & need) != need)
    fail("%s: member mask 0x%08x leaves out live lanes; only whole-warp collectives are emulated", what, mask);
  if (!((mask >> ctx().lane) & 1u)) fail("%s: calling lane is not in the member mask", what);
}

// Posts `words` 64-bit words for this lane, synchronises the warp, and returns
// the exchange row of this phase (slot[lane][word]) to read from.
inline uint64_t (*exchange(const uint64_t* words, int n))[kExchangeWords] {
  Warp& w = my_warp();
  ThreadCtx& c = ctx();
  uint64_t(*rows)[kExchangeWords] = w.slot[c.warp_phase & 1];
  std::memcpy(rows[c.lane], words, sizeof(uint64_t) * n);
  c.warp_phase ^= 1;
  w.bar.arrive_and_wait();
  return rows;
}

template <class T>
inline uint64_t to_bits(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffled type must be <= 8 bytes");
  uint64_t u = 0;
  std::memcpy(&u, &v, sizeof(T));
  return u;
}
template <class T>
inline T from_bits(uint64_t u) {
  T v;
  std::memcpy(&v, &u, sizeof(T));
  return v;
}

enum class ShflMode { idx, up, down, bfly };

// Source lane per the PTX ISA `shfl.sync` pseudocode, with c = the packed
// clamp/segment operand CUDA derives from `width`.
inline uint32_t shfl_source(ShflMode mode, uint32_t lane, uint32_t b, int width) {
  const uint32_t seg = uint32_t(32 - width) & 0x1f;  // c[12:8]: lanes of a segment share the high bits
  const uint32_t cval = mode == ShflMode::up ? 0u : 0x1fu;
  const uint32_t max_lane = (lane & seg) | (cval & ~seg);
  const uint32_t min_lane = lane & seg;
  uint32_t j;
  bool ok;
  switch (mode) {
    case ShflMode::up: j = lane - b; ok = int(j) >= int(max_lane); break;
    case ShflMode::down: j = lane + b; ok = j <= max_lane; break;
    case ShflMode::bfly: j = lane ^ b; ok = j <= max_lane; break;
    default: j = min_lane | (b & ~seg & 0x1f); ok = j <= max_lane; break;
  }
  return ok ? j : lane;
}

template <class T>
inline T shfl(ShflMode mode, unsigned mask, T v, uint32_t b, int width, const char* what) {
  check_mask(mask, what);
  if (width <= 0 || width > 32 || (width & (width - 1))) fail("%s: width must be a power of two <= 32", what);
  const uint64_t mine = to_bits(v);
  auto rows = exchange(&mine, 1);
  const uint32_t src = shfl_source(mode, ctx().lane, b & 0x1f, width);
  if (src >= my_warp().lanes)  // PTX: the value read from an inactive lane is undefined
    fail("%s: lane %u reads lane %u, which does not exist in a warp of %u threads", what, ctx().lane, src,
         my_warp().lanes);
  return from_bits<T>(rows[src][0]);
}

template <class F>
inline uint32_t vote(unsigned mask, bool pred, const char* what, F&& combine) {
  check_mask(mask, what);
  const uint64_t mine = pred ? 1 : 0;
  auto rows = exchange(&mine, 1);
  uint32_t ballot = 0;
  for (uint32_t l = 0; l < my_warp().lanes; ++l) ballot |= uint32_t(rows[l][0] & 1) << l;
  return combine(ballot);
}

template <class T, class F>
inline T warp_reduce(unsigned mask, T v, const char* what, F&& op) {
  check_mask(mask, what);
  const uint64_t mine = to_bits(v);
  auto rows = exchange(&mine, 1);
  T acc = from_bits<T>(rows[0][0]);
  for (uint32_t l = 1; l < my_warp().lanes; ++l) acc = op(acc, from_bits<T>(rows[l][0]));
  return acc;
}

// __match_any_sync: the lanes (within `mask`) whose value has the same bits as the caller's.
template <class T>
inline uint32_t match_any(unsigned mask, T v) {
  static_assert(std::is_integral<T>::value && (sizeof(T) == 4 || sizeof(T) == 8),
                "__match_any_sync takes 32- or 64-bit integers");
  check_mask(mask, "__match_any_sync");
  const uint64_t mine = to_bits(v);
  auto rows = exchange(&mine, 1);
  uint32_t same = 0;
  for (uint32_t l = 0; l < my_warp().lanes; ++l) same |= uint32_t(rows[l][0] == mine) << l;
  return same & mask;
}

// __syncthreads_count/and/or: count the predicate across the block at the barrier.
inline uint32_t block_count(bool pred) {
  Block& b = *ctx().block;
  ThreadCtx& c = ctx();
  std::atomic<uint32_t>& acc = b.counts[c.block_phase & 1];
  std::atomic<uint32_t>& next = b.counts[(c.block_phase + 1) & 1];
  c.block_phase ^= 1;
  if (pred) acc.fetch_add(1, std::memory_order_relaxed);
  b.bar.arrive_and_wait();
  const uint32_t n = acc.load(std::memory_order_relaxed);
  next.store(0, std::memory_order_relaxed);  // nobody touches the other phase until the next barrier
  b.bar.arrive_and_wait();                   // ... so clear it, and let every thread read `acc` first
  return n;
}

}  // namespace kf_emu

inline void __syncthreads() { kf_emu::ctx().block->bar.arrive_and_wait(); }
inline int __syncthreads_count(int p) { return int(kf_emu::block_count(p != 0)); }
inline int __syncthreads_and(int p) { return kf_emu::block_count(p != 0) == kf_emu::ctx().block->nthreads; }
inline int __syncthreads_or(int p) { return kf_emu::block_count(p != 0) != 0; }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  kf_emu::check_mask(mask, "__syncwarp");
  kf_emu::my_warp().bar.arrive_and_wait();
}
inline unsigned __activemask() { return kf_emu::full_mask(kf_emu::my_warp()); }

template <class T>
inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
  return kf_emu::shfl(kf_emu::ShflMode::idx, mask, v, uint32_t(src), width, "__shfl_sync");
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  return kf_emu::shfl(kf_emu::ShflMode::up, mask, v, delta, width, "__shfl_up_sync");
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  return kf_emu::shfl(kf_emu::ShflMode::down, mask, v, delta, width, "__shfl_down_sync");
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  return kf_emu::shfl(kf_emu::ShflMode::bfly, mask, v, uint32_t(lane_mask), width, "__shfl_xor_sync");
}
template <class T>
inline unsigned __match_any_sync(unsigned mask, T v) {
  return kf_emu::match_any(mask, v);
}
inline unsigned __ballot_sync(unsigned mask, int p) {
  return kf_emu::vote(mask, p != 0, "__ballot_sync", [mask](uint32_t b) { return b & mask; });
}
inline int __any_sync(unsigned mask, int p) {
  return kf_emu::vote(mask, p != 0, "__any_sync", [mask](uint32_t b) { return (b & mask) != 0; });
}
inline int __all_sync(unsigned mask, int p) {
  return kf_emu::vote(mask, p != 0, "__all_sync", [mask](uint32_t b) { return (b & mask) == (mask & kf_emu::full_mask(kf_emu::my_warp())); });
}
inline unsigned __reduce_add_sync(unsigned mask, unsigned v) {
  return kf_emu::warp_reduce(mask, v, "__reduce_add_sync", [](unsigned a, unsigned b) { return a + b; });
}
inline int __reduce_add_sync(unsigned mask, int v) {
  return int(__reduce_add_sync(mask, unsigned(v)));
}
inline unsigned __reduce_max_sync(unsigned mask, unsigned v) {
  return kf_emu::warp_reduce(mask, v, "__reduce_max_sync", [](unsigned a, unsigned b) { return a > b ? a : b; });
}
inline int __reduce_max_sync(unsigned mask, int v) {
  return kf_emu::warp_reduce(mask, v, "__reduce_max_sync", [](int a, int b) { return a > b ? a : b; });
}
inline unsigned __reduce_min_sync(unsigned mask, unsigned v) {
  return kf_emu::warp_reduce(mask, v, "__reduce_min_sync", [](unsigned a, unsigned b) { return a < b ? a : b; });
}
inline int __reduce_min_sync(unsigned mask, int v) {
  return kf_emu::warp_reduce(mask, v, "__reduce_min_sync", [](int a, int b) { return a < b ? a : b; });
}
inline unsigned __reduce_and_sync(unsigned mask, unsigned v) {
  return kf_emu::warp_reduce(mask, v, "__reduce_and_sync", [](unsigned a, unsigned b) { return a & b; });
}
inline unsigned __reduce_or_sync(unsigned mask, unsigned v) {
  return kf_emu::warp_reduce(mask, v, "__reduce_or_sync", [](unsigned a, unsigned b) { return a | b; });
}
inline unsigned __reduce_xor_sync(unsigned mask, unsigned v) {
  return kf_emu::warp_reduce(mask, v, "__reduce_xor_sync", [](unsigned a, unsigned b) { return a ^ b; });
}
