// Non-temporal zero fill, what the CPU renderer emits for a Parallel loop that stores zero
// over a long contiguous run of global memory (the padding rows of MoE's expanded buffer).
//
// Why: a plain store to a line that is not cached first reads it (read-for-ownership), so
// zeroing memory that is not cached moves every byte twice; non-temporal (streaming) stores
// write whole lines without reading them and without evicting the cache's useful lines.  At
// T = 64, E = 256, alignment 128 the padding is 87 MB, the data rows 1.5 MB.
//
// The stores are weakly ordered: the renderer ends every block that streamed with
// kf::stream_fence() (sfence), so they are visible before the block's thread reaches the
// OpenMP barrier and the kernel returns.  The unaligned head and tail, and hosts without SSE2,
// use memset.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#if defined(__SSE2__)
#include <immintrin.h>
#endif

namespace kf {

template <class T>
inline void zero_stream(T* p, int64_t n) {
  if (n <= 0) return;
  char* b = reinterpret_cast<char*>(p);
  size_t bytes = size_t(n) * sizeof(T);
#if defined(__SSE2__)
  size_t head = (64 - (reinterpret_cast<uintptr_t>(b) & 63)) & 63;
  if (head > bytes) head = bytes;
  std::memset(b, 0, head);
  b += head;
  bytes -= head;
  const size_t body = bytes & ~size_t(63);
  for (size_t i = 0; i < body; i += 64) {
#if defined(__AVX512F__)
    _mm512_stream_si512(reinterpret_cast<__m512i*>(b + i), _mm512_setzero_si512());
#elif defined(__AVX__)
    _mm256_stream_si256(reinterpret_cast<__m256i*>(b + i), _mm256_setzero_si256());
    _mm256_stream_si256(reinterpret_cast<__m256i*>(b + i + 32), _mm256_setzero_si256());
#else
    for (size_t j = 0; j < 64; j += 16) _mm_stream_si128(reinterpret_cast<__m128i*>(b + i + j), _mm_setzero_si128());
#endif
  }
  std::memset(b + body, 0, bytes - body);
#else
  std::memset(b, 0, bytes);
#endif
}

inline void stream_fence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

}  // namespace kf
