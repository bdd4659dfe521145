// Host emulation of kf/mma.cuh: ldmatrix and mma.sync, lane by lane.
//
// Each lane posts its own registers (or its ldmatrix row address) to the warp's
// exchange area and then computes only *its own* destination registers, reading
// the other lanes' posts through the PTX ISA fragment maps below.  So a lane's
// registers hold exactly the elements the hardware gives it: a kernel that
// builds or consumes fragments with a wrong layout gets wrong numbers here too.
//
// Fragment maps (PTX ISA, "Matrix Fragments for mma.m16n8k16", 16-bit types;
// g = lane/4, t = lane%4; register r of a 16-bit operand packs 2 elements,
// the lower-indexed one in the low half):
//   A 16x16: reg r of lane L holds A(g + 8*(r%2), 2t + 8*(r/2) + {0,1})
//   B 16x8:  reg r of lane L holds B(2t + 8*r + {0,1}, g)
//   C/D 16x8 (f32): element q of lane L is (g + 8*(q/2), 2t + q%2)
// Inverting them: A(m, k) is in lane 4*(m%8) + (k%8)/2, reg (m/8) + 2*(k/8),
// half k%2; B(k, n) is in lane 4*n + (k%8)/2, reg k/8, half k%2.
#pragma once
#include <cstdint>
#include <cstring>

#include "kf/emu/shared.h"
#include "kf/emu/types.h"
#include "kf/emu/warp.h"

namespace kf_emu {

inline float half_of(uint64_t reg, int hi, bool bf16) {
  const uint16_t bits = uint16_t(reg >> (16 * hi));
  return bf16 ? bf16_bits_to_float(bits) : f16_bits_to_float(bits);
}

// D = A * B + C for one m16n8k16 (bf16 or f16 inputs, f32 accumulate).  Products
// are exact in float and summed in double, then added to C and rounded once:
// tensor cores also keep full product precision; the GPU's exact summation
// order is unspecified, so results agree to float rounding, not bit for bit.
inline void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const float (&c)[4], bool bf16) {
  uint64_t post[6];
  for (int r = 0; r < 4; ++r) post[r] = a[r];
  for (int r = 0; r < 2; ++r) post[4 + r] = b[r];
  auto rows = exchange(post, 6);
  if (my_warp().lanes != kWarpSize) fail("mma.sync needs a full warp of 32 threads");
  const int lane = int(ctx().lane), g = lane / 4, t = lane % 4;
  float out[4];
  for (int q = 0; q < 4; ++q) {
    const int m = g + 8 * (q / 2), n = 2 * t + q % 2;
    double acc = 0.0;
    for (int k = 0; k < 16; ++k) {
      const float av = half_of(rows[4 * (m % 8) + (k % 8) / 2][(m / 8) + 2 * (k / 8)], k % 2, bf16);
      const float bv = half_of(rows[4 * n + (k % 8) / 2][4 + k / 8], k % 2, bf16);
      acc += double(av) * double(bv);
    }
    out[q] = float(double(c[q]) + acc);
  }
  for (int q = 0; q < 4; ++q) d[q] = out[q];
}

// ldmatrix .m8n8.x<num>[.trans].b16: matrix q's row r comes from lane 8q+r's
// address; lane L receives (row L/4, cols 2(L%4)+{0,1}) of matrix q, or with
// .trans (rows 2(L%4)+{0,1}, col L/4).
template <int NUM>
inline void ldmatrix(uint32_t (&r)[NUM], const void* row_ptr, bool trans) {
  if (!is_shared(row_ptr)) fail("ldmatrix: row address is not in shared memory");
  if (smem_addr(row_ptr) % 16) fail("ldmatrix: row address is not 16-byte aligned");
  const uint64_t mine = uint64_t(reinterpret_cast<uintptr_t>(row_ptr));
  auto rows = exchange(&mine, 1);
  if (my_warp().lanes != kWarpSize) fail("ldmatrix needs a full warp of 32 threads");
  const int lane = int(ctx().lane);
  for (int q = 0; q < NUM; ++q) {
    uint16_t h[2];
    for (int j = 0; j < 2; ++j) {
      const int row = trans ? 2 * (lane % 4) + j : lane / 4;
      const int col = trans ? lane / 4 : 2 * (lane % 4) + j;
      const uint16_t* p = reinterpret_cast<const uint16_t*>(uintptr_t(rows[8 * q + row][0]));
      std::memcpy(&h[j], p + col, 2);
    }
    r[q] = uint32_t(h[0]) | (uint32_t(h[1]) << 16);
  }
}

}  // namespace kf_emu

namespace kf {

KF_DEVICE unsigned smem_u32(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }

KF_DEVICE void ldmatrix_x2(uint32_t (&r)[2], const void* row_ptr) { kf_emu::ldmatrix<2>(r, row_ptr, false); }
KF_DEVICE void ldmatrix_x4(uint32_t (&r)[4], const void* row_ptr) { kf_emu::ldmatrix<4>(r, row_ptr, false); }
KF_DEVICE void ldmatrix_x2_trans(uint32_t (&r)[2], const void* row_ptr) { kf_emu::ldmatrix<2>(r, row_ptr, true); }
KF_DEVICE void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row_ptr) { kf_emu::ldmatrix<4>(r, row_ptr, true); }

KF_DEVICE void mma_m16n8k16_f32_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                     const float (&c)[4]) {
  kf_emu::mma_m16n8k16(d, a, b, c, true);
}
KF_DEVICE void mma_m16n8k16_f32_f16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                    const float (&c)[4]) {
  kf_emu::mma_m16n8k16(d, a, b, c, false);
}

}  // namespace kf
