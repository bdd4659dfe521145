// Reductions across the threads that share a row of a fragment.
//
// Pure CUDA C++ (shuffles, no PTX): compiles unchanged under host emulation.
// The accumulator layout (backends/cuda/layouts.py, AccumLayout) puts one row's
// elements of a warp's 16x8 tiles on the 4 lanes of a quad (lanes 4g..4g+3),
// so a row reduction is: thread-local, then quad_allreduce, then (when
// several warps share the row) a pass through shared memory.
#pragma once
#include "kf/common.cuh"

namespace kf {

struct SumOp {
  template <typename T> static KF_DEVICE T apply(T a, T b) { return a + b; }
};
struct MaxOp {
  template <typename T> static KF_DEVICE T apply(T a, T b) { return kf_max(a, b); }
};
struct MinOp {
  template <typename T> static KF_DEVICE T apply(T a, T b) { return kf_min(a, b); }
};

// All four lanes of each quad get the quad's combined value.
template <typename Op, typename T> KF_DEVICE T quad_allreduce(T v) {
  v = Op::apply(v, __shfl_xor_sync(0xffffffffu, v, 1));
  v = Op::apply(v, __shfl_xor_sync(0xffffffffu, v, 2));
  return v;
}

// All 32 lanes get the warp's combined value.
template <typename Op, typename T> KF_DEVICE T warp_allreduce(T v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v = Op::apply(v, __shfl_xor_sync(0xffffffffu, v, m));
  return v;
}

// Inclusive prefix sum across the lanes of a warp (lane i gets v_0 + ... + v_i).
template <typename T> KF_DEVICE T warp_inclusive_scan(T v) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    T up = __shfl_up_sync(0xffffffffu, v, d);
    if (lane >= d) v = v + up;
  }
  return v;
}

// Inclusive scan (prefix sums; suffix sums with `reverse`) of n elements of shared `src` into
// shared `dst` (which may be `src`), by all THREADS threads of the block: each thread scans a
// contiguous chunk, the chunk totals are scanned across lanes and then across warps through
// `scratch` (32 elements of shared memory), and each chunk is rewritten with its offset.
// Every thread of the block must call it (it contains __syncthreads()); it ends with one.
template <int THREADS, typename T>
KF_DEVICE void block_inclusive_scan(const T* src, T* dst, int n, bool reverse, T* scratch) {
  constexpr int WARPS = THREADS / 32;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int per = (n + THREADS - 1) / THREADS;
  const int lo = tid * per < n ? tid * per : n;
  const int hi = lo + per < n ? lo + per : n;
  T run = T(0);
  for (int i = lo; i < hi; ++i) run = run + src[reverse ? n - 1 - i : i];
  const T incl = warp_inclusive_scan(run);
  if (lane == 31) scratch[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    T w = lane < WARPS ? scratch[lane] : T(0);
    w = warp_inclusive_scan(w);
    if (lane < WARPS) scratch[lane] = w;
  }
  __syncthreads();
  T prefix = incl - run + (warp > 0 ? scratch[warp - 1] : T(0));
  for (int i = lo; i < hi; ++i) {
    const int j = reverse ? n - 1 - i : i;
    prefix = prefix + src[j];
    dst[j] = prefix;
  }
  __syncthreads();
}

}  // namespace kf
