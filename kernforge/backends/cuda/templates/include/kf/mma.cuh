// Warp-level tensor-core primitives (sm_80+): ldmatrix and mma.sync m16n8k16.
//
// Notation: lane = threadIdx.x % 32, g = lane / 4 ("groupID"), t = lane % 4.
// A 16-bit pair packs element k (low half) and k+1 (high half) into one uint32_t.
//
// ldmatrix_x{2,4}(regs, row_ptr): `ldmatrix.sync.aligned.m8n8.x{2,4}.shared.b16`.
//   Loads 2/4 8x8 matrices of 16-bit elements.  Matrix q's eight rows are
//   16-byte shared-memory rows whose addresses come from lanes 8q..8q+7
//   (lane 8q+r gives row r; each lane passes its own `row_ptr`).  Result:
//   regs[q] of lane L holds matrix q's elements (row L/4, cols 2*(L%4), +1).
// ldmatrix_x{2,4}_trans: `... .trans`: the same, but each matrix is transposed:
//   regs[q] of lane L holds (row 2*(L%4), col L/4) low and (row 2*(L%4)+1, col L/4) high.
//
// mma_m16n8k16_f32_{bf16,f16}(d, a, b, c): `mma.sync.aligned.m16n8k16.row.col.f32.T.T.f32`,
//   D(16x8) = A(16x16) * B(16x8) + C, fp32 accumulate; fragments per lane:
//   a[0]: A(g, 2t..2t+1)   a[1]: A(g+8, 2t..2t+1)   a[2]: A(g, 2t+8..2t+9)   a[3]: A(g+8, 2t+8..2t+9)
//   b[0]: B(2t..2t+1, g)   b[1]: B(2t+8..2t+9, g)
//   c/d[0]: (g, 2t)  [1]: (g, 2t+1)  [2]: (g+8, 2t)  [3]: (g+8, 2t+1)
#pragma once
#include "kf/common.cuh"

#ifndef KF_HOST_EMULATION
namespace kf {

KF_DEVICE unsigned smem_u32(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }

KF_DEVICE void ldmatrix_x2(uint32_t (&r)[2], const void* row_ptr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1]) : "r"(smem_u32(row_ptr)));
}
KF_DEVICE void ldmatrix_x4(uint32_t (&r)[4], const void* row_ptr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(row_ptr)));
}
KF_DEVICE void ldmatrix_x2_trans(uint32_t (&r)[2], const void* row_ptr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1]) : "r"(smem_u32(row_ptr)));
}
KF_DEVICE void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row_ptr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(row_ptr)));
}

KF_DEVICE void mma_m16n8k16_f32_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                     const float (&c)[4]) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%10,%11,%12,%13};\n"
               : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
                 "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}
KF_DEVICE void mma_m16n8k16_f32_f16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                    const float (&c)[4]) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%10,%11,%12,%13};\n"
               : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
                 "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}

}  // namespace kf
#else
#include "kf/emu/mma.h"
#endif
