// Persistent tile scheduler (DeepGEMM's scheduler/gemm.cuh), rendered by
// kernforge/backends/cuda/persistent.py for kernels that call T.persistent(...).
//
// The launch has min(#tiles, #SMs) CTAs; CTA c runs tiles t = c, c + gridDim.x, ... of the
// kernel's logical grid (nx, ny, nz), so the per-CTA set-up (mbarrier rings, TMEM) is paid once
// and the producer of a warp-specialized kernel fills the next tile's stages while the
// consumers run the previous tile's epilogue.
//
// next_tile(t, ...) maps tile id t to the block indices (bx, by, bz):
//  * bz-major: all of bz's tiles come before bz + 1's;
//  * within one bz, L2-grouped: runs of `group` consecutive `by` blocks (rows) per `bx` block,
//    the `by` index fastest, so the CTAs that run at the same time read the same `bx` operand
//    tile (an expert's weights) and a few row tiles, which stay in L2 (DeepGEMM's
//    kNum1DBlocksPerGroup swizzle);
//  * `live` (optional, per-bz row counts: the masked layout's masked_m) limits bz's row blocks
//    to ceil(live[bz] / block_rows) (clamped to [0, ny]), so the CTAs walk the experts' live
//    tiles only and skip the empty ones instead of being handed them.
// The walk state (z, base: bz and its first tile id) only moves forward, as t only grows.
// Plain integer code: the same functions run under host emulation.
#pragma once
#include "kf/common.cuh"

namespace kf {

// (by, bx) of tile `local` of an ny x nx grid in L2-grouped order (see above)
KF_DEVICE void l2_grouped_tile(int32_t local, int32_t ny, int32_t nx, int32_t group, int32_t& by, int32_t& bx) {
  const int32_t per_group = nx * group;
  const int32_t first = (local / per_group) * group;
  const int32_t in_group = local % per_group;
  const int32_t width = ny - first < group ? ny - first : group;
  by = first + in_group % width;
  bx = in_group / width;
}

// row blocks of one bz: ceil(rows / block_rows), clamped to [0, ny]
KF_DEVICE int32_t live_row_blocks(int32_t rows, int32_t block_rows, int32_t ny) {
  const int32_t n = rows <= 0 ? 0 : (rows + block_rows - 1) / block_rows;
  return n < ny ? n : ny;
}

// Tile id t -> (bx, by, bz); false once t is past the last tile.  z / base: the walk state,
// 0 / 0 before a CTA's first tile.
KF_DEVICE bool next_tile(int32_t t, int32_t nx, int32_t ny, int32_t nz, int32_t group, const int32_t* live,
                         int32_t block_rows, int32_t& z, int32_t& base, int32_t& bx, int32_t& by, int32_t& bz) {
  int32_t rows = ny;
  if (live == nullptr) {
    const int64_t per_z = (int64_t)nx * ny;
    if (per_z <= 0 || (int64_t)t >= per_z * nz) return false;
    z = (int32_t)(t / per_z);
    base = (int32_t)(z * per_z);
  } else {
    for (;;) {
      if (z >= nz) return false;
      rows = live_row_blocks(live[z], block_rows, ny);
      if (t < base + nx * rows) break;
      base += nx * rows;
      ++z;
    }
  }
  l2_grouped_tile(t - base, rows, nx, group, by, bx);
  bz = z;
  return true;
}

}  // namespace kf
