// kernforge CUDA device library: types and the scalar helpers every generated
// kernel uses (the names CRenderer in codegen/renderer.py prints).
//
// Semantics match the interpreter (kernforge/codegen/ir.py):
//  * kf_from_float<T> rounds to nearest even (fp8 e4m3: no saturation, an
//    out-of-range value becomes NaN, as ml_dtypes' float8_e4m3fn does);
//  * kf_floordiv / kf_floormod are Python floor semantics on integers (a zero
//    divisor gives 0, as numpy does), kf_fmod_floor is numpy's float remainder;
//  * kf_max / kf_min on floats propagate NaN (numpy maximum/minimum).
//
// No inline PTX here but kf_rcp_approx's: this header compiles under host emulation
// (-DKF_HOST_EMULATION), where kf/emu/cuda_shim.h supplies the CUDA builtins.
#pragma once

#include <type_traits>

#ifdef KF_HOST_EMULATION
#include "kf/emu/cuda_shim.h"
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>
#endif

typedef __half kf_half;
typedef __nv_bfloat16 kf_bf16;
typedef __nv_fp8_e4m3 kf_fp8e4m3;

#define KF_DEVICE __device__ __forceinline__

KF_DEVICE float kf_to_float(kf_half x) { return __half2float(x); }
KF_DEVICE float kf_to_float(kf_bf16 x) { return __bfloat162float(x); }
KF_DEVICE float kf_to_float(kf_fp8e4m3 x) { return static_cast<float>(x); }
KF_DEVICE float kf_to_float(float x) { return x; }

template <typename T> KF_DEVICE T kf_from_float(float x) { return static_cast<T>(x); }
template <> KF_DEVICE kf_half kf_from_float<kf_half>(float x) { return __float2half_rn(x); }
template <> KF_DEVICE kf_bf16 kf_from_float<kf_bf16>(float x) { return __float2bfloat16_rn(x); }
template <> KF_DEVICE kf_fp8e4m3 kf_from_float<kf_fp8e4m3>(float x) {
  kf_fp8e4m3 r;
  r.__x = __nv_cvt_float_to_fp8(x, __NV_NOSAT, __NV_E4M3);
  return r;
}

template <typename T> KF_DEVICE bool kf_isnan(T x) { return x != x; }

// T.rcp on float32: rcp.approx.ftz.f32, one MUFU.RCP (at most 1 ulp from 1/x per the PTX ISA;
// subnormal inputs and results flush to zero), where `1.0f / x` is an IEEE division with a
// called slow path.  The one inline PTX here; host emulation: kf/emu/intrinsics.h.
#ifdef KF_HOST_EMULATION
KF_DEVICE float kf_rcp_approx(float x) { return kf_emu_rcp_approx_ftz(x); }
#else
KF_DEVICE float kf_rcp_approx(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
#endif

// Binary helpers take two operand types: the printer mixes int64_t values with `LL` literals.
template <class A, class B, class T = std::common_type_t<A, B>> KF_DEVICE T kf_max(A a_, B b_) {
  const T a = T(a_), b = T(b_);
  return (a > b || a != a) ? a : b;
}
template <class A, class B, class T = std::common_type_t<A, B>> KF_DEVICE T kf_min(A a_, B b_) {
  const T a = T(a_), b = T(b_);
  return (a < b || a != a) ? a : b;
}
template <typename T> KF_DEVICE T kf_abs(T a) { return a < T(0) ? T(-a) : a; }

// Floor semantics; a zero divisor gives 0 (numpy's result), -1 avoids the INT_MIN / -1 trap.
template <class A, class B, class T = std::common_type_t<A, B>> KF_DEVICE T kf_floordiv(A a_, B b_) {
  const T a = T(a_), b = T(b_);
  if (b == 0) return T(0);
  if constexpr (std::is_signed_v<T>) {
    if (b == T(-1)) return T(T(0) - a);
    const T q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? T(q - 1) : q;
  } else {
    return a / b;
  }
}
template <class A, class B, class T = std::common_type_t<A, B>> KF_DEVICE T kf_floormod(A a_, B b_) {
  const T a = T(a_), b = T(b_);
  if (b == 0) return T(0);
  if constexpr (std::is_signed_v<T>) {
    if (b == T(-1)) return T(0);
    const T r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? T(r + b) : r;
  } else {
    return a % b;
  }
}
// Python/numpy float remainder: the result takes the divisor's sign (a zero result too).
KF_DEVICE float kf_fmod_floor(float a, float b) {
  float r = fmodf(a, b);
  if (r != 0.0f) return ((r < 0.0f) != (b < 0.0f)) ? r + b : r;
  return copysignf(0.0f, b);
}
KF_DEVICE double kf_fmod_floor(double a, double b) {
  double r = fmod(a, b);
  if (r != 0.0) return ((r < 0.0) != (b < 0.0)) ? r + b : r;
  return copysign(0.0, b);
}

template <typename To, typename From> KF_DEVICE To kf_bitcast(From x) {
  static_assert(sizeof(To) == sizeof(From), "kf_bitcast needs types of one width");
  To r;
  memcpy(&r, &x, sizeof(To));
  return r;
}

template <typename T> KF_DEVICE T kf_inf() { return static_cast<T>(__builtin_huge_valf()); }
template <> KF_DEVICE double kf_inf<double>() { return __builtin_huge_val(); }
template <typename T> KF_DEVICE T kf_nan() { return static_cast<T>(__builtin_nanf("")); }
template <> KF_DEVICE double kf_nan<double>() { return __builtin_nan(""); }

namespace kf {

// Two adjacent elements (p[0] = a, p[1] = b, each rounded RNE) in one store twice the element's
// width; p must be aligned to 2 * sizeof(T).  The accumulator epilogue stores column pairs this way.
template <typename T> KF_DEVICE void store_pair(T* p, float a, float b);
template <> KF_DEVICE void store_pair<kf_bf16>(kf_bf16* p, float a, float b) {
  const uint32_t lo = kf_bitcast<uint16_t>(kf_from_float<kf_bf16>(a));
  const uint32_t hi = kf_bitcast<uint16_t>(kf_from_float<kf_bf16>(b));
  *reinterpret_cast<uint32_t*>(p) = lo | (hi << 16);
}
template <> KF_DEVICE void store_pair<kf_half>(kf_half* p, float a, float b) {
  const uint32_t lo = kf_bitcast<uint16_t>(kf_from_float<kf_half>(a));
  const uint32_t hi = kf_bitcast<uint16_t>(kf_from_float<kf_half>(b));
  *reinterpret_cast<uint32_t*>(p) = lo | (hi << 16);
}
template <> KF_DEVICE void store_pair<float>(float* p, float a, float b) {
  *reinterpret_cast<uint64_t*>(p) = uint64_t(kf_bitcast<uint32_t>(a)) | (uint64_t(kf_bitcast<uint32_t>(b)) << 32);
}

}  // namespace kf
