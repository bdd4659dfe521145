// The tile GEMM: C (+)= A @ B on on-chip tiles, with a blocked register micro-kernel.
//
// Element (i, k) of A is A[i * A_RS + k * A_CS] (the renderer swaps the strides
// for a transposed operand), likewise B (k, j) and C (i, j), so one routine
// serves every layout and transpose.  Operands are packed once per call into
// compute-type panels (float for fp32/fp16/bf16/fp8, int32 for int8, double for
// fp64) padded with zeros to whole MR x NR register tiles; the micro-kernel
// keeps an MR x NR block of C in vector registers and streams K with FMAs.
// Accumulation is in the compute type, k in order 0..K-1 per element, then added
// to C's old value once (clear_accum skips that) and rounded once on store.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__AVX512F__) || defined(__AVX2__) || defined(__FMA__)
#include <immintrin.h>
#endif

#include "convert.h"

namespace kf {

#if defined(__AVX512F__)
inline constexpr int kVecBytes = 64;
#elif defined(__AVX__)
inline constexpr int kVecBytes = 32;
#else
inline constexpr int kVecBytes = 16;
#endif

template <class T>
struct GemmShape {
  typedef T vec __attribute__((vector_size(kVecBytes)));
  static constexpr int L = kVecBytes / int(sizeof(T));  // lanes per vector
  static constexpr int MR = 6;
};

template <class T, int M, int N>
struct GemmTile {
  static constexpr int L = GemmShape<T>::L;
  static constexpr int MR = GemmShape<T>::MR;
  static constexpr int NR = N <= L ? L : 2 * L;
  static constexpr int MP = (M + MR - 1) / MR * MR;
  static constexpr int NP = (N + NR - 1) / NR * NR;
};

// Bytes of packing scratch one gemm call needs (the renderer sizes the arena with it).
template <class T, int M, int N, int K>
inline constexpr size_t gemm_scratch_bytes() {
  using G = GemmTile<T, M, N>;
  return (size_t(G::MP) * K + size_t(K) * G::NP) * sizeof(T) + 64;
}

template <class V>
inline V fma(V a, V b, V c) {
#if defined(__AVX512F__)
  if constexpr (sizeof(V) == 64 && std::is_same_v<decltype(a[0] + 0), float>)
    return (V)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
  if constexpr (sizeof(V) == 64 && std::is_same_v<decltype(a[0] + 0), double>)
    return (V)_mm512_fmadd_pd((__m512d)a, (__m512d)b, (__m512d)c);
#elif defined(__FMA__)
  if constexpr (sizeof(V) == 32 && std::is_same_v<decltype(a[0] + 0), float>)
    return (V)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
  if constexpr (sizeof(V) == 32 && std::is_same_v<decltype(a[0] + 0), double>)
    return (V)_mm256_fmadd_pd((__m256d)a, (__m256d)b, (__m256d)c);
#endif
  return a * b + c;
}

// One MR x NR block of C from K-major panels ap[K][MR] and bp[K][NR].
template <class T, int M, int N, int K, int C_RS, int C_CS, bool CLEAR, class CS>
inline void gemm_block(const T* __restrict__ ap, const T* __restrict__ bp, CS* __restrict__ C, int i0, int j0) {
  using S = GemmShape<T>;
  using G = GemmTile<T, M, N>;
  using V = typename S::vec;
  constexpr int NV = G::NR / S::L;
  V acc[S::MR][NV];
#pragma GCC unroll 16
  for (int r = 0; r < S::MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = V{};
  for (int k = 0; k < K; ++k) {
    V b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) std::memcpy(&b[v], bp + size_t(k) * G::NR + v * S::L, sizeof(V));
#pragma GCC unroll 16
    for (int r = 0; r < S::MR; ++r) {
      const V a = V{} + ap[size_t(k) * S::MR + r];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = fma(a, b[v], acc[r][v]);
    }
  }
  for (int r = 0; r < S::MR; ++r) {
    const int i = i0 + r;
    if (i >= M) break;
    T out[G::NR];
    std::memcpy(out, acc[r], sizeof(out));
    const int w = N - j0 < G::NR ? N - j0 : G::NR;
    CS* c = C + int64_t(i) * C_RS + int64_t(j0) * C_CS;
    for (int j = 0; j < w; ++j) {
      const T old = CLEAR ? T(0) : load_as<T>(c[j * C_CS]);
      c[j * C_CS] = store_as<CS>(CLEAR ? out[j] : T(old + out[j]));
    }
  }
}

// C (+)= A @ B with A: M x K, B: K x N, C: M x N, accumulating in T.
template <class T, int M, int N, int K, int A_RS, int A_CS, int B_RS, int B_CS, int C_RS, int C_CS,
          bool CLEAR, class AS, class BS, class CS>
inline void gemm(const AS* __restrict__ A, const BS* __restrict__ B, CS* __restrict__ C, char* scratch) {
  using S = GemmShape<T>;
  using G = GemmTile<T, M, N>;
  T* ap = reinterpret_cast<T*>((reinterpret_cast<uintptr_t>(scratch) + 63) & ~uintptr_t(63));
  T* bp = ap + size_t(G::MP) * K;
  for (int ib = 0; ib < G::MP / S::MR; ++ib)
    for (int k = 0; k < K; ++k)
      for (int r = 0; r < S::MR; ++r) {
        const int i = ib * S::MR + r;
        ap[(size_t(ib) * K + k) * S::MR + r] = i < M ? load_as<T>(A[int64_t(i) * A_RS + int64_t(k) * A_CS]) : T(0);
      }
  for (int jb = 0; jb < G::NP / G::NR; ++jb)
    for (int k = 0; k < K; ++k)
      for (int c = 0; c < G::NR; ++c) {
        const int j = jb * G::NR + c;
        bp[(size_t(jb) * K + k) * G::NR + c] = j < N ? load_as<T>(B[int64_t(k) * B_RS + int64_t(j) * B_CS]) : T(0);
      }
  for (int ib = 0; ib < G::MP / S::MR; ++ib)
    for (int jb = 0; jb < G::NP / G::NR; ++jb)
      gemm_block<T, M, N, K, C_RS, C_CS, CLEAR>(ap + size_t(ib) * K * S::MR, bp + size_t(jb) * K * G::NR, C,
                                                ib * S::MR, jb * G::NR);
}

}  // namespace kf
