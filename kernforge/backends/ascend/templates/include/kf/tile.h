// Tile operations on UB tensors.
//
// fill: Duplicate (vector).  vector_reduce: ReduceMax/ReduceMin/ReduceSum per row of a
// float/half [OUTER][N] tile (N * sizeof(T) a multiple of 32), each result written by the
// scalar unit into dst (its rows are not 32-byte aligned).  reduce/cumsum: the scalar
// fallback over [OUTER][N][INNER] in index order in the compute type C, as the CPU's
// kf/tile.h, so integer and max/min results are exact and float sums have one order.
#pragma once

namespace kf {

template <class T>
__aicore__ inline void fill(const AscendC::LocalTensor<T>& dst, T value, int32_t count) {
  sync<AscendC::HardEvent::S_V>();
  AscendC::Duplicate(dst, value, count);
  sync<AscendC::HardEvent::V_S>();
}

enum class VReduce { Max, Min, Sum };

template <VReduce OP, int OUTER, int N, bool CLEAR, class T>
__aicore__ inline void vector_reduce(const AscendC::LocalTensor<T>& src, const AscendC::LocalTensor<T>& dst,
                                     const AscendC::LocalTensor<T>& work, const AscendC::LocalTensor<T>& res) {
  sync<AscendC::HardEvent::S_V>();
  for (int o = 0; o < OUTER; ++o) {
    if constexpr (OP == VReduce::Max) AscendC::ReduceMax(res, src[o * N], work, N, false);
    else if constexpr (OP == VReduce::Min) AscendC::ReduceMin(res, src[o * N], work, N, false);
    else AscendC::ReduceSum(res, src[o * N], work, N);
    sync<AscendC::HardEvent::V_S>();
    const float r = float(res.GetValue(0));
    float v = r;
    if constexpr (!CLEAR) {
      const float d = float(dst.GetValue(o));
      v = OP == VReduce::Max ? kf_max(d, r) : OP == VReduce::Min ? kf_min(d, r) : d + r;
    }
    dst.SetValue(o, T(v));
    sync<AscendC::HardEvent::S_V>();
  }
  sync<AscendC::HardEvent::V_S>();
}

enum class Reduce { Max, Min, Sum };

template <class C, class T>
__aicore__ inline C load_as(T v) {
  if constexpr (kf_is_low<T>::value) return C(kf_to_float(v));
  else return C(v);
}

template <class D, class C>
__aicore__ inline D store_as(C v) {
  if constexpr (kf_is_low<D>::value) return kf_from_float<D>(float(v));
  else return D(v);
}

template <Reduce OP, class C>
__aicore__ inline C combine(C a, C b) {
  if constexpr (OP == Reduce::Max) return kf_max(a, b);
  else if constexpr (OP == Reduce::Min) return kf_min(a, b);
  else return a + b;
}

// dst[o][i] = op over n of src[o][n][i]; with CLEAR false, dst = op(dst, that).
template <Reduce OP, int OUTER, int N, int INNER, bool CLEAR, class C, class S, class D>
__aicore__ inline void reduce(const AscendC::LocalTensor<S>& src, const AscendC::LocalTensor<D>& dst) {
  for (int o = 0; o < OUTER; ++o)
    for (int i = 0; i < INNER; ++i) {
      C acc = load_as<C>(src.GetValue((o * N) * INNER + i));
      for (int n = 1; n < N; ++n) acc = combine<OP>(acc, load_as<C>(src.GetValue((o * N + n) * INNER + i)));
      if constexpr (!CLEAR) acc = combine<OP>(load_as<C>(dst.GetValue(o * INNER + i)), acc);
      dst.SetValue(o * INNER + i, store_as<D>(acc));
    }
}

// Inclusive prefix sum along the middle axis (suffix sum when REVERSE); dst may be src.
template <int OUTER, int N, int INNER, bool REVERSE, class C, class S, class D>
__aicore__ inline void cumsum(const AscendC::LocalTensor<S>& src, const AscendC::LocalTensor<D>& dst) {
  for (int o = 0; o < OUTER; ++o)
    for (int i = 0; i < INNER; ++i) {
      C acc = C(0);
      for (int t = 0; t < N; ++t) {
        const int n = REVERSE ? N - 1 - t : t;
        acc = t == 0 ? load_as<C>(src.GetValue((o * N + n) * INNER + i)) : C(acc + load_as<C>(src.GetValue((o * N + n) * INNER + i)));
        dst.SetValue((o * N + n) * INNER + i, store_as<D>(acc));
      }
    }
}

}  // namespace kf
