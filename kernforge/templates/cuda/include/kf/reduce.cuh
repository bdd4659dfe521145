// Reductions across the threads that share a row of a fragment.
//
// Pure CUDA C++ (shuffles, no PTX): compiles unchanged under host emulation.
// The accumulator layout (codegen/layouts.py, AccumLayout) puts one row's
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

}  // namespace kf
