// Shared-memory swizzle of TMA (CU_TENSOR_MAP_SWIZZLE_{32,64,128}B) and of wgmma descriptors
// (layout types 3, 2, 1): the 16-byte chunk index inside each 32/64/128-byte row segment is XORed
// with bits 7.. of the shared address, exactly as the hardware does:
//   128B: address bits [4:6] ^= [7:9]; 64B: [4:5] ^= [7:8]; 32B: [4] ^= [7].
// For 128B that is chunk ^ (row % 8) inside each 8-row, 1024-byte atom when the atom starts on a
// 1024-byte boundary.  The emulated TMA writes through it and the emulated wgmma reads through
// it, each with the mode *it* was given, so a tensor map and a descriptor that disagree give
// wrong data here as on the GPU.
#pragma once
#include <cstdint>

namespace kf_emu {

inline uint32_t swizzle_addr(uint32_t a, uint32_t swizzle_bytes) {
  switch (swizzle_bytes) {
    case 128: return a ^ (((a >> 7) & 7u) << 4);
    case 64: return a ^ (((a >> 7) & 3u) << 4);
    case 32: return a ^ (((a >> 7) & 1u) << 4);
    default: return a;
  }
}

}  // namespace kf_emu
