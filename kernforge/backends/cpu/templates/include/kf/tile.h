// Reductions and scans along one axis of an on-chip tile.
//
// The tile is viewed as [OUTER][N][INNER] with the reduced/scanned axis in the
// middle.  Values combine in the compute type C (float for low-precision
// tiles), strictly in index order 0..N-1 (N-1..0 for a reverse scan), and round
// once when stored, so integer and max/min results are exact and float sums
// have one well-defined order.  When INNER > 1 the loop over INNER is innermost
// and contiguous, so the compiler vectorises across it without reassociating.
#pragma once

#include <cstdint>

#include "convert.h"
#include "scalar.h"

namespace kf {

enum class Reduce { Max, Min, Sum };

template <Reduce OP, class C>
inline constexpr C combine(C a, C b) {
  if constexpr (OP == Reduce::Max) return kf_max(a, b);
  else if constexpr (OP == Reduce::Min) return kf_min(a, b);
  else return a + b;
}

// dst[o][i] = op over n of src[o][n][i]; with CLEAR false, dst = op(dst, that).
template <Reduce OP, int OUTER, int N, int INNER, bool CLEAR, class C, class S, class D>
inline void reduce(const S* __restrict__ src, D* __restrict__ dst) {
  constexpr int CHUNK = INNER < 256 ? INNER : 256;
  for (int o = 0; o < OUTER; ++o) {
    const S* s = src + int64_t(o) * N * INNER;
    D* d = dst + int64_t(o) * INNER;
    if constexpr (INNER == 1) {
      C acc = load_as<C>(s[0]);
      for (int n = 1; n < N; ++n) acc = combine<OP>(acc, load_as<C>(s[n]));
      d[0] = store_as<D>(CLEAR ? acc : combine<OP>(load_as<C>(d[0]), acc));
    } else {
      for (int i0 = 0; i0 < INNER; i0 += CHUNK) {
        const int w = INNER - i0 < CHUNK ? INNER - i0 : CHUNK;
        C acc[CHUNK];
        for (int i = 0; i < w; ++i) acc[i] = load_as<C>(s[i0 + i]);
        for (int n = 1; n < N; ++n) {
          const S* row = s + int64_t(n) * INNER + i0;
#pragma omp simd
          for (int i = 0; i < w; ++i) acc[i] = combine<OP>(acc[i], load_as<C>(row[i]));
        }
        for (int i = 0; i < w; ++i)
          d[i0 + i] = store_as<D>(CLEAR ? acc[i] : combine<OP>(load_as<C>(d[i0 + i]), acc[i]));
      }
    }
  }
}

// Inclusive prefix sum along the middle axis (suffix sum when REVERSE); dst may be src.
template <int OUTER, int N, int INNER, bool REVERSE, class C, class S, class D>
inline void cumsum(const S* src, D* dst) {
  constexpr int CHUNK = INNER < 256 ? INNER : 256;
  for (int o = 0; o < OUTER; ++o) {
    const S* s = src + int64_t(o) * N * INNER;
    D* d = dst + int64_t(o) * N * INNER;
    for (int i0 = 0; i0 < INNER; i0 += CHUNK) {
      const int w = INNER - i0 < CHUNK ? INNER - i0 : CHUNK;
      C acc[CHUNK];
      for (int t = 0; t < N; ++t) {
        const int64_t n = REVERSE ? N - 1 - t : t;
        for (int i = 0; i < w; ++i) {
          const C v = load_as<C>(s[n * INNER + i0 + i]);
          acc[i] = t == 0 ? v : acc[i] + v;
          d[n * INNER + i0 + i] = store_as<D>(acc[i]);
        }
      }
    }
  }
}

}  // namespace kf
