// Low-precision storage types and their exact conversions.
//
// kernforge computes on float16/bfloat16/float8_e4m3 values in float32 and
// rounds (round-to-nearest-even) only when a value is stored or cast, exactly
// as ml-dtypes does in the numpy interpreter.  The conversions below are plain
// integer bit manipulation, so they are the same on every CPU and the compiler
// can vectorise loops that use them.  NaN inputs give a quiet NaN of the same
// sign (payload bits are not preserved).
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

// Scoped enums rather than structs: they are distinct types for overloading yet
// scalars to the optimiser, so a tile copy of bf16 values vectorises like one of
// uint16_t (g++ 12 does not vectorise element-wise struct assignment).
enum class kf_half : uint16_t {};
enum class kf_bf16 : uint16_t {};
enum class kf_fp8e4m3 : uint8_t {};  // e4m3fn: no infinities, NaN = S.1111.111, max 448

template <class T>
inline constexpr auto kf_bits(T x) { return static_cast<std::underlying_type_t<T>>(x); }

template <class T> struct kf_is_low_precision : std::false_type {};
template <> struct kf_is_low_precision<kf_half> : std::true_type {};
template <> struct kf_is_low_precision<kf_bf16> : std::true_type {};
template <> struct kf_is_low_precision<kf_fp8e4m3> : std::true_type {};

inline constexpr uint32_t kf_float_bits(float f) { return __builtin_bit_cast(uint32_t, f); }
inline constexpr float kf_bits_float(uint32_t u) { return __builtin_bit_cast(float, u); }

// ---------------------------------------------------------------- widening (exact)

inline constexpr float kf_to_float(kf_bf16 x) { return kf_bits_float(uint32_t(kf_bits(x)) << 16); }

inline constexpr float kf_to_float(kf_half x) {
  const uint32_t h = kf_bits(x);
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return kf_bits_float(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {  // zero or subnormal: mant * 2^-24 is exact in float32
    const float v = float(mant) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  return kf_bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

inline constexpr float kf_to_float(kf_fp8e4m3 x) {
  const uint32_t b = kf_bits(x);
  const uint32_t sign = (b & 0x80u) << 24;
  const uint32_t exp = (b >> 3) & 0xfu;
  const uint32_t mant = b & 0x7u;
  if (exp == 0xf && mant == 0x7) return kf_bits_float(sign | 0x7fc00000u);
  if (exp == 0) {  // zero or subnormal: mant * 2^-9
    const float v = float(mant) * (1.0f / 512.0f);
    return sign ? -v : v;
  }
  return kf_bits_float(sign | ((exp + 120u) << 23) | (mant << 20));
}

// ---------------------------------------------------------------- narrowing (RNE)

template <class T> constexpr T kf_from_float(float f);

template <> inline constexpr kf_bf16 kf_from_float<kf_bf16>(float f) {
  const uint32_t u = kf_float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return kf_bf16{uint16_t((u >> 16) | 0x40u)};
  return kf_bf16{uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}

template <> inline constexpr kf_half kf_from_float<kf_half>(float f) {
  const uint32_t u = kf_float_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return kf_half{uint16_t(sign | 0x7e00u)};
  if (a >= 0x477ff000u) return kf_half{uint16_t(sign | 0x7c00u)};  // >= 65520 rounds to inf
  if (a < 0x38800000u) {
    // below the smallest normal half (2^-14): adding 0.5 (ulp 2^-24) rounds the
    // value to a multiple of 2^-24 with the FPU's round-to-nearest-even; the low
    // mantissa bits are then the subnormal half's bits.
    const float t = kf_bits_float(a) + 0.5f;
    return kf_half{uint16_t(sign | (kf_float_bits(t) - 0x3f000000u))};
  }
  const uint32_t odd = (a >> 13) & 1u;
  return kf_half{uint16_t(sign | ((a - 0x38000000u + 0xfffu + odd) >> 13))};
}

template <> inline constexpr kf_fp8e4m3 kf_from_float<kf_fp8e4m3>(float f) {
  const uint32_t u = kf_float_bits(f);
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x43e80000u) return kf_fp8e4m3{uint8_t(sign | 0x7fu)};  // NaN, inf, > 464: NaN
  if (a < 0x3c800000u) {
    // below the smallest normal (2^-6): 16384.0f has ulp 2^-9, the subnormal step.
    const float t = kf_bits_float(a) + 16384.0f;
    return kf_fp8e4m3{uint8_t(sign | (kf_float_bits(t) - 0x46800000u))};
  }
  const uint32_t odd = (a >> 20) & 1u;
  return kf_fp8e4m3{uint8_t(sign | ((a - 0x3c000000u + 0x7ffffu + odd) >> 20))};
}

// fp8 e4m3 -> bf16, exact (every e4m3 value is a bf16 value), on the integer bits with selects only,
// so that a tile copy vectorises (a float conversion inside made g++ keep a branch and the loop
// scalar): a normal (exponent field >= 1) moves its exponent and mantissa fields up and rebiases
// (+120); a subnormal mant * 2^-9 (mant 1-7) is normalised by hand, its leading bit at position
// e = [mant >= 2] + [mant >= 4] giving exponent 118 + e; NaN is the quiet NaN of its sign, as
// kf_from_float<kf_bf16>(kf_to_float(x)) gives (all 256 codes: tests/backends/test_cpu_gemm_paths.py).
inline constexpr kf_bf16 kf_fp8_to_bf16(kf_fp8e4m3 x) {
  const uint32_t b = kf_bits(x), em = b & 0x7fu, sign = (b & 0x80u) << 8;
  const uint32_t e = (em >= 2u) + (em >= 4u);
  const uint32_t sub = em == 0u ? 0u : ((118u + e) << 7) | ((em << (7u - e)) & 0x7fu);
  uint32_t v = em < 8u ? sub : (em << 4) + 0x3c00u;
  v = em == 0x7fu ? 0x7fc0u : v;
  return kf_bf16{uint16_t(sign | v)};
}

// ---------------------------------------------------------------- bits and specials

template <class To, class From>
inline constexpr To kf_bitcast(From x) {
  static_assert(sizeof(To) == sizeof(From), "kf_bitcast needs types of one width");
  return __builtin_bit_cast(To, x);
}

// 16-bit floats <-> 16-bit integers as plain integer conversions (the hot case:
// ordered keys in topk), which the vectoriser handles better than __builtin_bit_cast.
#define KF_BITS16_CAST(F, I)                                                        \
  template <> inline constexpr I kf_bitcast<I, F>(F x) { return static_cast<I>(kf_bits(x)); } \
  template <> inline constexpr F kf_bitcast<F, I>(I x) { return F{static_cast<uint16_t>(x)}; }
KF_BITS16_CAST(kf_bf16, uint16_t)
KF_BITS16_CAST(kf_bf16, int16_t)
KF_BITS16_CAST(kf_half, uint16_t)
KF_BITS16_CAST(kf_half, int16_t)
#undef KF_BITS16_CAST

template <class T> inline constexpr T kf_inf() { return std::numeric_limits<T>::infinity(); }
template <class T> inline constexpr T kf_nan() { return std::numeric_limits<T>::quiet_NaN(); }
