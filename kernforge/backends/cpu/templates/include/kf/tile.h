// Reductions and scans along one axis of an on-chip tile.
//
// The tile is viewed as [OUTER][N][INNER] with the reduced/scanned axis in the
// middle.  Values combine in the compute type C (float for low-precision
// tiles), strictly in index order 0..N-1 (N-1..0 for a reverse scan), and round
// once when stored, so integer and max/min results are exact and float sums
// have one well-defined order.  When INNER > 1 the loop over INNER is innermost
// and contiguous, so the compiler vectorises across it without reassociating.
// When INNER == 1 (a row reduction: attention's row max and row sum) a float tile on
// AVX-512 is reduced 16 rows at a time: 16 x 16 squares are transposed in registers
// (kf::transpose16) so that lane r accumulates row r, still in index order, and the
// 16 rows' dependency chains run side by side instead of one add after another.
#pragma once

#include <cstdint>

#include "convert.h"
#include "gemm.h"  // KF_ISA, transpose16
#include "scalar.h"

namespace kf {

enum class Reduce { Max, Min, Sum };

template <Reduce OP, class C>
inline constexpr C combine(C a, C b) {
  if constexpr (OP == Reduce::Max) return kf_max(a, b);
  else if constexpr (OP == Reduce::Min) return kf_min(a, b);
  else return a + b;
}

#if KF_ISA >= KF_ISA_AVX512
// combine<OP> on 16 float lanes, with kf_max / kf_min's NaN and tie rules.
template <Reduce OP>
inline __m512 combine16(__m512 a, __m512 b) {
  if constexpr (OP == Reduce::Sum) return _mm512_add_ps(a, b);
  constexpr int CMP = OP == Reduce::Max ? _CMP_GT_OQ : _CMP_LT_OQ;
  const __mmask16 keep_a = _mm512_cmp_ps_mask(a, b, CMP) | _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
  return _mm512_mask_blend_ps(keep_a, b, a);
}

// Rows o0..o0+15 of a float [OUTER][N] tile (INNER == 1), their results in out[16].
template <Reduce OP, int N>
inline void reduce_rows16(const float* __restrict__ s, float* out) {
  constexpr int N16 = N / 16 * 16;
  __m512 acc;
  for (int n0 = 0; n0 < N16; n0 += 16) {
    __m512i r[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(s + int64_t(i) * N + n0);
    transpose16(r);  // r[j] lane i = row i, column n0 + j
    int j = 0;
    if (n0 == 0) acc = _mm512_castsi512_ps(r[j++]);  // the first element as it is, as the scalar loop
    for (; j < 16; ++j) acc = combine16<OP>(acc, _mm512_castsi512_ps(r[j]));
  }
  _mm512_storeu_ps(out, acc);
  for (int i = 0; i < 16; ++i)
    for (int n = N16; n < N; ++n) out[i] = combine<OP>(out[i], s[int64_t(i) * N + n]);
}
#endif

// dst[o][i] = op over n of src[o][n][i]; with CLEAR false, dst = op(dst, that).
template <Reduce OP, int OUTER, int N, int INNER, bool CLEAR, class C, class S, class D>
inline void reduce(const S* __restrict__ src, D* __restrict__ dst) {
  constexpr int CHUNK = INNER < 256 ? INNER : 256;
  int o = 0;
#if KF_ISA >= KF_ISA_AVX512
  if constexpr (INNER == 1 && N >= 16 && std::is_same_v<S, float> && std::is_same_v<C, float>)
    for (; o + 16 <= OUTER; o += 16) {
      float acc[16];
      reduce_rows16<OP, N>(src + int64_t(o) * N, acc);
      for (int i = 0; i < 16; ++i)
        dst[o + i] = store_as<D>(CLEAR ? acc[i] : combine<OP>(load_as<C>(dst[o + i]), acc[i]));
    }
#endif
  for (; o < OUTER; ++o) {
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
