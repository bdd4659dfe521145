// Vector tail of the branch-free append idiom (kernforge.codegen.passes.append):
// `lanes` holds one chunk of KF_APPEND_LANES computed values; the lanes in `keep`
// are packed to the front and the first popcount(`store`) of them written at
// `dst` (masked store: nothing beyond is touched).  AVX-512 only; without it the
// renderer emits the plain scalar loop and never calls these.
#pragma once

#include <cstdint>

#if defined(__AVX512F__)
#include <immintrin.h>

#define KF_APPEND_LANES 16

namespace kf {

inline __mmask16 append_nonzero(const int32_t* flags) {
  const __m512i v = _mm512_load_si512(flags);
  return _mm512_test_epi32_mask(v, v);
}

inline __mmask16 append_prefix(__mmask16 m) {
  return static_cast<__mmask16>((1u << __builtin_popcount(m)) - 1u);
}

template <class T>
inline void append_lanes(T* dst, const T* lanes, __mmask16 keep, __mmask16 store) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 2, "append_lanes: 2- or 4-byte elements");
  if constexpr (sizeof(T) == 4) {
    const __m512i v = _mm512_maskz_compress_epi32(keep, _mm512_load_si512(lanes));
    _mm512_mask_storeu_epi32(dst, store, v);
  } else {
#if defined(__AVX512BW__) && defined(__AVX512VL__)
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(lanes)));
    _mm256_mask_storeu_epi16(dst, store, _mm512_cvtepi32_epi16(_mm512_maskz_compress_epi32(keep, w)));
#else
    static_assert(sizeof(T) == 4, "append_lanes: 2-byte elements need AVX512BW and AVX512VL");
#endif
  }
}

}  // namespace kf
#endif
