// Low-precision float types of the CUDA headers, emulated bit-exactly on the host.
//
// Why here: the emulated kernel must round exactly as the GPU does, or the
// comparison against the interpreter would test the emulator's arithmetic
// instead of the generated code.  Conversions follow the PTX cvt rules:
//  * float -> bf16 / f16: round to nearest even; NaN -> canonical NaN (0x7FFF)
//  * float -> e4m3: round to nearest even, saturate to +-448 (satfinite); NaN -> 0x7F
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "runtime.h"

namespace kf_emu {

inline uint32_t float_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bits_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

inline uint16_t float_to_bf16_bits(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
inline float bf16_bits_to_float(uint16_t h) { return bits_float(uint32_t(h) << 16); }

inline uint16_t float_to_f16_bits(float f) {
  if (std::isnan(f)) return 0x7fff;
  _Float16 h = static_cast<_Float16>(f);  // RNE, with subnormals, as cvt.rn.f16.f32
  uint16_t u; std::memcpy(&u, &h, 2); return u;
}
inline float f16_bits_to_float(uint16_t u) { _Float16 h; std::memcpy(&h, &u, 2); return float(h); }

// satfinite: out-of-range values clamp to +-448; otherwise they become NaN
// (cvt.rn.e4m3x2.f32 without .satfinite; also ml_dtypes' float8_e4m3fn).
inline uint8_t float_to_e4m3_bits(float f, bool satfinite = true) {
  if (std::isnan(f)) return 0x7f;
  uint8_t sign = std::signbit(f) ? 0x80 : 0;
  float a = std::fabs(f);
  if (a > 464.0f || std::isinf(a)) return satfinite ? (sign | 0x7e) : (sign | 0x7f);  // 464 = 448 + half a step
  int e;
  std::frexp(a, &e);                     // a = m * 2^e, m in [0.5, 1)
  int exp = e - 1;                       // a in [2^exp, 2^(exp+1))
  if (exp < -6) exp = -6;                // subnormal range shares the 2^-9 quantum
  float quantum = std::ldexp(1.0f, exp - 3);
  float q = std::nearbyint(a / quantum) * quantum;  // exact scaling, RNE (default mode)
  if (q == 0.0f) return sign;
  std::frexp(q, &e);
  exp = e - 1;
  if (exp < -6) return sign | uint8_t(q / std::ldexp(1.0f, -9));
  int mant = int(q / std::ldexp(1.0f, exp) * 8.0f) - 8;
  return sign | uint8_t((exp + 7) << 3) | uint8_t(mant);
}
inline float e4m3_bits_to_float(uint8_t b) {
  int exp = (b >> 3) & 0xf, mant = b & 7;
  float s = (b & 0x80) ? -1.0f : 1.0f;
  if (exp == 15 && mant == 7) return NAN;
  if (exp == 0) return s * std::ldexp(float(mant), -9);
  return s * std::ldexp(1.0f + mant / 8.0f, exp - 7);
}

}  // namespace kf_emu

[[noreturn]] inline void kf_emu_unsupported_fp8_kind() { kf_emu::fail("only the E4M3 fp8 format is emulated"); }

struct __half_raw { unsigned short x; };
struct __nv_bfloat16_raw { unsigned short x; };

// Arithmetic on these types computes in float and rounds the result (RNE),
// as the sm_80 operators in cuda_fp16.hpp / cuda_bf16.hpp do.
#define KF_EMU_LOWP(T, RAW, TO, FROM)                                                    \
  struct alignas(2) T {                                                                 \
    unsigned short __x;                                                                 \
    T() = default;                                                                      \
    T(float f) : __x(kf_emu::TO(f)) {}                                                  \
    T(double f) : __x(kf_emu::TO(float(f))) {}                                          \
    T(int v) : __x(kf_emu::TO(float(v))) {}                                             \
    T(unsigned v) : __x(kf_emu::TO(float(v))) {}                                        \
    T(long long v) : __x(kf_emu::TO(float(v))) {}                                       \
    T(RAW r) : __x(r.x) {}                                                              \
    operator float() const { return kf_emu::FROM(__x); }                                \
    operator RAW() const { return RAW{__x}; }                                           \
    T& operator+=(T o) { return *this = T(float(*this) + float(o)); }                   \
    T& operator-=(T o) { return *this = T(float(*this) - float(o)); }                   \
    T& operator*=(T o) { return *this = T(float(*this) * float(o)); }                   \
    T& operator/=(T o) { return *this = T(float(*this) / float(o)); }                   \
  };                                                                                    \
  inline T operator+(T a, T b) { return T(float(a) + float(b)); }                       \
  inline T operator-(T a, T b) { return T(float(a) - float(b)); }                       \
  inline T operator*(T a, T b) { return T(float(a) * float(b)); }                       \
  inline T operator/(T a, T b) { return T(float(a) / float(b)); }                       \
  inline T operator-(T a) { T r; r.__x = a.__x ^ 0x8000; return r; }                   \
  inline bool operator==(T a, T b) { return float(a) == float(b); }                     \
  inline bool operator!=(T a, T b) { return float(a) != float(b); }                     \
  inline bool operator<(T a, T b) { return float(a) < float(b); }                       \
  inline bool operator<=(T a, T b) { return float(a) <= float(b); }                     \
  inline bool operator>(T a, T b) { return float(a) > float(b); }                       \
  inline bool operator>=(T a, T b) { return float(a) >= float(b); }

KF_EMU_LOWP(__half, __half_raw, float_to_f16_bits, f16_bits_to_float)
KF_EMU_LOWP(__nv_bfloat16, __nv_bfloat16_raw, float_to_bf16_bits, bf16_bits_to_float)
#undef KF_EMU_LOWP

typedef __half half;
typedef __nv_bfloat16 nv_bfloat16;
struct alignas(4) __half2 { __half x, y; };
struct alignas(4) __nv_bfloat162 { __nv_bfloat16 x, y; };
typedef __half2 half2;
typedef __nv_bfloat162 nv_bfloat162;

inline __half __float2half(float f) { return __half(f); }
inline __half __float2half_rn(float f) { return __half(f); }
inline float __half2float(__half h) { return float(h); }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline short __half_as_short(__half h) { return short(h.__x); }
inline __half __ushort_as_half(unsigned short u) { __half h; h.__x = u; return h; }
inline __half __short_as_half(short u) { __half h; h.__x = (unsigned short)u; return h; }
inline __half2 __floats2half2_rn(float a, float b) { return __half2{__half(a), __half(b)}; }
inline __half2 __float2half2_rn(float a) { return __half2{__half(a), __half(a)}; }
inline float2 __half22float2(__half2 h) { return float2{float(h.x), float(h.y)}; }
inline __half2 __halves2half2(__half a, __half b) { return __half2{a, b}; }
inline float __low2float(__half2 h) { return float(h.x); }
inline float __high2float(__half2 h) { return float(h.y); }

inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline float __bfloat162float(__nv_bfloat16 h) { return float(h); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
inline short __bfloat16_as_short(__nv_bfloat16 h) { return short(h.__x); }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { __nv_bfloat16 h; h.__x = u; return h; }
inline __nv_bfloat16 __short_as_bfloat16(short u) { __nv_bfloat16 h; h.__x = (unsigned short)u; return h; }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return __nv_bfloat162{__nv_bfloat16(a), __nv_bfloat16(b)}; }
inline __nv_bfloat162 __float2bfloat162_rn(float a) { return __nv_bfloat162{__nv_bfloat16(a), __nv_bfloat16(a)}; }
inline float2 __bfloat1622float2(__nv_bfloat162 h) { return float2{float(h.x), float(h.y)}; }
inline __nv_bfloat162 __halves2bfloat162(__nv_bfloat16 a, __nv_bfloat16 b) { return __nv_bfloat162{a, b}; }
inline float __low2float(__nv_bfloat162 h) { return float(h.x); }
inline float __high2float(__nv_bfloat162 h) { return float(h.y); }

inline __half __hmax(__half a, __half b) { return float(a) >= float(b) ? a : b; }
inline __half __hmin(__half a, __half b) { return float(a) <= float(b) ? a : b; }
inline __nv_bfloat16 __hmax(__nv_bfloat16 a, __nv_bfloat16 b) { return float(a) >= float(b) ? a : b; }
inline __nv_bfloat16 __hmin(__nv_bfloat16 a, __nv_bfloat16 b) { return float(a) <= float(b) ? a : b; }
inline bool __hisnan(__half a) { return std::isnan(float(a)); }
inline bool __hisnan(__nv_bfloat16 a) { return std::isnan(float(a)); }

// fp8 E4M3 (cuda_fp8.h): constructed from float with satfinite RNE, read back as float.
struct __nv_fp8_e4m3 {
  unsigned char __x;
  __nv_fp8_e4m3() = default;
  explicit __nv_fp8_e4m3(float f) : __x(kf_emu::float_to_e4m3_bits(f)) {}
  explicit __nv_fp8_e4m3(double f) : __x(kf_emu::float_to_e4m3_bits(float(f))) {}
  explicit __nv_fp8_e4m3(__half h) : __x(kf_emu::float_to_e4m3_bits(float(h))) {}
  explicit __nv_fp8_e4m3(__nv_bfloat16 h) : __x(kf_emu::float_to_e4m3_bits(float(h))) {}
  explicit operator float() const { return kf_emu::e4m3_bits_to_float(__x); }
  explicit operator __half() const { return __half(float(*this)); }
  explicit operator __nv_bfloat16() const { return __nv_bfloat16(float(*this)); }
};
typedef unsigned char __nv_fp8_storage_t;
enum __nv_saturation_t { __NV_NOSAT, __NV_SATFINITE };
enum __nv_fp8_interpretation_t { __NV_E4M3, __NV_E5M2 };
inline __nv_fp8_storage_t __nv_cvt_float_to_fp8(float x, __nv_saturation_t sat, __nv_fp8_interpretation_t kind) {
  if (kind != __NV_E4M3) kf_emu_unsupported_fp8_kind();
  return kf_emu::float_to_e4m3_bits(x, sat == __NV_SATFINITE);
}
