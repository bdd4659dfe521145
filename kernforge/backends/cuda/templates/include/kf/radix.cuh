// Radix-select building blocks: ordered keys, digits, a warp-aggregated shared-memory
// histogram, and "which bucket holds the k-th largest key".
//
// Pure CUDA C++ (__match_any_sync, __ffs, __popc, atomicAdd, shuffles, __syncthreads):
// compiles unchanged under host emulation, where kf/emu/warp.h emulates __match_any_sync.
//
// Ordered key: the float's bits with the sign bit set for non-negative values and every bit
// inverted for negative ones, so unsigned order is float order (-inf < ... < -0 < +0 < ... <
// +inf); every NaN (any sign, any payload) maps to the largest key (all ones), so NaNs rank
// above +inf.  This is kernels/topk.py's `_ordered_key` and `ordered_keys` reference.
#pragma once
#include "kf/common.cuh"
#include "kf/reduce.cuh"

namespace kf {

template <typename U> KF_DEVICE U radix_order(U raw, U inf_bits) {
  constexpr U sign = U(U(1) << (sizeof(U) * 8 - 1));
  if (U(raw & U(sign - 1)) > inf_bits) return U(~U(0));  // NaN
  return (raw & sign) ? U(~raw) : U(raw | sign);
}

KF_DEVICE uint32_t radix_key(float v) { return radix_order<uint32_t>(kf_bitcast<uint32_t>(v), 0x7F800000u); }
KF_DEVICE uint16_t radix_key(kf_bf16 v) { return radix_order<uint16_t>(kf_bitcast<uint16_t>(v), 0x7F80u); }
KF_DEVICE uint16_t radix_key(kf_half v) { return radix_order<uint16_t>(kf_bitcast<uint16_t>(v), 0x7C00u); }

// The bits of the value whose ordered key is `key` (exact inverse for every non-NaN key).
template <typename U> KF_DEVICE U radix_key_bits(U key) {
  constexpr U sign = U(U(1) << (sizeof(U) * 8 - 1));
  return (key & sign) ? U(key ^ sign) : U(~key);
}

// Digit `width` bits wide starting at bit `shift` (most significant digits first in a select).
template <typename U> KF_DEVICE int radix_digit(U key, int shift, int width) {
  return int((key >> shift) & U((U(1) << width) - 1));
}

// hist[digit] += count for the calling lanes with `pred`, one atomic per distinct digit per
// warp: lanes holding the same digit find each other with __match_any_sync and the lowest of
// them adds count * (their number).  Every lane of the warp must call it (convergent, full
// mask); lanes without `pred` take part in the match with a key no digit can have.
KF_DEVICE void hist_add_warp(int32_t* hist, int digit, int32_t count, bool pred) {
  const unsigned long long key = pred ? (unsigned long long)(uint32_t)digit : (1ull << 32);
  const unsigned peers = __match_any_sync(0xffffffffu, key);
  if (pred && int(threadIdx.x & 31) == __ffs(int(peers)) - 1) atomicAdd(hist + digit, count * __popc(peers));
}

// Histogram of digit (shift, width) over keys[0, n) into hist[0, 2^width), by all THREADS threads
// (a multiple of 32) of the block.  With hi_shift < the key's bit width only the keys whose bits
// from hi_shift up equal prefix's are counted (the later passes of a select).  Clears hist
// first; every thread must call it; ends with a barrier, after which hist is complete.
template <int THREADS, typename U>
KF_DEVICE void radix_histogram(const U* keys, int n, int shift, int width, U prefix, int hi_shift, int32_t* hist) {
  static_assert(THREADS % 32 == 0, "radix_histogram needs whole warps");
  const int nb = 1 << width;
  for (int b = threadIdx.x; b < nb; b += THREADS) hist[b] = 0;
  __syncthreads();
  const bool filter = hi_shift < int(sizeof(U) * 8);
  const int rounds = (n + THREADS - 1) / THREADS;  // the same trip count in every lane
  for (int r = 0; r < rounds; ++r) {
    const int i = r * THREADS + threadIdx.x;
    const U key = i < n ? keys[i] : U(0);
    const bool counted = i < n && (!filter || (key >> hi_shift) == (prefix >> hi_shift));
    hist_add_warp(hist, radix_digit(key, shift, width), 1, counted);
  }
  __syncthreads();
}

struct RadixBucket {
  int digit;  // the bucket holding the need-th largest counted key; -1 when fewer keys than need
  int need;   // its rank inside that bucket (1 = the bucket's largest)
};

// Which bucket of hist[0, nb) holds the need-th largest key (need >= 1): the largest digit b
// whose suffix count above[b] = hist[b] + ... + hist[nb-1] reaches need.  `above` (nb ints of
// shared memory, may not alias hist) receives the suffix counts; `scratch` is 32 ints of shared
// memory.  Every thread must call it and gets the same answer; ends with a barrier.
template <int THREADS>
KF_DEVICE RadixBucket radix_find_bucket(const int32_t* hist, int32_t* above, int nb, int need, int32_t* scratch) {
  static_assert(THREADS % 32 == 0, "radix_find_bucket needs whole warps");
  constexpr int WARPS = THREADS / 32;
  block_inclusive_scan<THREADS>(hist, above, nb, true, scratch);
  int reached = 0;  // suffix counts are non-increasing: the buckets reaching `need` are a prefix
  for (int b = threadIdx.x; b < nb; b += THREADS) reached += above[b] >= need;
  reached = warp_allreduce<SumOp>(reached);
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = reached;
  __syncthreads();
  int total = 0;
#pragma unroll
  for (int w = 0; w < WARPS; ++w) total += scratch[w];
  RadixBucket out;
  out.digit = total - 1;
  out.need = total == 0 ? need : need - (total < nb ? above[total] : 0);
  __syncthreads();  // scratch may be reused
  return out;
}

}  // namespace kf
