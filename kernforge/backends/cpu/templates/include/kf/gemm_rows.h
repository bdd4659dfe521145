// A few-row bf16 GEMM that reads K-major A and B in place: C (+)= A @ B for M <= kFewRows.
//
// The nt case (A's rows and B's columns both contiguous along K: a grouped GEMM's expert rows
// against the expert's [N, K] weights) normally goes through gemm_bf16_nt, which transposes the
// whole B tile into (k, k+1) pair panels on every call.  That pays for itself over a 128-row tile,
// but a decode-sized tile (a masked group's or a small expert's handful of rows) spends as long
// packing B as multiplying it (G 4 x 9 rows, N = K = 2048: 0.81x torch's loop).  Here each output
// element is a dot product of two contiguous K vectors: VDPBF16PS multiplies 32 bf16 of A's row by
// 32 of B's column (the pairs line up as they lie), so nothing is packed, and a 16-lane accumulator
// per output is reduced once per call.  A register block holds 16 accumulators, MR rows x NC columns
// (4 x 4, 2 x 8; a single row 1 x 8 with two chains along K): MR + NC loads feed 16 VDPBF16PS, and
// the 16 reductions share one 45-instruction transpose-add (reduce16), whose lane j is accumulator j.
//
// Included by gemm.h (KF_ISA and the intrinsics are defined there), which dispatches here from
// gemm_bf16_nt when bf16_rows_applies.  Same arithmetic as the other VDPBF16PS kernels (pairs
// multiplied exactly, float32 accumulation), in a different summation order (16 partial sums along
// K, then a tree): a row's bits therefore depend on whether its nt GEMM has at most kFewRows rows.
// The engine's batch-invariant GEMMs are the nn ones (B row-major), which do not come here.
#pragma once

namespace kf {

#if KF_ISA >= KF_ISA_AVX512BF16
// Up to this many rows the dot-product form beats packing B: M x 128 x 512 calls over a 2048 x 2048
// bf16 expert ran 3.9x (M = 1), 3.2x (4), 1.8x (9), 1.4x (16), 1.16x (32) and 1.0x (48)
// gemm_bf16_nt's speed on one Zen 4 core.
inline constexpr int kFewRows = 32;

// gemm_bf16_nt's operands (bf16 A and B, float accumulation, B_RS == 1) with few rows, A's rows
// contiguous along K.
template <int M, int A_CS>
inline constexpr bool bf16_rows_applies = M <= kFewRows && A_CS == 1;

// 32 bf16 from p, those past REM (< 32) zero: a K tail never reads past the row.
template <int REM>
inline __m512bh load_k32(const kf_bf16* p) {
  if constexpr (REM >= 32)
    return (__m512bh)_mm512_loadu_si512(p);
  else
    return (__m512bh)_mm512_maskz_loadu_epi16(__mmask32((1u << REM) - 1u), p);
}

// v[j]'s 16 lanes summed into lane j of the result.
inline __m512 reduce16(__m512 (&v)[16]) {
  __m512 t[8], u[4];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i)  // per 128-bit lane: (a0+a2, b0+b2, a1+a3, b1+b3)
    t[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {  // per 128-bit lane: the lane's sums of v[4i .. 4i+3]
    const __m512d x = _mm512_castps_pd(t[2 * i]), y = _mm512_castps_pd(t[2 * i + 1]);
    u[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  // fold the four 128-bit lanes: u[q]'s lane sums end in 128-bit lane q
  const __m512 w0 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x88), _mm512_shuffle_f32x4(u[0], u[1], 0xdd));
  const __m512 w1 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x88), _mm512_shuffle_f32x4(u[2], u[3], 0xdd));
  return _mm512_add_ps(_mm512_shuffle_f32x4(w0, w1, 0x88), _mm512_shuffle_f32x4(w0, w1, 0xdd));
}

// Accumulator chains along K per output: two for a single row (1 x 8 x 2), else one.  A 1 x 16 block
// would stream 16 B rows at once, and at a power-of-two K their addresses share one L1 set (16
// lines in an 8-way set: M = 1 ran at half the speed of M = 2).
template <int MR>
inline constexpr int kRowsChains = MR == 1 ? 2 : 1;
template <int MR>
inline constexpr int kRowsCols = 16 / (MR * kRowsChains<MR>);

// C[MR x NCOLS] (+)= A[MR x K] . B[NCOLS x K]^T; accumulator (s * MR + r) * NC + c is chain s of (row r,
// column c), chain s taking the 32-wide K steps s, s + S, ...
template <int MR, int NCOLS, int K, int A_RS, int B_CS, int C_RS, int C_CS, bool CLEAR, class CS>
inline void bf16_rows_block(const kf_bf16* __restrict__ a, const kf_bf16* __restrict__ b, CS* __restrict__ c,
                            const kf_bf16* pf) {
  constexpr int S = kRowsChains<MR>, NC = kRowsCols<MR>, KS = K / (32 * S) * (32 * S), R = K - KS;
  static_assert(S * MR * NC == 16 && NCOLS >= 1 && NCOLS <= NC, "a block is 16 accumulators");
  __m512 acc[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
  auto step = [&](int k, auto chain, auto rem) {
    constexpr int REM = decltype(rem)::value, s = decltype(chain)::value;
    __m512bh av[MR];
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) av[r] = load_k32<REM>(a + int64_t(r) * A_RS + k);
#pragma GCC unroll 16
    for (int j = 0; j < NCOLS; ++j) {
      const __m512bh bv = load_k32<REM>(b + int64_t(j) * B_CS + k);
      if (pf) _mm_prefetch(reinterpret_cast<const char*>(pf + int64_t(j) * B_CS + k), _MM_HINT_T1);
#pragma GCC unroll 4
      for (int r = 0; r < MR; ++r) {
        __m512& x = acc[(s * MR + r) * NC + j];
        x = _mm512_dpbf16_ps(x, av[r], bv);
      }
    }
  };
  using I0 = std::integral_constant<int, 0>;
  using I1 = std::integral_constant<int, 1>;
  using I32 = std::integral_constant<int, 32>;
  for (int k = 0; k < KS; k += 32 * S) {
    step(k, I0{}, I32{});
    if constexpr (S == 2) step(k + 32, I1{}, I32{});
  }
  if constexpr (R > 32) {  // S == 2: a whole step on chain 0, the rest on chain 1
    step(KS, I0{}, I32{});
    step(KS + 32, I1{}, std::integral_constant<int, R - 32>{});
  } else if constexpr (R > 0) {
    step(KS, I0{}, std::integral_constant<int, R>{});
  }
  alignas(64) float out[16];
  _mm512_store_ps(out, reduce16(acc));
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r) {
    CS* row = c + int64_t(r) * C_RS;
#pragma GCC unroll 16
    for (int j = 0; j < NCOLS; ++j) {
      float sum = out[r * NC + j];
      if constexpr (S == 2) sum += out[MR * NC + r * NC + j];
      const float old = CLEAR ? 0.0f : load_as<float>(row[j * C_CS]);
      row[j * C_CS] = store_as<CS>(CLEAR ? sum : old + sum);
    }
  }
}

// W (<= 16) columns of MR rows: blocks of kRowsCols<MR> columns, the last one narrower.
template <int MR, int W, int K, int A_RS, int B_CS, int C_RS, int C_CS, bool CLEAR, class CS>
inline void bf16_rows_strip(const kf_bf16* __restrict__ a, const kf_bf16* __restrict__ b, CS* __restrict__ c,
                            const kf_bf16* pf) {
  constexpr int NC = kRowsCols<MR>, FULL = W / NC * NC;
#pragma GCC unroll 4
  for (int j = 0; j < FULL; j += NC)
    bf16_rows_block<MR, NC, K, A_RS, B_CS, C_RS, C_CS, CLEAR>(a, b + int64_t(j) * B_CS, c + int64_t(j) * C_CS,
                                                              pf ? pf + int64_t(j) * B_CS : nullptr);
  if constexpr (W % NC)
    bf16_rows_block<MR, W % NC, K, A_RS, B_CS, C_RS, C_CS, CLEAR>(a, b + int64_t(FULL) * B_CS, c + int64_t(FULL) * C_CS,
                                                                  pf ? pf + int64_t(FULL) * B_CS : nullptr);
}

// W columns of all M rows: 4-row strips, then a 2- and a 1-row remainder; the first prefetches ``pf``'s
// rows (nullptr: none).
template <int M, int W, int K, int A_RS, int B_CS, int C_RS, int C_CS, bool CLEAR, class CS>
inline void bf16_rows_columns(const kf_bf16* __restrict__ A, const kf_bf16* __restrict__ b, CS* __restrict__ c,
                              const kf_bf16* pf) {
  constexpr int M4 = M / 4 * 4;
  for (int i0 = 0; i0 < M4; i0 += 4)
    bf16_rows_strip<4, W, K, A_RS, B_CS, C_RS, C_CS, CLEAR>(A + int64_t(i0) * A_RS, b, c + int64_t(i0) * C_RS,
                                                             i0 == 0 ? pf : nullptr);
  if constexpr (M % 4 >= 2)
    bf16_rows_strip<2, W, K, A_RS, B_CS, C_RS, C_CS, CLEAR>(A + int64_t(M4) * A_RS, b, c + int64_t(M4) * C_RS,
                                                             M4 == 0 ? pf : nullptr);
  if constexpr (M % 2)
    bf16_rows_strip<1, W, K, A_RS, B_CS, C_RS, C_CS, CLEAR>(A + int64_t(M - 1) * A_RS, b,
                                                             c + int64_t(M - 1) * C_RS, M == 1 ? pf : nullptr);
}

// A (i, k) at A[i * A_RS + k], B (k, n) at B[n * B_CS + k], C (i, j) at C[i * C_RS + j * C_CS].
// 16-column groups outermost: their 16 B rows (K * 32 bytes) are read from memory once and stay in
// L1 while every row strip passes over them, with A's few rows.  A decode tile streams B from
// memory in short runs (K * 2 bytes of each of 16 rows), too short for the hardware prefetchers to
// ramp up, so the first strip prefetches the next group's rows into L2 as it reads its own (G 8 x 9
// rows, N = K = 2048, 64 MB of weights: 10.5 -> 7.4 ms, torch's loop 8.3; in-cache calls lose 2-10%).
template <int M, int N, int K, int A_RS, int B_CS, int C_RS, int C_CS, bool CLEAR, class CS>
inline void gemm_bf16_rows(const kf_bf16* __restrict__ A, const kf_bf16* __restrict__ B, CS* __restrict__ C) {
  static_assert(M >= 1 && M <= kFewRows, "the few-row kernel takes 1 to kFewRows rows");
  constexpr int FULL = N / 16 * 16;
  for (int j0 = 0; j0 < FULL; j0 += 16)
    bf16_rows_columns<M, 16, K, A_RS, B_CS, C_RS, C_CS, CLEAR>(A, B + int64_t(j0) * B_CS, C + int64_t(j0) * C_CS,
                                                              j0 + 32 <= N ? B + int64_t(j0 + 16) * B_CS : nullptr);
  if constexpr (N % 16)
    bf16_rows_columns<M, N % 16, K, A_RS, B_CS, C_RS, C_CS, CLEAR>(A, B + int64_t(FULL) * B_CS,
                                                                  C + int64_t(FULL) * C_CS, nullptr);
}
#endif

}  // namespace kf
