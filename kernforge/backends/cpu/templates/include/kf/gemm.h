// The tile GEMM: C (+)= A @ B on on-chip tiles, with blocked register micro-kernels.
//
// Element (i, k) of A is A[i * A_RS + k * A_CS] (the renderer swaps the strides
// for a transposed operand), likewise B (k, j) and C (i, j), so one routine
// serves every layout and transpose.  Two ways in:
//
// * direct: when A and B already hold the compute type and B's rows are
//   contiguous along N (B_CS == 1, N a multiple of the vector width), the
//   micro-kernel reads the tiles where they are: A by broadcasts at any
//   stride, B by vector loads.  The CPU pipeline's layout pass
//   (codegen/passes/gemm_layout.py) gives operand tiles that layout (and the
//   compute type) at the T.copy that fills them, so no call packs.  Under
//   AVX512-BF16 bf16 x bf16 tiles are read in place too (gemm_bf16_direct): B's
//   (k, k+1) pairs for VDPBF16PS are interleaved in registers as B is loaded; a
//   many-row GEMM's B read from global memory is packed into pair panels straight
//   from its rows instead (gemm_bf16_nn), which replaces the tile copy.
// * packed: otherwise both operands are packed per call into zero-padded
//   compute-type panels (float for fp32/fp16/bf16/fp8, int32 for int8, double
//   for fp64); under AVX512-BF16 bf16/fp8 operands become (k, k+1) pairs for
//   VDPBF16PS.
//
// The micro-kernel keeps an MR x NV-vector block of C in registers and streams
// K with FMAs, k in order 0..K-1 per element; the block is then added to C's old
// value once (clear_accum skips that) and rounded once on store.  Both ways give
// the same bits.
//
// The instruction set is KF_ISA, which the renderer defines from the target
// (Target.arch: "generic", "avx2", "avx512", "avx512bf16"), so a lower path can
// be forced on a machine that has a higher one (KERNFORGE_CPU_ISA) and every
// path is testable there.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#define KF_ISA_GENERIC 0
#define KF_ISA_AVX2 1
#define KF_ISA_AVX512 2
#define KF_ISA_AVX512BF16 3
#define KF_ISA_AMX 4

#ifndef KF_ISA
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define KF_ISA KF_ISA_AMX
#elif defined(__AVX512BF16__)
#define KF_ISA KF_ISA_AVX512BF16
#elif defined(__AVX512F__)
#define KF_ISA KF_ISA_AVX512
#elif defined(__AVX2__) && defined(__FMA__)
#define KF_ISA KF_ISA_AVX2
#else
#define KF_ISA KF_ISA_GENERIC
#endif
#endif

#if KF_ISA >= KF_ISA_AMX && !(defined(__AMX_TILE__) && defined(__AMX_BF16__)) && !defined(KF_AMX_EMULATE)
#error "KF_ISA selects AMX-BF16 but the compiler does not target it (-mamx-tile -mamx-bf16)"
#endif
#if KF_ISA >= KF_ISA_AVX512BF16 && !defined(__AVX512BF16__)
#error "KF_ISA selects AVX512-BF16 but the compiler does not target it (-mavx512bf16)"
#endif
#if KF_ISA >= KF_ISA_AVX512 && !defined(__AVX512F__)
#error "KF_ISA selects AVX-512 but the compiler does not target it (-mavx512f)"
#endif
#if KF_ISA >= KF_ISA_AVX2 && !(defined(__AVX2__) && defined(__FMA__))
#error "KF_ISA selects AVX2/FMA but the compiler does not target it (-mavx2 -mfma)"
#endif

#if KF_ISA >= KF_ISA_AVX2
#include <immintrin.h>
#endif

#include "convert.h"
#include "gemm_rows.h"  // few-row bf16 nt GEMM reading A and B in place (gemm_bf16_nt dispatches)

namespace kf {

#if KF_ISA >= KF_ISA_AVX512
inline constexpr int kVecBytes = 64;
inline constexpr int kVecRegs = 32;
#elif KF_ISA >= KF_ISA_AVX2
inline constexpr int kVecBytes = 32;
inline constexpr int kVecRegs = 16;
#else
inline constexpr int kVecBytes = 16;
inline constexpr int kVecRegs = 16;
#endif

template <class T>
struct GemmShape {
  typedef T vec __attribute__((vector_size(kVecBytes)));
  static constexpr int L = kVecBytes / int(sizeof(T));  // lanes per vector
};

// Rows per register block: 8 x 3 zmm on AVX-512, 6 x 2 ymm on AVX2 (12 accumulators,
// 2 B vectors and a broadcast fill the 16 registers; 8 rows would spill), or all of M
// when M is smaller, so a decode-sized M is not padded.
inline constexpr int kDirectRows = kVecRegs == 32 ? 8 : 6;
template <int M>
inline constexpr int kRowBlock = M < kDirectRows ? M : kDirectRows;

template <class T, int M, int N>
struct GemmTile {
  static constexpr int L = GemmShape<T>::L;
  static constexpr int MR = kRowBlock<M>;
  static constexpr int NR = N <= L ? L : 2 * L;
  static constexpr int MP = (M + MR - 1) / MR * MR;
  static constexpr int NP = (N + NR - 1) / NR * NR;
};

// Bytes of packing scratch one gemm call needs (the renderer sizes the arena with it).
template <class T, int M, int N, int K>
inline constexpr size_t gemm_scratch_bytes() {
  using G = GemmTile<T, M, N>;
  constexpr int MR = kRowBlock<M>, W = (kVecRegs - 1) / (MR + 1) < 8 ? (kVecRegs - 1) / (MR + 1) : 8;
  constexpr size_t NPW = size_t(N + W * G::L - 1) / (W * G::L) * (W * G::L);  // B-only panels (direct_b_packed)
  constexpr size_t NP = NPW > size_t(G::NP) ? NPW : size_t(G::NP);
  constexpr size_t NT = size_t((K + 1) / 2) * size_t((N + 63) / 64 * 64) * 4;  // B pairs (gemm_bf16_nt)
  constexpr size_t BYTES = (size_t(G::MP) * K + size_t(K) * NP) * sizeof(T);
  // AMX (gemm_amx_bf16): A and B packed into zero-padded 16-row / 32-deep tiles, one C tile
  constexpr size_t AMX = size_t((M + 15) / 16 * 16) * ((K + 31) / 32 * 32) * 2 +
                         size_t((K + 31) / 32 * 16) * ((N + 15) / 16 * 16) * 4 + 16 * 16 * 4 + 64;
  constexpr size_t MOST = BYTES > NT ? (BYTES > AMX ? BYTES : AMX) : (NT > AMX ? NT : AMX);
  return MOST + 128;
}

template <class V>
inline V fma(V a, V b, V c) {
#if KF_ISA >= KF_ISA_AVX512
  if constexpr (sizeof(V) == 64 && std::is_same_v<decltype(a[0] + 0), float>)
    return (V)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
  if constexpr (sizeof(V) == 64 && std::is_same_v<decltype(a[0] + 0), double>)
    return (V)_mm512_fmadd_pd((__m512d)a, (__m512d)b, (__m512d)c);
#endif
#if KF_ISA >= KF_ISA_AVX2
  if constexpr (sizeof(V) == 32 && std::is_same_v<decltype(a[0] + 0), float>)
    return (V)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
  if constexpr (sizeof(V) == 32 && std::is_same_v<decltype(a[0] + 0), double>)
    return (V)_mm256_fmadd_pd((__m256d)a, (__m256d)b, (__m256d)c);
#endif
  return a * b + c;
}

// All lanes = *x.  (Not `V{} + *x`: adding +0.0 is not an identity for -0.0, so the
// compiler must emit the add, one more instruction per broadcast.)
template <class V, class T>
inline V broadcast(const T* x) {
#if KF_ISA >= KF_ISA_AVX512
  if constexpr (sizeof(V) == 64 && std::is_same_v<T, float>) return (V)_mm512_set1_ps(*x);
  if constexpr (sizeof(V) == 64 && std::is_same_v<T, double>) return (V)_mm512_set1_pd(*x);
#endif
#if KF_ISA >= KF_ISA_AVX2
  if constexpr (sizeof(V) == 32 && std::is_same_v<T, float>) return (V)_mm256_broadcast_ss(x);
  if constexpr (sizeof(V) == 32 && std::is_same_v<T, double>) return (V)_mm256_broadcast_sd(x);
#endif
  V v;
  for (size_t i = 0; i < sizeof(V) / sizeof(T); ++i) v[i] = *x;
  return v;
}

#if KF_ISA >= KF_ISA_AVX512
// 16 x 16 transpose of 32-bit words: r[i] lane j -> r[j] lane i.
inline void transpose16(__m512i (&r)[16]) {
  __m512i t[16];
#pragma GCC unroll 8
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  // r[4q + c], 128-bit lane L, now holds rows 4q..4q+3 of column 4L + c: gather column j = 4L + c
  // from lane L of r[c], r[c + 4], r[c + 8], r[c + 12]
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    const __m512i a = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88), b = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xdd);
    const __m512i c = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88), d = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xdd);
    t[i] = _mm512_shuffle_i32x4(a, c, 0x88);
    t[i + 8] = _mm512_shuffle_i32x4(a, c, 0xdd);
    t[i + 4] = _mm512_shuffle_i32x4(b, d, 0x88);
    t[i + 12] = _mm512_shuffle_i32x4(b, d, 0xdd);
  }
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) r[i] = t[i];
}

#endif

// Vectors per row of the direct register block for MR rows: as many as keep the
// MR * NV accumulators, the NV B vectors and one broadcast inside the register
// file (16 ymm on AVX2, 32 zmm on AVX-512), at most 8.  A short block (a decode
// GEMM's one row) thus gets a wide one, whose independent FMA chains hide the
// FMA latency that a 1 x 2 block would wait on.
template <int MR>
inline constexpr int kDirectVectors = (kVecRegs - 1) / (MR + 1) < 8 ? (kVecRegs - 1) / (MR + 1) : 8;

// C[MR x NV*L] (+)= A[MR x K] @ B[K x NV*L] straight from the tiles.
// NCOLS: the block's columns that exist in C (fewer than NV * L in a zero-padded last panel).
template <class T, int MR, int NV, int K, int A_RS, int A_CS, int B_RS, int C_RS, int C_CS, int NCOLS, bool CLEAR,
          class CS>
inline void direct_block(const T* __restrict__ a, const T* __restrict__ b, CS* __restrict__ c) {
  using S = GemmShape<T>;
  using V = typename S::vec;
  V acc[MR][NV];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[r][v] = V{};
  for (int k = 0; k < K; ++k) {
    V bv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) std::memcpy(&bv[v], b + int64_t(k) * B_RS + v * S::L, sizeof(V));
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const V av = broadcast<V>(a + int64_t(r) * A_RS + int64_t(k) * A_CS);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[r][v] = fma(av, bv[v], acc[r][v]);
    }
  }
  constexpr bool vector_store = std::is_same_v<CS, T> && C_CS == 1 && NCOLS == NV * S::L;
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    CS* row = c + int64_t(r) * C_RS;
    if constexpr (vector_store) {
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) {
        V out = acc[r][v];
        if constexpr (!CLEAR) {
          V old;
          std::memcpy(&old, row + v * S::L, sizeof(V));
          out = old + out;
        }
        std::memcpy(row + v * S::L, &out, sizeof(V));
      }
    } else {
      T out[NV * S::L];
      std::memcpy(out, acc[r], sizeof(out));
      for (int j = 0; j < NCOLS; ++j) {
        const T old = CLEAR ? T(0) : load_as<T>(row[j * C_CS]);
        row[j * C_CS] = store_as<CS>(CLEAR ? out[j] : T(old + out[j]));
      }
    }
  }
}

// The rows of one column panel [j0, j0 + NV*L) (NCOLS of them in C): full MR-row blocks, then the
// rest.  ``B`` points at the panel's first column.
template <class T, int M, int K, int NV, int NCOLS, int A_RS, int A_CS, int B_RS, int C_RS, int C_CS, bool CLEAR,
          class CS>
inline void direct_panel(const T* __restrict__ A, const T* __restrict__ b, CS* __restrict__ C, int j0) {
  constexpr int MR = kDirectRows < M ? kDirectRows : M;
  constexpr int NVR = NV < kDirectVectors<MR> ? NV : kDirectVectors<MR>;
  static_assert(NVR == NV, "a panel is as wide as its row block can hold");
  CS* c = C + int64_t(j0) * C_CS;
  int i0 = 0;
  for (; i0 + MR <= M; i0 += MR)
    direct_block<T, MR, NV, K, A_RS, A_CS, B_RS, C_RS, C_CS, NCOLS, CLEAR>(A + int64_t(i0) * A_RS, b,
                                                                            c + int64_t(i0) * C_RS);
  if constexpr (M % MR != 0)
    direct_block<T, M % MR, NV, K, A_RS, A_CS, B_RS, C_RS, C_CS, NCOLS, CLEAR>(A + int64_t(i0) * A_RS, b,
                                                                                c + int64_t(i0) * C_RS);
}

// Whether the direct way applies: operands in the compute type and B contiguous along N
// in whole vectors.
template <class T, int N, int B_CS, class AS, class BS>
inline constexpr bool direct_gemm_applies =
    std::is_same_v<AS, T> && std::is_same_v<BS, T> && (std::is_same_v<T, float> || std::is_same_v<T, double>) &&
    B_CS == 1 && N % GemmShape<T>::L == 0;

template <class T, int M, int N, int K, int A_RS, int A_CS, int B_RS, int C_RS, int C_CS, bool CLEAR, class CS>
inline void gemm_direct(const T* __restrict__ A, const T* __restrict__ B, CS* __restrict__ C) {
  constexpr int L = GemmShape<T>::L;
  constexpr int MR = kDirectRows < M ? kDirectRows : M;
  constexpr int NV = kDirectVectors<MR> < N / L ? kDirectVectors<MR> : N / L;
  constexpr int W = NV * L, FULL = N / W * W, TAIL = (N - FULL) / L;
  // Column panels outermost: a K x W panel of B stays in L1 while the row blocks pass.
  for (int j0 = 0; j0 < FULL; j0 += W)
    direct_panel<T, M, K, NV, W, A_RS, A_CS, B_RS, C_RS, C_CS, CLEAR>(A, B + j0, C, j0);
  if constexpr (TAIL > 0)
    direct_panel<T, M, K, TAIL, TAIL * L, A_RS, A_CS, B_RS, C_RS, C_CS, CLEAR>(A, B + FULL, C, FULL);
}

// One MR x NR block of C from K-major panels ap[K][MR] and bp[K][NR].
template <class T, int M, int N, int K, int C_RS, int C_CS, bool CLEAR, class CS>
inline void gemm_block(const T* __restrict__ ap, const T* __restrict__ bp, CS* __restrict__ C, int i0, int j0) {
  using S = GemmShape<T>;
  using G = GemmTile<T, M, N>;
  using V = typename S::vec;
  constexpr int NV = G::NR / S::L;
  V acc[G::MR][NV];
#pragma GCC unroll 16
  for (int r = 0; r < G::MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = V{};
  for (int k = 0; k < K; ++k) {
    V b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) std::memcpy(&b[v], bp + size_t(k) * G::NR + v * S::L, sizeof(V));
#pragma GCC unroll 16
    for (int r = 0; r < G::MR; ++r) {
      const V a = broadcast<V>(ap + size_t(k) * G::MR + r);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = fma(a, b[v], acc[r][v]);
    }
  }
  for (int r = 0; r < G::MR; ++r) {
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

// Packs X (element (r, k) at X[r * RS + k * CS], ROWS x COLS) into panels of P rows,
// out[panel][k][p], converted to T; rows past ROWS are zero.  The full-panel loops
// have constant trip counts and no per-element bounds test.
template <class T, int ROWS, int COLS, int P, int RS, int CS, class S>
inline void pack_panels(const S* __restrict__ X, T* __restrict__ out) {
  constexpr int PANELS = (ROWS + P - 1) / P;
  for (int pb = 0; pb < PANELS; ++pb) {
    T* o = out + size_t(pb) * COLS * P;
    const S* x = X + int64_t(pb) * P * RS;
    if ((pb + 1) * P <= ROWS) {
      for (int k = 0; k < COLS; ++k)
#pragma GCC unroll 8
        for (int p = 0; p < P; ++p) o[k * P + p] = load_as<T>(x[int64_t(p) * RS + int64_t(k) * CS]);
    } else {
      const int rows = ROWS - pb * P;
      std::memset(o, 0, sizeof(T) * COLS * P);
      for (int k = 0; k < COLS; ++k)
        for (int p = 0; p < rows; ++p) o[k * P + p] = load_as<T>(x[int64_t(p) * RS + int64_t(k) * CS]);
    }
  }
}

// The bf16 bits of a value that bf16 holds exactly: bf16 itself, and fp8 e4m3
// (3 mantissa bits, exponents well inside bf16's range).
struct Fp8ToBf16 {
  uint16_t bits[256] = {};
  constexpr Fp8ToBf16() {
    for (int i = 0; i < 256; ++i) bits[i] = uint16_t(kf_float_bits(kf_to_float(kf_fp8e4m3{uint8_t(i)})) >> 16);
  }
};
inline constexpr Fp8ToBf16 kFp8ToBf16{};

inline constexpr uint32_t bf16_bits(kf_bf16 x) { return kf_bits(x); }
inline constexpr uint32_t bf16_bits(kf_fp8e4m3 x) { return kFp8ToBf16.bits[kf_bits(x)]; }

// As pack_panels, as bf16 with (k, k+1) pairs in one 32-bit word (k even in the low
// half) for VDPBF16PS; an odd COLS is padded with a zero k.
template <int ROWS, int COLS, int P, int RS, int CS, class S>
inline void pack_bf16_pairs(const S* __restrict__ X, uint32_t* __restrict__ out) {
  constexpr int PANELS = (ROWS + P - 1) / P, K2 = (COLS + 1) / 2;
  for (int pb = 0; pb < PANELS; ++pb) {
    uint32_t* o = out + size_t(pb) * K2 * P;
    const S* x = X + int64_t(pb) * P * RS;
    const int rows = (pb + 1) * P <= ROWS ? P : ROWS - pb * P;
    if (rows < P || COLS % 2) std::memset(o, 0, sizeof(uint32_t) * K2 * P);
    for (int kk = 0; kk < COLS / 2; ++kk)
      for (int p = 0; p < rows; ++p)
        o[kk * P + p] = bf16_bits(x[int64_t(p) * RS + int64_t(2 * kk) * CS]) |
                        (bf16_bits(x[int64_t(p) * RS + int64_t(2 * kk + 1) * CS]) << 16);
    if (COLS % 2)
      for (int p = 0; p < rows; ++p) o[(K2 - 1) * P + p] = bf16_bits(x[int64_t(p) * RS + int64_t(COLS - 1) * CS]);
  }
}

// Stores an MR x NR block of float accumulators into C (plus C's old value unless CLEAR).
template <int M, int N, int NR, int C_RS, int C_CS, bool CLEAR, class CS>
inline void store_block(const float* out, CS* __restrict__ C, int i, int j0) {
  const int w = N - j0 < NR ? N - j0 : NR;
  CS* c = C + int64_t(i) * C_RS + int64_t(j0) * C_CS;
  for (int j = 0; j < w; ++j) {
    const float old = CLEAR ? 0.0f : load_as<float>(c[j * C_CS]);
    c[j * C_CS] = store_as<CS>(CLEAR ? out[j] : old + out[j]);
  }
}

#if KF_ISA >= KF_ISA_AVX512BF16
// bf16 (or fp8, widened exactly to bf16) -> fp32 with AVX512-BF16: VDPBF16PS
// multiplies pairs of bf16 along K exactly and adds both products into each fp32
// lane (round to nearest even; the instruction treats denormal inputs as zero and
// flushes denormal results).  Panels hold (k, k+1) pairs as 32-bit words.
template <int M, int N, int K, int A_RS, int A_CS, int B_RS, int B_CS, int C_RS, int C_CS, bool CLEAR, class AS,
          class BS, class CS>
inline void gemm_bf16(const AS* __restrict__ A, const BS* __restrict__ B, CS* __restrict__ C, char* scratch) {
  constexpr int MR = kRowBlock<M>, L = 16, NR = N <= L ? L : 2 * L, NV = NR / L;
  constexpr int MP = (M + MR - 1) / MR * MR, NP = (N + NR - 1) / NR * NR, K2 = (K + 1) / 2;
  uint32_t* ap = reinterpret_cast<uint32_t*>((reinterpret_cast<uintptr_t>(scratch) + 63) & ~uintptr_t(63));
  uint32_t* bp = ap + size_t(MP) * K2;
  pack_bf16_pairs<M, K, MR, A_RS, A_CS>(A, ap);
  pack_bf16_pairs<N, K, NR, B_CS, B_RS>(B, bp);
  for (int ib = 0; ib < MP / MR; ++ib)
    for (int jb = 0; jb < NP / NR; ++jb) {
      const uint32_t* a = ap + size_t(ib) * K2 * MR;
      const uint32_t* b = bp + size_t(jb) * K2 * NR;
      __m512 acc[MR][NV];
#pragma GCC unroll 16
      for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
      for (int kk = 0; kk < K2; ++kk) {
        __m512bh bv[NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) bv[v] = (__m512bh)_mm512_loadu_si512(b + size_t(kk) * NR + v * L);
#pragma GCC unroll 16
        for (int r = 0; r < MR; ++r) {
          const __m512bh av = (__m512bh)_mm512_set1_epi32(int(a[size_t(kk) * MR + r]));
#pragma GCC unroll 4
          for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
        }
      }
      for (int r = 0; r < MR; ++r) {
        const int i = ib * MR + r;
        if (i >= M) break;
        float out[NR];
        for (int v = 0; v < NV; ++v) _mm512_storeu_ps(out + v * L, acc[r][v]);
        store_block<M, N, NR, C_RS, C_CS, CLEAR>(out, C, i, jb * NR);
      }
    }
}
#endif

#if KF_ISA >= KF_ISA_AVX512BF16
// bf16 x bf16 -> fp32 read in place (no packing): B's rows k and k+1 are interleaved into
// (k, k+1) pairs in registers as they are loaded, A's (k, k+1) pair is one 32-bit broadcast.
// VPUNPCK{L,H}WD of 32 columns of rows k and k+1 gives two pair vectors whose columns are
// permuted within 128-bit lanes (lo: 0-3, 8-11, 16-19, 24-27; hi: 4-7, 12-15, 20-23, 28-31);
// the accumulators keep that order and are put back once, at the store.  A last vector of
// 16 columns (an odd NV) is built from two 256-bit unpacks (order 0-3, 8-11, 4-7, 12-15).
// Rows and vectors per register block: 8 x 3 zmm as on the float path (24 accumulators, 3 pair
// vectors and a broadcast in the 32 registers), or a decode block's few rows x 6-8 vectors.
// 8 x 2, 8 x 3, 6 x 4 and 12 x 2 all reached 460-490 GFLOP/s on a Zen 5 core in cache
// (benchmarks/bench_cpu_microkernel.py); 8 rows divide the power-of-two tiles and an 8-row
// decode block, where 6 rows left a 2-row remainder (-20%).  (The caller's B tile is bf16 and N-contiguous: the layout pass's orientation.)
inline constexpr int kBf16Rows = 8;
template <int MR>
inline constexpr int kBf16Vectors = MR <= 2 ? 8 : MR <= 4 ? 6 : 3;

// B's (k, k+1) pairs for NV vectors of columns from rows r0 and r1 (LAST: k + 1 is past K, its row reads as zero).
template <int NV, bool LAST>
inline void bf16_pairs(const kf_bf16* __restrict__ r0, const kf_bf16* __restrict__ r1, __m512bh* bv) {
#pragma GCC unroll 8
  for (int v = 0; v + 1 < NV; v += 2) {
    const __m512i x = _mm512_loadu_si512(r0 + v * 16);
    const __m512i y = LAST ? _mm512_setzero_si512() : _mm512_loadu_si512(r1 + v * 16);
    bv[v] = (__m512bh)_mm512_unpacklo_epi16(x, y);
    bv[v + 1] = (__m512bh)_mm512_unpackhi_epi16(x, y);
  }
  if constexpr (NV % 2) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r0 + (NV - 1) * 16));
    const __m256i y = LAST ? _mm256_setzero_si256() : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r1 + (NV - 1) * 16));
    bv[NV - 1] = (__m512bh)_mm512_inserti64x4(_mm512_zextsi256_si512(_mm256_unpacklo_epi16(x, y)),
                                              _mm256_unpackhi_epi16(x, y), 1);
  }
}

// A's (k, k+1) pair of row ``a`` (k + 1 past K when LAST: zero), k even, as a 32-bit word.
template <int A_CS, bool LAST>
inline uint32_t bf16_a_pair(const kf_bf16* __restrict__ a, int k) {
  if constexpr (LAST) return bf16_bits(a[int64_t(k) * A_CS]);
  if constexpr (A_CS == 1) {
    uint32_t w;
    std::memcpy(&w, a + k, sizeof(w));
    return w;
  }
  return bf16_bits(a[int64_t(k) * A_CS]) | (bf16_bits(a[int64_t(k + 1) * A_CS]) << 16);
}

template <int MR, int NV, int A_RS, int A_CS, int B_RS, bool LAST>
inline void bf16_step(const kf_bf16* __restrict__ a, const kf_bf16* __restrict__ b, int k, __m512 (&acc)[MR][NV]) {
  __m512bh bv[NV];
  bf16_pairs<NV, LAST>(b + int64_t(k) * B_RS, b + int64_t(LAST ? k : k + 1) * B_RS, bv);
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    const __m512bh av = (__m512bh)_mm512_set1_epi32(int(bf16_a_pair<A_CS, LAST>(a + int64_t(r) * A_RS, k)));
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
  }
}

template <int MR, int NV, int K, int A_RS, int A_CS, int B_RS, int C_RS, int C_CS, int NCOLS, bool CLEAR, class CS>
inline void bf16_direct_block(const kf_bf16* __restrict__ a, const kf_bf16* __restrict__ b, CS* __restrict__ c) {
  __m512 acc[MR][NV];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int k = 0; k + 1 < K; k += 2) bf16_step<MR, NV, A_RS, A_CS, B_RS, false>(a, b, k, acc);
  if constexpr (K % 2) bf16_step<MR, NV, A_RS, A_CS, B_RS, true>(a, b, K - 1, acc);
  // the lane each column's sum sits in, for a pair of vectors (0..31 over lo, hi) and a lone one
  const __m512i lo = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i hi = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  const __m512i half = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15);
  constexpr bool vector_store = std::is_same_v<CS, float> && C_CS == 1 && NCOLS == NV * 16;
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    __m512 out[NV];
#pragma GCC unroll 8
    for (int v = 0; v + 1 < NV; v += 2) {
      out[v] = _mm512_permutex2var_ps(acc[r][v], lo, acc[r][v + 1]);
      out[v + 1] = _mm512_permutex2var_ps(acc[r][v], hi, acc[r][v + 1]);
    }
    if constexpr (NV % 2) out[NV - 1] = _mm512_permutexvar_ps(half, acc[r][NV - 1]);
    CS* row = c + int64_t(r) * C_RS;
    if constexpr (vector_store) {
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v)
        _mm512_storeu_ps(row + v * 16, CLEAR ? out[v] : _mm512_add_ps(_mm512_loadu_ps(row + v * 16), out[v]));
    } else {
      float o[NV * 16];
      std::memcpy(o, out, sizeof(o));
      for (int j = 0; j < NCOLS; ++j) {
        const float old = CLEAR ? 0.0f : load_as<float>(row[j * C_CS]);
        row[j * C_CS] = store_as<CS>(CLEAR ? o[j] : old + o[j]);
      }
    }
  }
}

// Column panels of NV vectors outermost (a K x 16*NV panel of B stays in L1 while the row blocks
// pass), MR-row blocks inside, the last panel and the last row block narrower.
template <int M, int N, int K, int A_RS, int A_CS, int B_RS, int C_RS, int C_CS, bool CLEAR, class CS>
inline void gemm_bf16_direct(const kf_bf16* __restrict__ A, const kf_bf16* __restrict__ B, CS* __restrict__ C) {
  constexpr int MR = kBf16Rows < M ? kBf16Rows : M, NVMAX = kBf16Vectors<MR>;
  constexpr int NV = NVMAX < N / 16 ? NVMAX : N / 16, W = NV * 16, FULL = N / W * W, TAIL = (N - FULL) / 16;
  auto panel = [&](auto nv, int j0) {
    constexpr int V = decltype(nv)::value;
    int i0 = 0;
    for (; i0 + MR <= M; i0 += MR)
      bf16_direct_block<MR, V, K, A_RS, A_CS, B_RS, C_RS, C_CS, V * 16, CLEAR>(
          A + int64_t(i0) * A_RS, B + j0, C + int64_t(i0) * C_RS + int64_t(j0) * C_CS);
    if constexpr (M % MR != 0)
      bf16_direct_block<M % MR, V, K, A_RS, A_CS, B_RS, C_RS, C_CS, V * 16, CLEAR>(
          A + int64_t(i0) * A_RS, B + j0, C + int64_t(i0) * C_RS + int64_t(j0) * C_CS);
  };
  for (int j0 = 0; j0 < FULL; j0 += W) panel(std::integral_constant<int, NV>{}, j0);
  if constexpr (TAIL > 0) panel(std::integral_constant<int, TAIL>{}, FULL);
}

// bf16 x bf16 -> fp32 with B stored K-contiguous (B_RS == 1: a transposed row-major tile, the
// nt layout; MLA's Q K^T, whose KV tile the P V product reads N-contiguous, so the layout pass
// leaves it row-major).  A is read in place as in gemm_bf16_direct; B's 32-bit (k, k+1) words
// are already adjacent along K, so packing it into K2 x W pair panels is a transpose of 32-bit
// words, done 16 x 16 in registers (kf::transpose16), not the element loop of pack_bf16_pairs.
// The per-call A packing of gemm_bf16 is what this removes: Q (64 x 512) was re-packed for
// every 64-token KV tile.  Columns come out in order, so the store needs no permutation.

// B (element (k, n) at B[n * B_CS + k]) as K2 x W panels of (k, k+1) words, columns past N and
// the k past an odd K zero.  Whole 16-column x 32-k squares go through transpose16, the edges
// word by word.
template <int N, int K, int W, int B_CS>
inline void pack_bf16_nt(const kf_bf16* __restrict__ B, uint32_t* __restrict__ out) {
  constexpr int K2 = (K + 1) / 2, NP = (N + W - 1) / W * W, N16 = N / 16 * 16, KS = K / 32 * 32;
  auto word = [&](int n, int kk) -> uint32_t {
    if (n >= N) return 0;
    const kf_bf16* col = B + int64_t(n) * B_CS;
    return 2 * kk + 1 < K ? bf16_a_pair<1, false>(col, 2 * kk) : bf16_a_pair<1, true>(col, 2 * kk);
  };
  for (int n0 = 0; n0 < N16; n0 += 16) {
    uint32_t* o = out + size_t(n0 / W) * K2 * W + n0 % W;
    for (int k0 = 0; k0 < KS; k0 += 32) {
      __m512i r[16];
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(B + int64_t(n0 + i) * B_CS + k0);
      transpose16(r);
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) _mm512_storeu_si512(o + size_t(k0 / 2 + i) * W, r[i]);
    }
    for (int kk = KS / 2; kk < K2; ++kk)
      for (int i = 0; i < 16; ++i) o[size_t(kk) * W + i] = word(n0 + i, kk);
  }
  for (int n = N16; n < NP; ++n)
    for (int kk = 0; kk < K2; ++kk) out[size_t(n / W) * K2 * W + size_t(kk) * W + n % W] = word(n, kk);
}

template <int MR, int NV, int K, int A_RS, int A_CS, int C_RS, int C_CS, int NCOLS, bool CLEAR, class CS>
inline void bf16_nt_block(const kf_bf16* __restrict__ a, const uint32_t* __restrict__ bp, CS* __restrict__ c) {
  constexpr int K2 = (K + 1) / 2, W = NV * 16;
  __m512 acc[MR][NV];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  auto step = [&](int kk, auto last) {
    __m512bh bv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) bv[v] = (__m512bh)_mm512_loadu_si512(bp + size_t(kk) * W + v * 16);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const __m512bh av =
          (__m512bh)_mm512_set1_epi32(int(bf16_a_pair<A_CS, decltype(last)::value>(a + int64_t(r) * A_RS, 2 * kk)));
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
    }
  };
  for (int kk = 0; kk < K / 2; ++kk) step(kk, std::false_type{});
  if constexpr (K % 2) step(K2 - 1, std::true_type{});
  constexpr bool vector_store = std::is_same_v<CS, float> && C_CS == 1 && NCOLS == W;
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    CS* row = c + int64_t(r) * C_RS;
    if constexpr (vector_store) {
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v)
        _mm512_storeu_ps(row + v * 16, CLEAR ? acc[r][v] : _mm512_add_ps(_mm512_loadu_ps(row + v * 16), acc[r][v]));
    } else {
      float o[W];
      std::memcpy(o, acc[r], sizeof(o));
      for (int j = 0; j < NCOLS; ++j) {
        const float old = CLEAR ? 0.0f : load_as<float>(row[j * C_CS]);
        row[j * C_CS] = store_as<CS>(CLEAR ? o[j] : old + o[j]);
      }
    }
  }
}

// Panels of 4 vectors (6 rows: 24 accumulators) when N fills them, else one panel of N.
template <int M, int N, int K, int A_RS, int A_CS, int B_CS, int C_RS, int C_CS, bool CLEAR, class CS>
inline void gemm_bf16_nt(const kf_bf16* __restrict__ A, const kf_bf16* __restrict__ B, CS* __restrict__ C,
                         char* scratch) {
  if constexpr (bf16_rows_applies<M, A_CS>) return gemm_bf16_rows<M, N, K, A_RS, B_CS, C_RS, C_CS, CLEAR>(A, B, C);
  constexpr int NV = N >= 64 ? 4 : (N + 15) / 16, W = NV * 16, K2 = (K + 1) / 2, PANELS = (N + W - 1) / W;
  constexpr int MR = (NV == 4 ? 6 : 8) < M ? (NV == 4 ? 6 : 8) : M;
  uint32_t* bp = reinterpret_cast<uint32_t*>((reinterpret_cast<uintptr_t>(scratch) + 63) & ~uintptr_t(63));
  pack_bf16_nt<N, K, W, B_CS>(B, bp);
  auto panel = [&](auto ncols, int p) {
    constexpr int NC = decltype(ncols)::value;
    const uint32_t* b = bp + size_t(p) * K2 * W;
    CS* c = C + int64_t(p) * W * C_CS;
    int i0 = 0;
    for (; i0 + MR <= M; i0 += MR)
      bf16_nt_block<MR, NV, K, A_RS, A_CS, C_RS, C_CS, NC, CLEAR>(A + int64_t(i0) * A_RS, b, c + int64_t(i0) * C_RS);
    if constexpr (M % MR != 0)
      bf16_nt_block<M % MR, NV, K, A_RS, A_CS, C_RS, C_CS, NC, CLEAR>(A + int64_t(i0) * A_RS, b,
                                                                     c + int64_t(i0) * C_RS);
  };
  for (int p = 0; p + 1 < PANELS; ++p) panel(std::integral_constant<int, W>{}, p);
  panel(std::integral_constant<int, N - (PANELS - 1) * W>{}, PANELS - 1);
}

// bf16 x bf16 -> fp32 with B N-contiguous (B_CS == 1) but not a tile of its own: a region of a
// larger matrix read in place (the layout pass's direct B on this path, passes/gemm_layout.py), whose
// rows lie a power-of-two stride apart, or an N that is not whole 16-column vectors.  Many row
// blocks reuse B, so it is packed once per call into the K2 x W panels of in-order (k, k+1) words
// that gemm_bf16_nt reads, and the row blocks then run bf16_nt_block on them (A in place).  This
// pack replaces the T.copy that filled a B tile: the same bytes move once, but interleaved into
// VDPBF16PS's pair layout as they move, so no row block unpacks pairs again, and from the source
// rows directly, so the copy's second pass over the tile is gone.  Measured on Zen 4 (one thread,
// 256 x 128 x 256 tiles, benchmarks/bench_cpu_kernels.py): docs/backends/cpu.md.
inline constexpr int kBf16PackRows = 16;  // more rows than a decode block: B is reused, pack it

// Rows k and k+1 of 32 columns, interleaved into 32 words in column order by two VPERMT2Ws:
// word n = (row k, column n) in the low half, (row k + 1, column n) in the high half.
alignas(64) inline constexpr uint16_t kBf16PairIndex[32] = {
    0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39, 8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};

// B (element (k, n) at B[k * B_RS + n]) as K2 x W panels of (k, k+1) words, panel p holding columns
// [p W, p W + W); columns past N and the k past an odd K are zero.  Whole 32-column groups are
// vector code (W is a multiple of 16, so each half lands inside one panel), the rest word by word.
template <int N, int K, int W, int B_RS>
inline void pack_bf16_nn(const kf_bf16* __restrict__ B, uint32_t* __restrict__ out) {
  constexpr int K2 = (K + 1) / 2, NP = (N + W - 1) / W * W, N32 = N / 32 * 32;
  const __m512i lo = _mm512_load_si512(kBf16PairIndex), hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
  auto at = [&](int kk, int n) { return out + size_t(n / W) * K2 * W + size_t(kk) * W + n % W; };
  for (int kk = 0; kk < K2; ++kk) {
    const kf_bf16* r0 = B + int64_t(2 * kk) * B_RS;
    const kf_bf16* r1 = r0 + B_RS;
    const bool pair = 2 * kk + 1 < K;  // else row k + 1 is past K: zero, never read
#pragma GCC unroll 4
    for (int n = 0; n < N32; n += 32) {
      const __m512i x = _mm512_loadu_si512(r0 + n), y = pair ? _mm512_loadu_si512(r1 + n) : _mm512_setzero_si512();
      _mm512_storeu_si512(at(kk, n), _mm512_permutex2var_epi16(x, lo, y));
      _mm512_storeu_si512(at(kk, n + 16), _mm512_permutex2var_epi16(x, hi, y));
    }
    for (int n = N32; n < NP; ++n)
      *at(kk, n) = n >= N ? 0u : pair ? bf16_bits(r0[n]) | (bf16_bits(r1[n]) << 16) : bf16_bits(r0[n]);
  }
}

// Panels of 4 vectors (6 rows: 24 accumulators) when N fills them, as gemm_bf16_nt.  While the full
// row blocks run, the K x N region below a B read in place (rows K..2K-1: the next step of the usual K loop, whose
// copy-free GEMM reads it next) is prefetched, an even share of its lines per block: the pack then
// finds it in cache instead of waiting on each row's lines from L3 or memory (rows a power-of-two
// stride apart each sit in their own page, which the hardware prefetchers do not cross).  A
// prefetch is only a hint: past the end of the matrix it reads nothing and cannot fault.
template <int M, int N, int K, int A_RS, int A_CS, int B_RS, int C_RS, int C_CS, bool CLEAR, class CS>
inline void gemm_bf16_nn(const kf_bf16* __restrict__ A, const kf_bf16* __restrict__ B, CS* __restrict__ C,
                         char* scratch) {
  constexpr int NV = N >= 64 ? 4 : (N + 15) / 16, W = NV * 16, K2 = (K + 1) / 2, PANELS = (N + W - 1) / W;
  constexpr int MR = (NV == 4 ? 6 : 8) < M ? (NV == 4 ? 6 : 8) : M;
  constexpr int ROW_LINES = (N * 2 + 63) / 64, BLOCKS = PANELS * (M / MR);
  constexpr int PER_BLOCK = B_RS == N ? 0 : (K * ROW_LINES + BLOCKS - 1) / BLOCKS;  // none below a tile
  uint32_t* bp = reinterpret_cast<uint32_t*>((reinterpret_cast<uintptr_t>(scratch) + 63) & ~uintptr_t(63));
  pack_bf16_nn<N, K, W, B_RS>(B, bp);
  // an address, not a pointer into B: the region may lie past B's end
  const uintptr_t next = reinterpret_cast<uintptr_t>(B) + uintptr_t(int64_t(K) * B_RS * 2);
  int line = 0;  // of the next region's K * ROW_LINES, row by row
  auto prefetch = [&] {
    for (int i = 0; i < PER_BLOCK && line < K * ROW_LINES; ++i, ++line)
      _mm_prefetch(reinterpret_cast<const char*>(next + uintptr_t(int64_t(line / ROW_LINES) * B_RS * 2 +
                                                                  (line % ROW_LINES) * 64)),
                   _MM_HINT_T0);
  };
  auto panel = [&](auto ncols, int p) {
    constexpr int NC = decltype(ncols)::value;
    const uint32_t* b = bp + size_t(p) * K2 * W;
    CS* c = C + int64_t(p) * W * C_CS;
    int i0 = 0;
    for (; i0 + MR <= M; i0 += MR) {
      prefetch();
      bf16_nt_block<MR, NV, K, A_RS, A_CS, C_RS, C_CS, NC, CLEAR>(A + int64_t(i0) * A_RS, b, c + int64_t(i0) * C_RS);
    }
    if constexpr (M % MR != 0)
      bf16_nt_block<M % MR, NV, K, A_RS, A_CS, C_RS, C_CS, NC, CLEAR>(A + int64_t(i0) * A_RS, b,
                                                                     c + int64_t(i0) * C_RS);
  };
  for (int p = 0; p + 1 < PANELS; ++p) panel(std::integral_constant<int, W>{}, p);
  panel(std::integral_constant<int, N - (PANELS - 1) * W>{}, PANELS - 1);
}

// Whether a bf16 x bf16 GEMM with B N-contiguous packs B (gemm_bf16_nn) rather than reading it in
// place (gemm_bf16_direct): B is a region of a wider matrix (B_RS != N) that many rows reuse, or N
// is not whole vectors (which gemm_bf16_direct needs).
template <int M, int N, int B_RS>
inline constexpr bool bf16_packs_b = N % 16 != 0 || (M > kBf16PackRows && B_RS != N);
#endif

#if KF_ISA >= KF_ISA_AMX
// AMX-BF16 (Sapphire Rapids and later): TDPBF16PS multiplies a 16 x 32 bf16 tile of A by a
// 16 x 16 tile of B's (k, k+1) pairs into a 16 x 16 float32 tile, the VDPBF16PS arithmetic on
// 16 x 16 outputs at once.  Both operands are packed per call into zero-padded tiles (A row-major
// 16 x 32 blocks, B as (k, k+1) words, 16 columns a row), each 16 x 16 block of C accumulates in
// a tile register over K and is added to C once, as the other kernels do.  One C tile at a time:
// a first, correct version (what is measured and tuned on an AMX machine comes next: 2 x 2 C
// tiles per A/B load, A read in place when its rows hold whole 32-element steps).
//
// This machine class cannot run it: it is compiled for -march=sapphirerapids in the tests, and
// with KF_AMX_EMULATE the three tile operations below are scalar code with the instructions'
// semantics (k pairs summed, then accumulated in float32), so that the packing, padding, edge
// and store logic runs and is checked against float64 on any CPU.  Linux hands out the AMX tile
// state on request only (arch_prctl ARCH_REQ_XCOMP_PERM, once per process): kf::amx_enable.
struct AmxTileConfig {  // LDTILECFG's 64-byte layout, palette 1
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

#if defined(KF_AMX_EMULATE)
struct AmxEmu {
  alignas(64) unsigned char t[8][16 * 64];
};
inline thread_local AmxEmu amx_emu;
inline bool amx_enable() { return true; }
inline void amx_config(const AmxTileConfig*) {}
inline void amx_release() {}
inline void amx_load_tile(int t, const void* p, int64_t stride) {
  for (int r = 0; r < 16; ++r) std::memcpy(amx_emu.t[t] + r * 64, static_cast<const char*>(p) + r * stride, 64);
}
inline void amx_zero_c() { std::memset(amx_emu.t[0], 0, 16 * 64); }
inline void amx_load_a(const void* p, int64_t stride) { amx_load_tile(1, p, stride); }
inline void amx_load_b(const void* p, int64_t stride) { amx_load_tile(2, p, stride); }
inline void amx_store_c(void* p, int64_t stride) {
  for (int r = 0; r < 16; ++r) std::memcpy(static_cast<char*>(p) + r * stride, amx_emu.t[0] + r * 64, 64);
}
inline void amx_dpbf16() {  // tmm0 += tmm1 (A, 16 x 32 bf16) . tmm2 (B, 16 x 16 (k, k+1) words)
  float* c = reinterpret_cast<float*>(amx_emu.t[0]);
  const uint16_t* a = reinterpret_cast<const uint16_t*>(amx_emu.t[1]);
  const uint32_t* b = reinterpret_cast<const uint32_t*>(amx_emu.t[2]);
  auto f = [](uint32_t bits) { bits <<= 16; float x; std::memcpy(&x, &bits, 4); return x; };
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 16; ++n)
      for (int k = 0; k < 16; ++k) {
        const uint32_t w = b[k * 16 + n];
        c[m * 16 + n] += f(a[m * 32 + 2 * k]) * f(w & 0xffff) + f(a[m * 32 + 2 * k + 1]) * f(w >> 16);
      }
}
#else
}  // namespace kf
#include <sys/syscall.h>
#include <unistd.h>
namespace kf {
// ARCH_REQ_XCOMP_PERM (0x1023) for XFEATURE_XTILEDATA (18); false when the kernel refuses
inline bool amx_enable() {
  static const bool ok = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  return ok;
}
inline void amx_config(const AmxTileConfig* c) { _tile_loadconfig(c); }
inline void amx_release() { _tile_release(); }
// the tile numbers are literals: the intrinsics paste them into the instruction's register names
inline void amx_zero_c() { _tile_zero(0); }
inline void amx_load_a(const void* p, int64_t stride) { _tile_loadd(1, p, stride); }
inline void amx_load_b(const void* p, int64_t stride) { _tile_loadd(2, p, stride); }
inline void amx_store_c(void* p, int64_t stride) { _tile_stored(0, p, stride); }
inline void amx_dpbf16() { _tile_dpbf16ps(0, 1, 2); }
#endif

template <int M, int N, int K, int A_RS, int A_CS, int B_RS, int B_CS, int C_RS, int C_CS, bool CLEAR, class CS>
inline void gemm_amx_bf16(const kf_bf16* __restrict__ A, const kf_bf16* __restrict__ B, CS* __restrict__ C,
                          char* scratch) {
  constexpr int MP = (M + 15) / 16 * 16, NP = (N + 15) / 16 * 16, KP = (K + 31) / 32 * 32;
  uint16_t* ap = reinterpret_cast<uint16_t*>((reinterpret_cast<uintptr_t>(scratch) + 63) & ~uintptr_t(63));
  uint32_t* bp = reinterpret_cast<uint32_t*>(ap + size_t(MP) * KP);  // KP / 2 x NP words
  float* ct = reinterpret_cast<float*>(bp + size_t(KP / 2) * NP);     // one 16 x 16 C tile
  for (int i = 0; i < MP; ++i)
    for (int k = 0; k < KP; ++k)
      ap[size_t(i) * KP + k] = i < M && k < K ? uint16_t(bf16_bits(A[int64_t(i) * A_RS + int64_t(k) * A_CS])) : 0;
  for (int kk = 0; kk < KP / 2; ++kk)
    for (int n = 0; n < NP; ++n) {
      const auto at = [&](int k) -> uint32_t {
        return n < N && k < K ? bf16_bits(B[int64_t(k) * B_RS + int64_t(n) * B_CS]) : 0u;
      };
      bp[size_t(kk) * NP + n] = at(2 * kk) | (at(2 * kk + 1) << 16);
    }
  AmxTileConfig cfg;
  for (int t = 0; t < 3; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;  // tmm0 C, tmm1 A, tmm2 B
  amx_config(&cfg);
  for (int i0 = 0; i0 < MP; i0 += 16)
    for (int j0 = 0; j0 < NP; j0 += 16) {
      amx_zero_c();
      for (int k0 = 0; k0 < KP; k0 += 32) {
        amx_load_a(ap + size_t(i0) * KP + k0, int64_t(KP) * 2);
        amx_load_b(bp + size_t(k0 / 2) * NP + j0, int64_t(NP) * 4);
        amx_dpbf16();
      }
      amx_store_c(ct, 64);
      const int rows = M - i0 < 16 ? M - i0 : 16;  // store_block clips the columns
      for (int r = 0; r < rows; ++r) store_block<M, N, 16, C_RS, C_CS, CLEAR>(ct + r * 16, C, i0 + r, j0);
    }
  amx_release();
}
#endif

// A already in the compute type, B not readable in place (transposed, or narrow): B alone is
// packed, into zero-padded K x W panels (W = the direct block's width), and the direct blocks
// read them with B_RS = W; A is still read where it is.  MLA's Q K^T: Q is never packed.
template <class T, int M, int N, int K, int A_RS, int A_CS, int B_RS, int B_CS, int C_RS, int C_CS, bool CLEAR,
          class BS, class CS>
inline void direct_b_packed(const T* __restrict__ A, const BS* __restrict__ B, CS* __restrict__ C, char* scratch) {
  constexpr int L = GemmShape<T>::L;
  constexpr int MR = kDirectRows < M ? kDirectRows : M;
  constexpr int NV = kDirectVectors<MR>, W = NV * L;
  constexpr int PANELS = (N + W - 1) / W, LAST = N - (PANELS - 1) * W;
  T* bp = reinterpret_cast<T*>((reinterpret_cast<uintptr_t>(scratch) + 63) & ~uintptr_t(63));
  pack_panels<T, N, K, W, B_CS, B_RS>(B, bp);
  for (int p = 0; p + 1 < PANELS; ++p)
    direct_panel<T, M, K, NV, W, A_RS, A_CS, W, C_RS, C_CS, CLEAR>(A, bp + size_t(p) * K * W, C, p * W);
  direct_panel<T, M, K, NV, LAST, A_RS, A_CS, W, C_RS, C_CS, CLEAR>(A, bp + size_t(PANELS - 1) * K * W, C,
                                                                       (PANELS - 1) * W);
}

// C (+)= A @ B with A: M x K, B: K x N, C: M x N, accumulating in T.
template <class T, int M, int N, int K, int A_RS, int A_CS, int B_RS, int B_CS, int C_RS, int C_CS,
          bool CLEAR, class AS, class BS, class CS>
inline void gemm(const AS* __restrict__ A, const BS* __restrict__ B, CS* __restrict__ C, char* scratch) {
  constexpr bool float_compute = std::is_same_v<T, float> || std::is_same_v<T, double>;
  if constexpr (direct_gemm_applies<T, N, B_CS, AS, BS>) {
    gemm_direct<T, M, N, K, A_RS, A_CS, B_RS, C_RS, C_CS, CLEAR>(A, B, C);
    return;
  } else if constexpr (float_compute && std::is_same_v<BS, T> && B_CS == 1 && N % GemmShape<T>::L == 0) {
    // B readable in place, A narrow (MLA's bf16 probabilities): widen A once, row-major
    T* a = reinterpret_cast<T*>((reinterpret_cast<uintptr_t>(scratch) + 63) & ~uintptr_t(63));
    for (int i = 0; i < M; ++i)
      for (int k = 0; k < K; ++k) a[i * K + k] = load_as<T>(A[int64_t(i) * A_RS + int64_t(k) * A_CS]);
    gemm_direct<T, M, N, K, K, 1, B_RS, C_RS, C_CS, CLEAR>(a, B, C);
    return;
  } else if constexpr (float_compute && std::is_same_v<AS, T>) {
    direct_b_packed<T, M, N, K, A_RS, A_CS, B_RS, B_CS, C_RS, C_CS, CLEAR>(A, B, C, scratch);
    return;
  }
#if KF_ISA >= KF_ISA_AMX
  if constexpr (std::is_same_v<AS, kf_bf16> && std::is_same_v<BS, kf_bf16> && std::is_same_v<T, float>) {
    if (amx_enable()) {
      gemm_amx_bf16<M, N, K, A_RS, A_CS, B_RS, B_CS, C_RS, C_CS, CLEAR>(A, B, C, scratch);
      return;
    }
  }
#endif
#if KF_ISA >= KF_ISA_AVX512BF16
  constexpr bool a_bf16 = std::is_same_v<AS, kf_bf16> || std::is_same_v<AS, kf_fp8e4m3>;
  constexpr bool b_bf16 = std::is_same_v<BS, kf_bf16> || std::is_same_v<BS, kf_fp8e4m3>;
  if constexpr (std::is_same_v<AS, kf_bf16> && std::is_same_v<BS, kf_bf16> && std::is_same_v<T, float> &&
                B_CS == 1 && bf16_packs_b<M, N, B_RS>) {
    gemm_bf16_nn<M, N, K, A_RS, A_CS, B_RS, C_RS, C_CS, CLEAR>(A, B, C, scratch);
    return;
  } else if constexpr (std::is_same_v<AS, kf_bf16> && std::is_same_v<BS, kf_bf16> && std::is_same_v<T, float> &&
                       B_CS == 1) {
    gemm_bf16_direct<M, N, K, A_RS, A_CS, B_RS, C_RS, C_CS, CLEAR>(A, B, C);
    return;
  } else if constexpr (std::is_same_v<AS, kf_bf16> && std::is_same_v<BS, kf_bf16> && std::is_same_v<T, float> &&
                       B_RS == 1 && B_CS != 1) {
    gemm_bf16_nt<M, N, K, A_RS, A_CS, B_CS, C_RS, C_CS, CLEAR>(A, B, C, scratch);
    return;
  } else if constexpr (a_bf16 && b_bf16 && std::is_same_v<T, float>) {
    gemm_bf16<M, N, K, A_RS, A_CS, B_RS, B_CS, C_RS, C_CS, CLEAR>(A, B, C, scratch);
    return;
  }
#endif
  using G = GemmTile<T, M, N>;
  T* ap = reinterpret_cast<T*>((reinterpret_cast<uintptr_t>(scratch) + 63) & ~uintptr_t(63));
  T* bp = ap + size_t(G::MP) * K;
  pack_panels<T, M, K, G::MR, A_RS, A_CS>(A, ap);
  pack_panels<T, N, K, G::NR, B_CS, B_RS>(B, bp);
  for (int ib = 0; ib < G::MP / G::MR; ++ib)
    for (int jb = 0; jb < G::NP / G::NR; ++jb)
      gemm_block<T, M, N, K, C_RS, C_CS, CLEAR>(ap + size_t(ib) * K * G::MR, bp + size_t(jb) * K * G::NR, C,
                                                ib * G::MR, jb * G::NR);
}

}  // namespace kf
