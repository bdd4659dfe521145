// Scalar helpers the shared C expression printer (codegen/renderer.py) relies on, for the
// AI Core's scalar unit: kernforge's semantics (ir.py docstring) spelled once more for
// Ascend C's types (half, bfloat16_t).  max/min propagate NaN; integer // and % floor,
// with a zero divisor giving 0; low-precision floats convert through float, rounding to
// nearest even on the way back.
#pragma once

#include <cstdint>
#include <type_traits>

template <class A, class B, class T = std::common_type_t<A, B>>
__aicore__ inline T kf_max(A a_, B b_) {
  const T a = T(a_), b = T(b_);
  if constexpr (std::is_floating_point_v<T>) return (a > b || a != a) ? a : b;
  else return a > b ? a : b;
}

template <class A, class B, class T = std::common_type_t<A, B>>
__aicore__ inline T kf_min(A a_, B b_) {
  const T a = T(a_), b = T(b_);
  if constexpr (std::is_floating_point_v<T>) return (a < b || a != a) ? a : b;
  else return a < b ? a : b;
}

template <class T>
__aicore__ inline T kf_abs(T a) { return a < 0 ? T(-a) : a; }

template <class T>
__aicore__ inline bool kf_isnan(T a) {
  if constexpr (std::is_floating_point_v<T>) return a != a;
  else return false;
}

template <class A, class B, class T = std::common_type_t<A, B>>
__aicore__ inline T kf_floordiv(A a_, B b_) {
  const T a = T(a_), b = T(b_);
  if (b == 0) return 0;
  if constexpr (std::is_signed_v<T>) {
    if (b == -1) return T(0) - a;
    const T q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? T(q - 1) : q;
  } else {
    return a / b;
  }
}

template <class A, class B, class T = std::common_type_t<A, B>>
__aicore__ inline T kf_floormod(A a_, B b_) {
  const T a = T(a_), b = T(b_);
  if (b == 0) return 0;
  if constexpr (std::is_signed_v<T>) {
    if (b == -1) return 0;
    const T r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? T(r + b) : r;
  } else {
    return a % b;
  }
}

template <class T>
__aicore__ inline T kf_fmod_floor(T a, T b) {
  T r = __builtin_fmod(a, b);
  if (r != T(0)) {
    if ((r < T(0)) != (b < T(0))) r += b;
  } else {
    r = __builtin_copysign(T(0), b);
  }
  return r;
}

template <class T>
__aicore__ inline T kf_nan() { return T(__builtin_nan("")); }

template <class T>
__aicore__ inline T kf_inf() { return T(__builtin_inf()); }

template <class To, class From>
__aicore__ inline To kf_bitcast(From x) {
  static_assert(sizeof(To) == sizeof(From), "kf_bitcast needs types of one width");
  To out;
  __builtin_memcpy(&out, &x, sizeof(To));
  return out;
}

__aicore__ inline float kf_to_float(half x) { return static_cast<float>(x); }
__aicore__ inline float kf_to_float(bfloat16_t x) { return AscendC::ToFloat(x); }

template <class T>
__aicore__ inline T kf_from_float(float f);
template <>
__aicore__ inline half kf_from_float<half>(float f) { return static_cast<half>(f); }
template <>
__aicore__ inline bfloat16_t kf_from_float<bfloat16_t>(float f) { return AscendC::ToBfloat16(f); }
