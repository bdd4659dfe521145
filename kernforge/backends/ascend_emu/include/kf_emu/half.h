// ascend-emu: software half and bfloat16_t (the CPU debug flow models half with a class too),
// and on dav-3510 only fp8_e4m3fn_t (the 950 has fp8; 910B has none, so on 2201 the type does
// not exist and using it is a g++ error).  Conversions from float round to nearest even; NaN
// stays NaN; e4m3fn has no infinities (S.1111.111 is NaN, 448 the largest finite value), and a
// float past 464 (half-way to the next binade step) becomes NaN, as kernforge's IR converts.
#pragma once

#include <cstdint>
#include <cstring>

namespace kf_emu {

inline uint32_t f2u(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float u2f(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

inline uint16_t float_to_half_bits(float f) {
  const uint32_t x = f2u(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7FFFFFFFu;
  if (ax >= 0x7F800000u) return uint16_t(sign | 0x7C00u | (ax > 0x7F800000u ? 0x200u : 0u));
  if (ax >= 0x477FF000u) return uint16_t(sign | 0x7C00u);  // rounds to infinity
  if (ax < 0x38800000u) {                                   // subnormal half (or zero)
    const float v = u2f(ax) * 16777216.0f;                  // * 2^24: the subnormal's integer mantissa
    const uint32_t m = uint32_t(v);
    const float r = v - float(m);
    uint32_t q = m + ((r > 0.5f || (r == 0.5f && (m & 1))) ? 1u : 0u);
    return uint16_t(sign | q);
  }
  const uint32_t e = ((ax >> 23) - 112u) << 10;
  const uint32_t m = (ax >> 13) & 0x3FFu;
  uint32_t h = e | m;
  const uint32_t rest = ax & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return uint16_t(sign | h);
}

inline float half_bits_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0) {
    const float v = float(m) / 16777216.0f;
    return sign ? -v : v;
  }
  if (e == 31) return u2f(sign | 0x7F800000u | (m << 13));
  return u2f(sign | ((e + 112u) << 23) | (m << 13));
}

inline uint16_t float_to_bf16_bits(float f) {
  const uint32_t x = f2u(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((x >> 16) | 0x40u);
  return uint16_t((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

inline uint8_t float_to_e4m3_bits(float f) {
  const uint32_t u = f2u(f);
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x43E80000u) return uint8_t(sign | 0x7Fu);  // NaN, inf, > 464: NaN
  if (a < 0x3C800000u) {                              // subnormal (step 2^-9) or zero
    const float v = u2f(a) * 512.0f;
    const uint32_t m = uint32_t(v);
    const float r = v - float(m);
    return uint8_t(sign | (m + ((r > 0.5f || (r == 0.5f && (m & 1))) ? 1u : 0u)));
  }
  const uint32_t odd = (a >> 20) & 1u;
  return uint8_t(sign | ((a - 0x3C000000u + 0x7FFFFu + odd) >> 20));
}

inline float e4m3_bits_to_float(uint8_t b) {
  const uint32_t sign = uint32_t(b & 0x80u) << 24;
  const uint32_t e = (b >> 3) & 0xFu, m = b & 0x7u;
  if (e == 0xF && m == 0x7) return u2f(sign | 0x7FC00000u);
  if (e == 0) {
    const float v = float(m) / 512.0f;
    return sign ? -v : v;
  }
  return u2f(sign | ((e + 120u) << 23) | (m << 20));
}

}  // namespace kf_emu

#if __NPU_ARCH__ == 3510
struct fp8_e4m3fn_t {
  uint8_t bits = 0;
  fp8_e4m3fn_t() = default;
  fp8_e4m3fn_t(float f) : bits(kf_emu::float_to_e4m3_bits(f)) {}
  fp8_e4m3fn_t(double f) : bits(kf_emu::float_to_e4m3_bits(float(f))) {}
  fp8_e4m3fn_t(int v) : bits(kf_emu::float_to_e4m3_bits(float(v))) {}
  operator float() const { return kf_emu::e4m3_bits_to_float(bits); }
};
#endif

struct half {
  uint16_t bits = 0;
  half() = default;
  half(float f) : bits(kf_emu::float_to_half_bits(f)) {}
  half(double f) : bits(kf_emu::float_to_half_bits(float(f))) {}
  half(int v) : bits(kf_emu::float_to_half_bits(float(v))) {}
  operator float() const { return kf_emu::half_bits_to_float(bits); }
};

struct bfloat16_t {
  uint16_t bits = 0;
  bfloat16_t() = default;
  bfloat16_t(float f) : bits(kf_emu::float_to_bf16_bits(f)) {}
  bfloat16_t(double f) : bits(kf_emu::float_to_bf16_bits(float(f))) {}
  bfloat16_t(int v) : bits(kf_emu::float_to_bf16_bits(float(v))) {}
  operator float() const { return kf_emu::u2f(uint32_t(bits) << 16); }
};
