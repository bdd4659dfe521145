// Scalar helpers the shared C expression printer (codegen/renderer.py) relies on.
//
// max/min propagate NaN and otherwise return the second operand on ties, as
// numpy.maximum/minimum do; integer // and % follow Python's floor semantics,
// with a zero divisor giving 0 (numpy's result) instead of a trap.  Binary
// helpers take two parameter types because int64_t and the `LL` literal the
// printer emits are different C++ types; both are converted to their common type.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

template <class A, class B, class T = std::common_type_t<A, B>>
inline constexpr T kf_max(A a_, B b_) {
  const T a = T(a_), b = T(b_);
  if constexpr (std::is_floating_point_v<T>) return (a > b || a != a) ? a : b;
  else return a > b ? a : b;
}

template <class A, class B, class T = std::common_type_t<A, B>>
inline constexpr T kf_min(A a_, B b_) {
  const T a = T(a_), b = T(b_);
  if constexpr (std::is_floating_point_v<T>) return (a < b || a != a) ? a : b;
  else return a < b ? a : b;
}

template <class T>
inline constexpr T kf_abs(T a) { return a < 0 ? T(-a) : a; }

template <class T>
inline constexpr bool kf_isnan(T a) {
  if constexpr (std::is_floating_point_v<T>) return a != a;
  else return false;
}

template <class A, class B, class T = std::common_type_t<A, B>>
inline constexpr T kf_floordiv(A a_, B b_) {
  const T a = T(a_), b = T(b_);
  if (b == 0) return 0;
  if constexpr (std::is_signed_v<T>) {
    if (b == -1) return T(0) - a;  // avoids the INT_MIN / -1 trap (wraps like numpy)
    const T q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? T(q - 1) : q;
  } else {
    return a / b;
  }
}

template <class A, class B, class T = std::common_type_t<A, B>>
inline constexpr T kf_floormod(A a_, B b_) {
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

// Python/numpy float remainder: the result takes the divisor's sign.
inline float kf_fmod_floor(float a, float b) {
  float r = std::fmod(a, b);
  if (r != 0.0f) {
    if ((r < 0.0f) != (b < 0.0f)) r += b;
  } else {
    r = std::copysign(0.0f, b);
  }
  return r;
}

inline double kf_fmod_floor(double a, double b) {
  double r = std::fmod(a, b);
  if (r != 0.0) {
    if ((r < 0.0) != (b < 0.0)) r += b;
  } else {
    r = std::copysign(0.0, b);
  }
  return r;
}
