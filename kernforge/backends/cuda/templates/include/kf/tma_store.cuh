// STSM + TMA-store epilogue primitives (sm_90a, sm_100a): a warpgroup's wgmma (or tcgen05.ld)
// accumulator goes to a shared staging tile with stmatrix (16 bytes per lane per matrix row
// instead of 4-byte STGs), then one elected thread writes the whole tile to global memory with
// TMA stores.
//
// Exact semantics (PTX ISA, "stmatrix", "cp.async.bulk.tensor", "cp.async.bulk.commit_group",
// "cp.async.bulk.wait_group"):
//  * stmatrix_x4(row_ptr, r): `stmatrix.sync.aligned.m8n8.x4.shared.b16 [row_ptr], {r0..r3};`
//    the inverse of ldmatrix_x4 (kf/mma.cuh): lane 8q+j gives the 16-byte-aligned shared address
//    of row j of matrix q; r[q] of lane L holds matrix q's (row L/4, cols 2*(L%4), +1), low half
//    first.  stmatrix_x4_trans: `... .trans`: r[q] of lane L holds (row 2*(L%4), col L/4) low and
//    (row 2*(L%4)+1, col L/4) high.  Every lane of the warp executes it.
//  * tma_store_2d(map, src, c0, c1):
//    `cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [map, {c0, c1}], [src];` copies the
//    box of the tensor map from shared `src` (128-byte aligned, 1024 with a swizzle; box order,
//    read through the map's swizzle) to the global tensor at coordinates (c0 innermost, c1).
//    Elements outside the tensor are not written (TMA clips the box).  The copy joins the
//    issuing thread's open bulk async-group; the shared data must have been made visible to the
//    async proxy first: fence_proxy_async() (kf/fence.cuh) in every writing thread, then a
//    barrier among the writers.
//    tma_store_nd(map, src, c0, c1[, c2[, c3[, c4]]]): the same with `.3d` .. `.5d` and the outer
//    coordinates of a rank-3..5 map (an N-D output whose tile is its last two dimensions, e.g.
//    MLA's Out[b, s, h0:h0+64, :]: the box clips at each dimension, so rows past `heads` are not
//    written even though the next token's heads follow them in memory).
//  * bulk_commit_group(): `cp.async.bulk.commit_group;` closes the thread's open bulk group.
//  * bulk_wait_group_read<N>(): `cp.async.bulk.wait_group.read N;` waits until all but the
//    newest N committed groups of this thread have finished *reading* their shared sources:
//    the staging buffer may be overwritten (after a barrier, by other threads) or the CTA may
//    exit afterwards.  The global writes become visible at grid end (or after wait_group).
//
// The epilogue helpers below define the staging layout that the TMA box describes: the 64 x N
// tile of one warpgroup is split into column slabs of SLAB = SWIZZLE / sizeof(T) columns (the
// whole N without a swizzle), each slab 64 rows of SLAB * sizeof(T) bytes, row-major, with the
// tensor map's swizzle applied to the byte offset inside the slab (kf/wgmma.cuh: bits [4:6] ^=
// [7:9] for 128 bytes).  One TMA box {SLAB, 64} per slab.
// Host emulation: kf/emu/tma_store.h (stmatrix lane by lane, the proxy-fence check, stores
// performed at wait_group.read with an overwrite check, outstanding stores at exit reported).
#pragma once
#include "kf/common.cuh"
#include "kf/fence.cuh"
#include "kf/tma.cuh"

#ifndef KF_HOST_EMULATION
namespace kf {

KF_DEVICE void stmatrix_x4(void* row_ptr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(tma_smem_addr(row_ptr)),
               "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}
KF_DEVICE void stmatrix_x4_trans(void* row_ptr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n"
               ::"r"(tma_smem_addr(row_ptr)), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}
KF_DEVICE void st_shared_v2(void* dst, float a, float b) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(tma_smem_addr(dst)), "f"(a), "f"(b) : "memory");
}
KF_DEVICE void tma_store_2d(const CUtensorMap* map, const void* src, int32_t c0, int32_t c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n"
               ::"l"(reinterpret_cast<uint64_t>(map)), "r"(tma_smem_addr(src)), "r"(c0), "r"(c1)
               : "memory");
}
KF_DEVICE void tma_store_nd(const CUtensorMap* map, const void* src, int32_t c0, int32_t c1, int32_t c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n"
               ::"l"(reinterpret_cast<uint64_t>(map)), "r"(tma_smem_addr(src)), "r"(c0), "r"(c1), "r"(c2)
               : "memory");
}
KF_DEVICE void tma_store_nd(const CUtensorMap* map, const void* src, int32_t c0, int32_t c1, int32_t c2,
                            int32_t c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n"
               ::"l"(reinterpret_cast<uint64_t>(map)), "r"(tma_smem_addr(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}
KF_DEVICE void tma_store_nd(const CUtensorMap* map, const void* src, int32_t c0, int32_t c1, int32_t c2,
                            int32_t c3, int32_t c4) {
  asm volatile("cp.async.bulk.tensor.5d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5, %6}], [%1];\n"
               ::"l"(reinterpret_cast<uint64_t>(map)), "r"(tma_smem_addr(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
               "r"(c4)
               : "memory");
}
KF_DEVICE void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
template <int N>
KF_DEVICE void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}

}  // namespace kf
#else
#include "kf/emu/tma_store.h"
namespace kf {

KF_DEVICE void stmatrix_x4(void* row_ptr, const uint32_t (&r)[4]) { kf_emu::stmatrix<4>(row_ptr, r, false); }
KF_DEVICE void stmatrix_x4_trans(void* row_ptr, const uint32_t (&r)[4]) { kf_emu::stmatrix<4>(row_ptr, r, true); }
KF_DEVICE void st_shared_v2(void* dst, float a, float b) {
  const float v[2] = {a, b};
  kf_emu::staging_write_check(dst, sizeof v);
  kf_emu::st_shared_generic(dst, v, sizeof v);
}
KF_DEVICE void tma_store_2d(const CUtensorMap* map, const void* src, int32_t c0, int32_t c1) {
  const int32_t c[2] = {c0, c1};
  kf_emu::tma_store(map, src, c);
}
template <typename... Outer>
KF_DEVICE void tma_store_nd(const CUtensorMap* map, const void* src, int32_t c0, int32_t c1, Outer... outer) {
  static_assert(sizeof...(Outer) >= 1 && sizeof...(Outer) <= 3, "TMA maps have rank 3..5 here");
  const int32_t c[] = {c0, c1, int32_t(outer)...};
  kf_emu::tma_store(map, src, c);
}
KF_DEVICE void bulk_commit_group() { kf_emu::bulk_commit_group(); }
template <int N>
KF_DEVICE void bulk_wait_group_read() { kf_emu::bulk_wait_group_read(N); }

}  // namespace kf
#endif

namespace kf {

KF_DEVICE void tma_store_nd(const CUtensorMap* map, const void* src, int32_t c0, int32_t c1) {
  tma_store_2d(map, src, c0, c1);
}

// Byte offset of element (row, col) of a warpgroup's 64 x N staging tile (layout above).
template <int N, int SWIZZLE, int ELEM>
KF_DEVICE uint32_t epilogue_stage_offset(int row, int col) {
  constexpr int kSlab = SWIZZLE ? SWIZZLE / ELEM : N;
  static_assert(N % kSlab == 0, "the tile width must be a whole number of slabs");
  const uint32_t in_slab = uint32_t(row * kSlab * ELEM + (col % kSlab) * ELEM);
  uint32_t sw = in_slab;
  if (SWIZZLE == 128) sw ^= ((in_slab >> 7) & 7u) << 4;
  if (SWIZZLE == 64) sw ^= ((in_slab >> 7) & 3u) << 4;
  if (SWIZZLE == 32) sw ^= ((in_slab >> 7) & 1u) << 4;
  return uint32_t(col / kSlab) * uint32_t(64 * kSlab * ELEM) + sw;
}

// The m64nNk* wgmma accumulator of this thread (kf/wgmma.cuh: d[4j+q] is D(16w + g + 8(q/2),
// 8j + 2t + q%2) with w the warp in the warpgroup) rounded to bf16 and written to `stage`
// (1024-byte aligned with a swizzle) with one stmatrix.x4 per 16 columns: matrices q = 0..3 are
// (rows 16w + 8(q%2) .. +7, cols 16i + 8(q/2) .. +7), so the packed pair of d[4j + 2(q%2)] is
// exactly register q's (row g, cols 2t, 2t+1).  Every thread of the warpgroup calls it.
// `slice` (0..3): which 16 rows of the 64-row staging block this warp's fragment fills; the
// wgmma order's is the warp's index in its warpgroup (the overload without it), tcgen05's
// M = 128 order passes its own (backends/cuda/tma_store.py: a warp's rows there are 16 of its
// 32-lane quarter of a 128-row block).
template <int N, int SWIZZLE>
KF_DEVICE void epilogue_stsm_bf16(const float (&d)[N / 2], unsigned char* stage, int slice) {
  static_assert(N % 16 == 0, "stmatrix.x4 covers 16 columns");
  const int lane = int(threadIdx.x % 32);
  const int q_addr = lane / 8, row = 16 * slice + 8 * (q_addr % 2) + lane % 8;
#pragma unroll
  for (int i = 0; i < N / 16; ++i) {
    uint32_t r[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int j = 2 * i + q / 2, k = 4 * j + 2 * (q % 2);
      r[q] = uint32_t(kf_bitcast<uint16_t>(kf_from_float<kf_bf16>(d[k]))) |
             (uint32_t(kf_bitcast<uint16_t>(kf_from_float<kf_bf16>(d[k + 1]))) << 16);
    }
    stmatrix_x4(stage + epilogue_stage_offset<N, SWIZZLE, 2>(row, 16 * i + 8 * (q_addr / 2)), r);
  }
}
template <int N, int SWIZZLE>
KF_DEVICE void epilogue_stsm_bf16(const float (&d)[N / 2], unsigned char* stage) {
  epilogue_stsm_bf16<N, SWIZZLE>(d, stage, int(threadIdx.x % 128) / 32);
}

// fp32 output: no 32-bit stmatrix, so each thread stores its pairs with st.shared.v2.f32
// (`slice` as for epilogue_stsm_bf16).
template <int N, int SWIZZLE>
KF_DEVICE void epilogue_st_f32(const float (&d)[N / 2], unsigned char* stage, int slice) {
  const int lane = int(threadIdx.x % 32), g = lane / 4, t = lane % 4;
#pragma unroll
  for (int j = 0; j < N / 8; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      st_shared_v2(stage + epilogue_stage_offset<N, SWIZZLE, 4>(16 * slice + g + 8 * h, 8 * j + 2 * t),
                   d[4 * j + 2 * h], d[4 * j + 2 * h + 1]);
}
template <int N, int SWIZZLE>
KF_DEVICE void epilogue_st_f32(const float (&d)[N / 2], unsigned char* stage) {
  epilogue_st_f32<N, SWIZZLE>(d, stage, int(threadIdx.x % 128) / 32);
}

// One thread: a TMA store per slab of the 64 x N staging tile to global (col0, row0[, outer...]:
// the coordinates of a rank-3..5 map's outer dimensions, innermost first), then the commit.  The
// caller waits (bulk_wait_group_read) before the buffer is reused or it returns.
template <int N, int SWIZZLE, int ELEM, typename... Outer>
KF_DEVICE void epilogue_tma_store(const CUtensorMap* map, const unsigned char* stage, int32_t col0, int32_t row0,
                                  Outer... outer) {
  constexpr int kSlab = SWIZZLE ? SWIZZLE / ELEM : N;
#pragma unroll
  for (int s = 0; s < N / kSlab; ++s)
    tma_store_nd(map, stage + s * 64 * kSlab * ELEM, col0 + s * kSlab, row0, int32_t(outer)...);
  bulk_commit_group();
}

}  // namespace kf
