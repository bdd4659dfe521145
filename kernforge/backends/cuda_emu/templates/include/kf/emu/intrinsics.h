// CUDA device intrinsics on the host: math, bit manipulation, conversions,
// cache-hinted loads, fences and atomics.
//
// Atomics are real host atomics (GCC __atomic builtins on the same memory), so
// concurrent threads of a block -- and blocks, when more than one runs -- race
// exactly as they would on the GPU; float atomics are CAS loops, as on sm_80.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "runtime.h"
#include "types.h"

// ---- math ---------------------------------------------------------------------------
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __exp10f(float x) { return std::pow(10.0f, x); }
inline float __logf(float x) { return std::log(x); }
inline float __log2f(float x) { return std::log2(x); }
inline float __log10f(float x) { return std::log10(x); }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline float __tanf(float x) { return std::tan(x); }
inline float __powf(float x, float y) { return std::pow(x, y); }
// rcp.approx.ftz.f32 (kf_rcp_approx): the hardware result is within 1 ulp of 1/x (PTX ISA); this
// returns the correctly rounded 1/x (within 0.5 ulp, so inside the hardware's bound, not bit-exact
// with MUFU.RCP), with the instruction's .ftz: a subnormal input counts as a signed zero (1/x =
// signed inf) and a subnormal result becomes a signed zero (|x| > 2^126), which IEEE 1.0f / x keeps.
inline float kf_emu_rcp_approx_ftz(float x) {
  if (std::fpclassify(x) == FP_SUBNORMAL) x = std::copysign(0.0f, x);
  const float r = 1.0f / x;
  return std::fpclassify(r) == FP_SUBNORMAL ? std::copysign(0.0f, r) : r;
}
inline float __fdividef(float x, float y) { return x / y; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return std::sqrt(x); }
inline float __frsqrt_rn(float x) { return 1.0f / std::sqrt(x); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __saturatef(float x) { return std::isnan(x) ? 0.0f : (x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x)); }
inline float exp10f(float x) { return std::pow(10.0f, x); }
inline void sincosf(float x, float* s, float* c) { *s = std::sin(x); *c = std::cos(x); }

inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
inline long min(long a, long b) { return a < b ? a : b; }
inline long max(long a, long b) { return a > b ? a : b; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }

// ---- bits and conversions ------------------------------------------------------------
inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
inline unsigned __float_as_uint(float f) { unsigned i; std::memcpy(&i, &f, 4); return i; }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
inline long long __double_as_longlong(double d) { long long i; std::memcpy(&i, &d, 8); return i; }
inline double __longlong_as_double(long long i) { double d; std::memcpy(&d, &i, 8); return d; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(unsigned(x)); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned __brev(unsigned x) {
  x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
  x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
  x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
  x = ((x >> 8) & 0x00ff00ffu) | ((x & 0x00ff00ffu) << 8);
  return (x >> 16) | (x << 16);
}
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const uint64_t v = (uint64_t(y) << 32) | x;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= unsigned((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return r;
}
inline unsigned __funnelshift_l(unsigned lo, unsigned hi, unsigned s) {
  return unsigned(((uint64_t(hi) << 32 | lo) << (s & 31)) >> 32);
}
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned s) {
  return unsigned((uint64_t(hi) << 32 | lo) >> (s & 31));
}
inline unsigned __umulhi(unsigned a, unsigned b) { return unsigned((uint64_t(a) * b) >> 32); }
inline int __mulhi(int a, int b) { return int((int64_t(a) * b) >> 32); }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
  return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
inline int __float2int_rn(float x) { return int(std::nearbyint(x)); }
inline int __float2int_rz(float x) { return int(x); }
inline int __float2int_rd(float x) { return int(std::floor(x)); }
inline int __float2int_ru(float x) { return int(std::ceil(x)); }
inline unsigned __float2uint_rn(float x) { return unsigned(std::nearbyint(x)); }
inline float __int2float_rn(int x) { return float(x); }
inline float __uint2float_rn(unsigned x) { return float(x); }

// ---- loads, stores, fences, timing ---------------------------------------------------------
template <class T> inline T __ldg(const T* p) { return *p; }
template <class T> inline T __ldcg(const T* p) { return *p; }
template <class T> inline T __ldca(const T* p) { return *p; }
template <class T> inline T __ldcs(const T* p) { return *p; }
template <class T> inline T __ldlu(const T* p) { return *p; }
template <class T> inline T __ldcv(const T* p) { return *p; }
template <class T> inline void __stcg(T* p, T v) { *p = v; }
template <class T> inline void __stcs(T* p, T v) { *p = v; }
template <class T> inline void __stwb(T* p, T v) { *p = v; }
template <class T> inline void __stwt(T* p, T v) { *p = v; }
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline long long clock64() { return kf_emu::now_ns(); }
inline void __nanosleep(unsigned ns) {
  timespec ts{0, long(ns)};
  nanosleep(&ts, nullptr);
}
inline void __trap() { kf_emu::fail("__trap() called by the kernel"); }
inline void __brkpt() { kf_emu::fail("__brkpt() called by the kernel"); }
#define __builtin_assume(x) ((void)0)

// ---- atomics ---------------------------------------------------------------------------------
namespace kf_emu {
template <class T, class F>
inline T atomic_update(T* p, F&& f) {  // CAS loop for operations without a builtin
  T old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (!__atomic_compare_exchange_n(p, &old, f(old), false, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) {
  }
  return old;
}
template <class F, class B>
inline F atomic_float_update(F* p, F v, B&& op) {
  using U = typename std::conditional<sizeof(F) == 4, uint32_t, uint64_t>::type;
  U* q = reinterpret_cast<U*>(p);
  U old = __atomic_load_n(q, __ATOMIC_RELAXED), next;
  do {
    F o;
    std::memcpy(&o, &old, sizeof(F));
    F n = op(o, v);
    std::memcpy(&next, &n, sizeof(F));
  } while (!__atomic_compare_exchange_n(q, &old, next, false, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED));
  F r;
  std::memcpy(&r, &old, sizeof(F));
  return r;
}
}  // namespace kf_emu

#define KF_EMU_INT_ATOMICS(T)                                                                            \
  inline T atomicAdd(T* p, T v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }                   \
  inline T atomicSub(T* p, T v) { return __atomic_fetch_sub(p, v, __ATOMIC_SEQ_CST); }                   \
  inline T atomicAnd(T* p, T v) { return __atomic_fetch_and(p, v, __ATOMIC_SEQ_CST); }                   \
  inline T atomicOr(T* p, T v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }                     \
  inline T atomicXor(T* p, T v) { return __atomic_fetch_xor(p, v, __ATOMIC_SEQ_CST); }                   \
  inline T atomicExch(T* p, T v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }                 \
  inline T atomicMax(T* p, T v) { return kf_emu::atomic_update(p, [v](T o) { return o > v ? o : v; }); } \
  inline T atomicMin(T* p, T v) { return kf_emu::atomic_update(p, [v](T o) { return o < v ? o : v; }); } \
  inline T atomicCAS(T* p, T cmp, T v) {                                                                  \
    __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                   \
    return cmp;                                                                                            \
  }
KF_EMU_INT_ATOMICS(int)
KF_EMU_INT_ATOMICS(unsigned int)
KF_EMU_INT_ATOMICS(long long)
KF_EMU_INT_ATOMICS(unsigned long long)
#undef KF_EMU_INT_ATOMICS
inline unsigned short atomicCAS(unsigned short* p, unsigned short cmp, unsigned short v) {
  __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return cmp;
}
inline unsigned atomicInc(unsigned* p, unsigned lim) {
  return kf_emu::atomic_update(p, [lim](unsigned o) { return o >= lim ? 0u : o + 1; });
}
inline unsigned atomicDec(unsigned* p, unsigned lim) {
  return kf_emu::atomic_update(p, [lim](unsigned o) { return (o == 0 || o > lim) ? lim : o - 1; });
}
inline float atomicAdd(float* p, float v) { return kf_emu::atomic_float_update(p, v, [](float a, float b) { return a + b; }); }
inline double atomicAdd(double* p, double v) { return kf_emu::atomic_float_update(p, v, [](double a, double b) { return a + b; }); }
inline float atomicExch(float* p, float v) { return kf_emu::atomic_float_update(p, v, [](float, float b) { return b; }); }
// sm_90 float atomicMax/Min: IEEE max/min (NaN operands are dropped, as fmaxf).
inline float atomicMax(float* p, float v) { return kf_emu::atomic_float_update(p, v, [](float a, float b) { return std::fmax(a, b); }); }
inline float atomicMin(float* p, float v) { return kf_emu::atomic_float_update(p, v, [](float a, float b) { return std::fmin(a, b); }); }
inline __nv_bfloat16 atomicAdd(__nv_bfloat16* p, __nv_bfloat16 v) {
  unsigned short* q = reinterpret_cast<unsigned short*>(p);
  unsigned short old = __atomic_load_n(q, __ATOMIC_RELAXED), next;
  do next = __nv_bfloat16(float(__ushort_as_bfloat16(old)) + float(v)).__x;
  while (!__atomic_compare_exchange_n(q, &old, next, false, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED));
  return __ushort_as_bfloat16(old);
}
inline __half atomicAdd(__half* p, __half v) {
  unsigned short* q = reinterpret_cast<unsigned short*>(p);
  unsigned short old = __atomic_load_n(q, __ATOMIC_RELAXED), next;
  do next = __half(float(__ushort_as_half(old)) + float(v)).__x;
  while (!__atomic_compare_exchange_n(q, &old, next, false, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED));
  return __ushort_as_half(old);
}
#define atomicAdd_block atomicAdd
#define atomicMax_block atomicMax
#define atomicMin_block atomicMin
#define atomicCAS_block atomicCAS
