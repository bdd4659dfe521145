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

// the types whose arithmetic runs in float (kf_to_float / kf_from_float)
template <class T>
struct kf_is_low : std::integral_constant<bool, std::is_same_v<T, half> || std::is_same_v<T, bfloat16_t>> {};

// fp8 e4m3fn values: the 950's fp8_e4m3fn_t (buffers, tiles, cube operands); 910B has no fp8 type,
// so there an fp8 value exists only inside scalar expressions (a cast, a reinterpreted byte), as
// kf_fp8_e4m3 bytes -- the renderer refuses fp8 buffers on dav-c220.  Both convert bit by bit
// (kernforge's conversion: RNE, subnormals, no infinities, S.1111.111 = NaN, past 464 -> NaN), so
// no scalar fp8 API is assumed.
#if __NPU_ARCH__ == 3510
using kf_fp8_e4m3 = fp8_e4m3fn_t;
#else
struct kf_fp8_e4m3 {
  uint8_t bits;
};
#endif

template <>
struct kf_is_low<kf_fp8_e4m3> : std::true_type {};

__aicore__ inline float kf_to_float(kf_fp8_e4m3 x) {
  const uint32_t b = kf_bitcast<uint8_t>(x);
  const uint32_t sign = (b & 0x80u) << 24, exp = (b >> 3) & 0xfu, mant = b & 0x7u;
  if (exp == 0xf && mant == 0x7) return kf_bitcast<float>(sign | 0x7fc00000u);
  if (exp == 0) {  // zero or subnormal: mant * 2^-9
    const float v = float(mant) * (1.0f / 512.0f);
    return sign ? -v : v;
  }
  return kf_bitcast<float>(sign | ((exp + 120u) << 23) | (mant << 20));
}

template <>
__aicore__ inline kf_fp8_e4m3 kf_from_float<kf_fp8_e4m3>(float f) {
  const uint32_t u = kf_bitcast<uint32_t>(f);
  const uint32_t sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
  uint32_t bits;
  if (a > 0x43e80000u) {
    bits = sign | 0x7fu;  // NaN, inf, > 464: NaN
  } else if (a < 0x3c800000u) {  // below 2^-6: 16384.0f has ulp 2^-9, the subnormal step (RNE by the FPU)
    bits = sign | (kf_bitcast<uint32_t>(kf_bitcast<float>(a) + 16384.0f) - 0x46800000u);
  } else {
    bits = sign | ((a - 0x3c000000u + 0x7ffffu + ((a >> 20) & 1u)) >> 20);
  }
  return kf_bitcast<kf_fp8_e4m3>(uint8_t(bits));
}
