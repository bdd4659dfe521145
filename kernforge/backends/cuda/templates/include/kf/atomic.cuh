// Atomics with kernforge's element types (T.atomic_add / T.atomic_max).
// Pure CUDA C++: atomicAdd/atomicCAS/atomicMax are emulated by kf/emu/cuda_shim.h.
#pragma once
#include "kf/common.cuh"

namespace kf {

template <typename T> KF_DEVICE void atomic_add(T* p, T v) { atomicAdd(p, v); }

KF_DEVICE void atomic_max(int32_t* p, int32_t v) { atomicMax(reinterpret_cast<int*>(p), v); }
KF_DEVICE void atomic_max(uint32_t* p, uint32_t v) { atomicMax(reinterpret_cast<unsigned*>(p), v); }
KF_DEVICE void atomic_max(int64_t* p, int64_t v) { atomicMax(reinterpret_cast<long long*>(p), (long long)v); }

// float max through compare-and-swap on the bits (NaN in v wins, as kf_max does).
KF_DEVICE void atomic_max(float* p, float v) {
  int* addr = reinterpret_cast<int*>(p);
  int old = *addr;
  while (true) {
    const float cur = kf_bitcast<float>(old);
    const float want = kf_max(cur, v);
    if (kf_bitcast<int>(want) == old) return;
    const int seen = atomicCAS(addr, old, kf_bitcast<int>(want));
    if (seen == old) return;
    old = seen;
  }
}

// Fetch-and-op (return_prev=True): the value the element held just before this update.
// 64-bit integer adds go through the unsigned overload (two's complement: the same bits).
template <typename T> KF_DEVICE T atomic_fetch_add(T* p, T v) { return atomicAdd(p, v); }
KF_DEVICE int64_t atomic_fetch_add(int64_t* p, int64_t v) {
  return (int64_t)atomicAdd(reinterpret_cast<unsigned long long*>(p), (unsigned long long)v);
}

KF_DEVICE int32_t atomic_fetch_max(int32_t* p, int32_t v) { return atomicMax(reinterpret_cast<int*>(p), v); }
KF_DEVICE uint32_t atomic_fetch_max(uint32_t* p, uint32_t v) { return atomicMax(reinterpret_cast<unsigned*>(p), v); }
KF_DEVICE int64_t atomic_fetch_max(int64_t* p, int64_t v) {
  return (int64_t)atomicMax(reinterpret_cast<long long*>(p), (long long)v);
}
KF_DEVICE float atomic_fetch_max(float* p, float v) {
  int* addr = reinterpret_cast<int*>(p);
  int old = *addr;
  while (true) {
    const float cur = kf_bitcast<float>(old);
    const int want = kf_bitcast<int>(kf_max(cur, v));
    if (want == old) return cur;
    const int seen = atomicCAS(addr, old, want);
    if (seen == old) return cur;
    old = seen;
  }
}

}  // namespace kf
