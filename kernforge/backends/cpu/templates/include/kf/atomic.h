// Atomic read-modify-write on global memory (blocks of one launch run in parallel
// on OpenMP threads).  Integer add is a native fetch-add; float add and every
// max are compare-and-swap loops on the value's bits.  Buffers private to a
// block (shared/fragment/local) never reach these: a block runs on one thread,
// so the renderer emits a plain read-modify-write there.
#pragma once

#include <cstdint>
#include <type_traits>

#include "scalar.h"

namespace kf {

// The combine of atomic max: for floats a NaN operand is ignored (numpy.fmax, as
// the interpreter does), unlike T.max which propagates NaN.
template <class T>
inline T max_ignoring_nan(T old, T v) {
  if constexpr (std::is_floating_point_v<T>) return (v > old || old != old) ? v : old;
  else return v > old ? v : old;
}

template <class T> struct atomic_bits;
template <> struct atomic_bits<float> { using type = uint32_t; };
template <> struct atomic_bits<double> { using type = uint64_t; };

template <class T>
inline void atomic_add(T* p, T v) {
  if constexpr (std::is_integral_v<T>) {
    __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
  } else {
    using U = typename atomic_bits<T>::type;
    U* bits = reinterpret_cast<U*>(p);
    U old = __atomic_load_n(bits, __ATOMIC_RELAXED);
    while (true) {
      const U want = __builtin_bit_cast(U, T(__builtin_bit_cast(T, old) + v));
      if (__atomic_compare_exchange_n(bits, &old, want, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) return;
    }
  }
}

template <class T>
inline void atomic_max(T* p, T v) {
  if constexpr (std::is_integral_v<T>) {
    T old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (v > old &&
           !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
  } else {
    using U = typename atomic_bits<T>::type;
    U* bits = reinterpret_cast<U*>(p);
    U old = __atomic_load_n(bits, __ATOMIC_RELAXED);
    while (true) {
      const U want = __builtin_bit_cast(U, max_ignoring_nan(__builtin_bit_cast(T, old), v));
      if (want == old) return;
      if (__atomic_compare_exchange_n(bits, &old, want, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) return;
    }
  }
}

// Fetch-and-op (T.atomic_add/atomic_max(..., return_prev=True)): the same updates, returning
// the value the element held just before this one.
template <class T>
inline T atomic_fetch_add(T* p, T v) {
  if constexpr (std::is_integral_v<T>) {
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
  } else {
    using U = typename atomic_bits<T>::type;
    U* bits = reinterpret_cast<U*>(p);
    U old = __atomic_load_n(bits, __ATOMIC_RELAXED);
    while (true) {
      const U want = __builtin_bit_cast(U, T(__builtin_bit_cast(T, old) + v));
      if (__atomic_compare_exchange_n(bits, &old, want, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        return __builtin_bit_cast(T, old);
    }
  }
}

template <class T>
inline T atomic_fetch_max(T* p, T v) {
  if constexpr (std::is_integral_v<T>) {
    T old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (v > old &&
           !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return old;
  } else {
    using U = typename atomic_bits<T>::type;
    U* bits = reinterpret_cast<U*>(p);
    U old = __atomic_load_n(bits, __ATOMIC_RELAXED);
    while (true) {
      const U want = __builtin_bit_cast(U, max_ignoring_nan(__builtin_bit_cast(T, old), v));
      if (want == old) return __builtin_bit_cast(T, old);
      if (__atomic_compare_exchange_n(bits, &old, want, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        return __builtin_bit_cast(T, old);
    }
  }
}

}  // namespace kf
