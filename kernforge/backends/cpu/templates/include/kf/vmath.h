// Transcendentals the CPU renderer emits in place of a libm call, so that the loops around
// them vectorise.
//
// kf_exp2f: float exp2 without a call.  glibc's exp2f is a scalar call, and a loop that calls it
// is not vectorised (the softmax of an attention tile spent about as long there as in its two
// GEMMs).  This one is branch-free arithmetic that g++ vectorises under `omp simd`: in double,
// x = n + f with n = rint(x) and |f| <= 1/2 (exact), 2^f by a degree-8 polynomial (Chebyshev
// interpolant, relative error 1.1e-12), times 2^n built in the exponent bits, then one rounding
// to float, which also rounds denormal results correctly.  The double result is within 1.1e-12
// of 2^x, so the float is the correctly rounded one except when 2^x lies that close to a
// rounding midpoint (then 1 ulp off; the backend's contract is 4 ulp).  Over every 97th float in
// (-160, 140) it equals glibc's exp2f in 99.99% of cases and is never more than 1 ulp from it.
// Integer x gives 2^x exactly (f = 0, p(0) = 1); -inf and x < -150 give 0, +inf and x >= 128
// give inf, a NaN comes back quiet with its sign and payload.
//
// No float comparisons: under -ftrapping-math (the default) g++ will not if-convert a float
// compare into a vector blend, so the clamp to [-200, 200] compares the float's bits as
// integers (sign-magnitude made monotonic) and the NaN test is an integer test too.  The magic
// constant 1.5 * 2^52 rounds to an integer by addition (nearest, ties to even), which
// -ffp-contract=off keeps as written.
#pragma once

#include <cstdint>
#include <cstring>

inline __attribute__((always_inline)) float kf_exp2f(float x) {
  int32_t b;
  std::memcpy(&b, &x, sizeof(b));
  const int32_t flip = (b >> 31) & 0x7fffffff;  // negative floats count down: flip their magnitude
  int32_t key = b ^ flip;
  key = key < -1128792065 ? -1128792065 : key;  // the key of -200.0f
  key = key > 1128792064 ? 1128792064 : key;    // the key of 200.0f
  key ^= (key >> 31) & 0x7fffffff;
  float xc;
  std::memcpy(&xc, &key, sizeof(xc));
  const double xd = double(xc);
  const double t = xd + 6755399441055744.0;  // 1.5 * 2^52: the low bits of t hold rint(xd)
  const double n = t - 6755399441055744.0;
  const double f = xd - n;                    // exact, |f| <= 1/2
  double p = 1.325497460306718e-06;
  p = p * f + 1.531007807039615e-05;
  p = p * f + 0.00015403457039410448;
  p = p * f + 0.0013333450573018062;
  p = p * f + 0.009618129157656703;
  p = p * f + 0.055504109412010456;
  p = p * f + 0.24022650695821055;
  p = p * f + 0.6931471805459343;
  p = p * f + 1.0;
  uint64_t tb;
  std::memcpy(&tb, &t, sizeof(tb));
  const uint64_t sb = (tb + 1023u) << 52;     // 2^n: n + 1023 in [823, 1223] fills the exponent
  double s;
  std::memcpy(&s, &sb, sizeof(s));
  const float r = float(p * s);
  int32_t rb;
  std::memcpy(&rb, &r, sizeof(rb));
  const int32_t nan = -int32_t((b & 0x7fffffff) > 0x7f800000);  // all ones for a NaN x
  rb = (rb & ~nan) | ((b | 0x00400000) & nan);  // a NaN comes back quiet, payload and sign kept
  float out;
  std::memcpy(&out, &rb, sizeof(out));
  return out;
}
