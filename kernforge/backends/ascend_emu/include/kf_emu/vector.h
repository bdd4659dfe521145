// ascend-emu: the vector ops kernforge emits, count forms (spec section 5), on PIPE_V.
// Every operand must be a usable UB tensor, 32-byte aligned, with the op's footprint inside
// it; the dtype must be one the op has on the arch (A2 vector math: half and float).
#pragma once

namespace AscendC {

enum class RoundMode : uint8_t { CAST_NONE, CAST_RINT, CAST_FLOOR, CAST_CEIL, CAST_ROUND, CAST_TRUNC, CAST_ODD };

namespace kf_vec {

template <typename T>
constexpr bool is_math = std::is_same_v<T, half> || std::is_same_v<T, float>;
template <typename T>
constexpr bool is_int_arith = std::is_same_v<T, int16_t> || std::is_same_v<T, int32_t>;
template <typename T>
constexpr bool is_dup = is_math<T> || std::is_same_v<T, int16_t> || std::is_same_v<T, uint16_t> ||
                        std::is_same_v<T, int32_t> || std::is_same_v<T, uint32_t>;

template <typename T>
const char* tname() {
  if constexpr (std::is_same_v<T, half>) return "half";
  else if constexpr (std::is_same_v<T, bfloat16_t>) return "bfloat16_t";
  else if constexpr (std::is_same_v<T, float>) return "float";
  else if constexpr (std::is_same_v<T, int32_t>) return "int32_t";
  else if constexpr (std::is_same_v<T, uint32_t>) return "uint32_t";
  else if constexpr (std::is_same_v<T, int16_t>) return "int16_t";
  else if constexpr (std::is_same_v<T, uint16_t>) return "uint16_t";
  else return "this type";
}

template <typename T>
void dtype(bool ok, const char* op) {
  if (!ok) fail("dtype", "%s does not exist for %s on %s", op, tname<T>(), kf_emu::arch_name());
}

template <typename T>
void operand(const LocalTensor<T>& t, int32_t count, const char* op, bool write) {
  if (count < 0) fail("vector count", "%s with count %d", op, count);
  t.check_operand(uint32_t(count), op);
  if (t.mem() != Mem::UB) fail("position", "%s on a %s tensor: vector operands are in UB", op, position_name(t.pos()));
  kf_emu::ctx().touch(Mem::UB, t.byte_offset(), uint32_t(count) * sizeof(T), kf_emu::P_V, write);
}

template <typename T>
float f(const LocalTensor<T>& t, int32_t i) {
  T v;
  std::memcpy(&v, t.addr(i), sizeof(T));
  return float(v);
}

template <typename T>
T get(const LocalTensor<T>& t, int32_t i) {
  T v;
  std::memcpy(&v, t.addr(i), sizeof(T));
  return v;
}

template <typename T>
void put(const LocalTensor<T>& t, int32_t i, T v) { std::memcpy(t.addr(i), &v, sizeof(T)); }

inline float nanmax(float a, float b) { return (a > b || a != a) ? a : b; }
inline float nanmin(float a, float b) { return (a < b || a != a) ? a : b; }

}  // namespace kf_vec

template <typename T>
void Duplicate(const LocalTensor<T>& dst, const T& scalar, const int32_t count) {
  kf_vec::dtype<T>(kf_vec::is_dup<T>, "Duplicate");
  kf_vec::operand(dst, count, "Duplicate", true);
  for (int32_t i = 0; i < count; ++i) kf_vec::put(dst, i, scalar);
}

#define KF_EMU_BINARY(NAME, EXPR, INTS)                                                               \
  template <typename T>                                                                               \
  void NAME(const LocalTensor<T>& dst, const LocalTensor<T>& a, const LocalTensor<T>& b, const int32_t count) { \
    kf_vec::dtype<T>(kf_vec::is_math<T> || (INTS && kf_vec::is_int_arith<T>), #NAME);                 \
    kf_vec::operand(a, count, #NAME, false);                                                          \
    kf_vec::operand(b, count, #NAME, false);                                                          \
    kf_vec::operand(dst, count, #NAME, true);                                                         \
    for (int32_t i = 0; i < count; ++i) {                                                             \
      if constexpr (kf_vec::is_math<T>) {                                                             \
        const float x = kf_vec::f(a, i), y = kf_vec::f(b, i);                                         \
        kf_vec::put(dst, i, T(EXPR));                                                                 \
      } else {                                                                                        \
        const T x = kf_vec::get(a, i), y = kf_vec::get(b, i);                                         \
        kf_vec::put(dst, i, T(EXPR));                                                                 \
      }                                                                                               \
    }                                                                                                 \
  }
KF_EMU_BINARY(Add, x + y, true)
KF_EMU_BINARY(Sub, x - y, true)
KF_EMU_BINARY(Mul, x * y, false)
KF_EMU_BINARY(Div, x / y, false)
KF_EMU_BINARY(Max, kf_vec::nanmax(x, y), true)
KF_EMU_BINARY(Min, kf_vec::nanmin(x, y), true)
#undef KF_EMU_BINARY

#define KF_EMU_SCALAR(NAME, EXPR)                                                                     \
  template <typename T>                                                                               \
  void NAME(const LocalTensor<T>& dst, const LocalTensor<T>& src, const T& s, const int32_t count) {  \
    kf_vec::dtype<T>(kf_vec::is_math<T>, #NAME);                                                      \
    kf_vec::operand(src, count, #NAME, false);                                                        \
    kf_vec::operand(dst, count, #NAME, true);                                                         \
    const float y = float(s);                                                                         \
    for (int32_t i = 0; i < count; ++i) {                                                             \
      const float x = kf_vec::f(src, i);                                                              \
      kf_vec::put(dst, i, T(EXPR));                                                                   \
    }                                                                                                 \
  }
KF_EMU_SCALAR(Adds, x + y)
KF_EMU_SCALAR(Muls, x * y)
KF_EMU_SCALAR(Maxs, kf_vec::nanmax(x, y))
KF_EMU_SCALAR(Mins, kf_vec::nanmin(x, y))
#undef KF_EMU_SCALAR

#define KF_EMU_UNARY(NAME, EXPR)                                                                      \
  template <typename T>                                                                               \
  void NAME(const LocalTensor<T>& dst, const LocalTensor<T>& src, const int32_t count) {              \
    kf_vec::dtype<T>(kf_vec::is_math<T>, #NAME);                                                      \
    kf_vec::operand(src, count, #NAME, false);                                                        \
    kf_vec::operand(dst, count, #NAME, true);                                                         \
    for (int32_t i = 0; i < count; ++i) {                                                             \
      const float x = kf_vec::f(src, i);                                                              \
      kf_vec::put(dst, i, T(EXPR));                                                                   \
    }                                                                                                 \
  }
KF_EMU_UNARY(Exp, std::exp(x))
KF_EMU_UNARY(Ln, std::log(x))
KF_EMU_UNARY(Sqrt, std::sqrt(x))
KF_EMU_UNARY(Abs, std::fabs(x))
KF_EMU_UNARY(Relu, x > 0.0f ? x : 0.0f)
KF_EMU_UNARY(Reciprocal, 1.0f / x)
#undef KF_EMU_UNARY

// dst[0] = max of src[0:count] (NaN propagates here; the device's NaN rule is not modelled),
// dst[1] = its lowest index (in T's bits) when calIndex.  tmp is the API's work tensor.
template <typename T>
void ReduceMax(const LocalTensor<T>& dst, const LocalTensor<T>& src, const LocalTensor<T>& tmp, const int32_t count,
               bool calIndex = false) {
  kf_vec::dtype<T>(kf_vec::is_math<T>, "ReduceMax");
  if (count < 1) fail("vector count", "ReduceMax over %d elements", count);
  kf_vec::operand(src, count, "ReduceMax", false);
  kf_vec::operand(tmp, count, "ReduceMax (work tensor)", true);
  kf_vec::operand(dst, calIndex ? 2 : 1, "ReduceMax", true);
  float best = kf_vec::f(src, 0);
  uint32_t at = 0;
  for (int32_t i = 1; i < count; ++i) {
    const float x = kf_vec::f(src, i);
    if (best == best && (x > best || x != x)) best = x, at = uint32_t(i);
  }
  kf_vec::put(dst, 0, T(best));
  if (calIndex) {
    T bits;
    if constexpr (sizeof(T) == 4) std::memcpy(&bits, &at, 4);
    else { const uint16_t a16 = uint16_t(at); std::memcpy(&bits, &a16, 2); }
    kf_vec::put(dst, 1, bits);
  }
}

template <typename T>
void ReduceMin(const LocalTensor<T>& dst, const LocalTensor<T>& src, const LocalTensor<T>& tmp, const int32_t count,
               bool calIndex = false) {
  kf_vec::dtype<T>(kf_vec::is_math<T>, "ReduceMin");
  if (count < 1) fail("vector count", "ReduceMin over %d elements", count);
  kf_vec::operand(src, count, "ReduceMin", false);
  kf_vec::operand(tmp, count, "ReduceMin (work tensor)", true);
  kf_vec::operand(dst, calIndex ? 2 : 1, "ReduceMin", true);
  float best = kf_vec::f(src, 0);
  for (int32_t i = 1; i < count; ++i) best = kf_vec::nanmin(best, kf_vec::f(src, i));
  kf_vec::put(dst, 0, T(best));
}

// dst[0] = sum of src[0:count] as a binary tree (the device sums a binary tree per repeat;
// its exact order across repeats is not modelled).
template <typename T>
void ReduceSum(const LocalTensor<T>& dst, const LocalTensor<T>& src, const LocalTensor<T>& tmp, const int32_t count) {
  kf_vec::dtype<T>(kf_vec::is_math<T>, "ReduceSum");
  if (count < 1) fail("vector count", "ReduceSum over %d elements", count);
  kf_vec::operand(src, count, "ReduceSum", false);
  kf_vec::operand(tmp, count, "ReduceSum (work tensor)", true);
  kf_vec::operand(dst, 1, "ReduceSum", true);
  std::vector<float> v(count);
  for (int32_t i = 0; i < count; ++i) v[i] = kf_vec::f(src, i);
  for (size_t n = v.size(); n > 1;) {
    const size_t h = n / 2;
    for (size_t i = 0; i < h; ++i) v[i] = v[2 * i] + v[2 * i + 1];
    if (n & 1) v[h] = v[n - 1];
    n = h + (n & 1);
  }
  kf_vec::put(dst, 0, T(v[0]));
}

// Casts between half/bfloat16_t/float/int32 (A2: half->float NONE, float->half any mode,
// float->bf16 needs an explicit mode, bf16->float NONE, no half<->bf16).
template <typename D, typename S>
void Cast(const LocalTensor<D>& dst, const LocalTensor<S>& src, const RoundMode mode, const int32_t count) {
  constexpr bool half_bf16 = (std::is_same_v<D, half> && std::is_same_v<S, bfloat16_t>) ||
                             (std::is_same_v<D, bfloat16_t> && std::is_same_v<S, half>);
  if (half_bf16) fail("dtype", "Cast between half and bfloat16_t does not exist on %s", kf_emu::arch_name());
  if (std::is_same_v<D, bfloat16_t> && mode == RoundMode::CAST_NONE)
    fail("dtype", "Cast to bfloat16_t needs an explicit RoundMode (no CAST_NONE)");
  kf_vec::operand(src, count, "Cast", false);
  kf_vec::operand(dst, count, "Cast", true);
  for (int32_t i = 0; i < count; ++i) {
    const float x = float(kf_vec::get(src, i));
    float r = x;
    if constexpr (std::is_integral_v<D>) {
      r = mode == RoundMode::CAST_FLOOR ? std::floor(x) : mode == RoundMode::CAST_CEIL ? std::ceil(x)
          : mode == RoundMode::CAST_TRUNC ? std::trunc(x) : mode == RoundMode::CAST_ROUND ? std::round(x)
          : std::nearbyint(x);
    }
    kf_vec::put(dst, i, D(r));
  }
}

}  // namespace AscendC
