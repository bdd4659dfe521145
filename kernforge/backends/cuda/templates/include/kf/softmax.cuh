// Online softmax on an accumulator fragment (T.online_softmax) and its final normalisation.
//
// Pure CUDA C++ (shuffles, exp2f, __syncthreads): compiles unchanged under host emulation.
//
// Layout (backends/cuda/layouts.py, AccumLayout): the block's first WM*WN warps tile an M x N
// accumulator, warp w at row block w % WM and column block w / WM; each warp holds MT x NT
// m16n8 tiles, register r = ((mi * NT) + ni) * 4 + q is row
//   mi*16*WM + (w % WM)*16 + lane/4 + 8*(q/2),  column (w / WM)*(N/WN) + ni*8 + 2*(lane%4) + q%2.
// A per-row value (RowLayout) sits in register s = mi*2 + h of *every* thread of the block
// (warps past WM*WN included), for row mi*16*WM + (w % WM)*16 + lane/4 + 8*h: replicated on
// the quad and on all warps with the same w % WM, so every thread updates its copy itself.
//
// One step, per row (the semantics of ir.OnlineSoftmax, s = scale_log2):
//   m_new   = max(m, max_j x_j)           (NaN-propagating, kf_max)
//   shift   = m_new == -inf ? 0 : m_new    (a fully masked row stays -inf and gives 0, not NaN)
//   rescale = exp2((m - shift) * s);  x_j = exp2((x_j - shift) * s);  l = l * rescale + sum_j x_j
// Row reductions: the thread's own registers (ni, then q), then the quad (quad_allreduce),
// then, when several warp columns share a row or some warps hold none of it, a pass through
// `scratch` (2 * M * WN floats of shared memory, used by nothing else: max in the first half,
// sum in the second).  Cost: two __syncthreads in that case, none otherwise.  No barrier is
// needed at the end: the next step writes the max half only after every thread passed the
// second barrier (so had read it), and the sum half only after its own first barrier.
// Every thread of the block must call it (it may contain __syncthreads()).
#pragma once
#include "kf/common.cuh"
#include "kf/reduce.cuh"

namespace kf {

template <int MT, int NT, int WM, int WN, int WARPS>
struct AccumShape {
  static constexpr int M = MT * 16 * WM;
  static constexpr int REGS = MT * NT * 4;
  static constexpr int ROWS = MT * 2;  // RowLayout registers per thread
  static constexpr bool CROSS_WARP = WN > 1 || WM * WN < WARPS;
  static_assert(WM * WN <= WARPS, "the accumulator uses more warps than the block has");

  // Whether this thread's warp holds accumulator tiles.  A compile-time `true` when every warp
  // does: a runtime test of threadIdx would make the row reductions a divergent path to ptxas,
  // which then serializes every wgmma of the kernel around it (advisory C7520, one
  // WARPGROUP.DEPBAR per HGMMA).
  static KF_DEVICE bool owner() { return WM * WN >= WARPS || (threadIdx.x >> 5) < WM * WN; }
  static KF_DEVICE int row(int s) {
    const int t = threadIdx.x;
    return (s >> 1) * 16 * WM + ((t >> 5) % WM) * 16 + ((t & 31) >> 2) + 8 * (s & 1);
  }
  static KF_DEVICE int reg(int s, int ni, int q) { return ((s >> 1) * NT + ni) * 4 + (s & 1) * 2 + q; }
};

// part[s], this thread's quad-reduced value of row s (meaningful on owner warps), becomes the
// row's value over all WN warp columns, in every thread of the block.  `area`: M * WN floats of
// shared memory; warp column c's quad leaders write area[c * M + row], then one barrier.
template <typename Op, typename S, int WM, int WN>
KF_DEVICE void combine_warp_columns(float (&part)[S::ROWS], float* area) {
  const int t = threadIdx.x;
  if (S::owner() && (t & 3) == 0) {
#pragma unroll
    for (int s = 0; s < S::ROWS; ++s) area[((t >> 5) / WM) * S::M + S::row(s)] = part[s];
  }
  __syncthreads();
#pragma unroll
  for (int s = 0; s < S::ROWS; ++s) {
    float v = area[S::row(s)];
    for (int w = 1; w < WN; ++w) v = Op::apply(v, area[w * S::M + S::row(s)]);
    part[s] = v;
  }
}

template <int MT, int NT, int WM, int WN, int WARPS>
KF_DEVICE void online_softmax_step(float (&x)[MT * NT * 4], float (&m)[MT * 2], float (&l)[MT * 2],
                                   float (&rescale)[MT * 2], float scale_log2, float* scratch) {
  using S = AccumShape<MT, NT, WM, WN, WARPS>;
  const bool owner = S::owner();
  float part[S::ROWS];
  // tile row max
#pragma unroll
  for (int s = 0; s < S::ROWS; ++s) {
    float v = -kf_inf<float>();
    if (owner) {
#pragma unroll
      for (int ni = 0; ni < NT; ++ni)
#pragma unroll
        for (int q = 0; q < 2; ++q) v = MaxOp::apply(v, x[S::reg(s, ni, q)]);
      v = quad_allreduce<MaxOp>(v);
    }
    part[s] = v;
  }
  if (S::CROSS_WARP) combine_warp_columns<MaxOp, S, WM, WN>(part, scratch);
  // new running max, rescale factor, shift
  float shift[S::ROWS];
#pragma unroll
  for (int s = 0; s < S::ROWS; ++s) {
    const float m_new = MaxOp::apply(m[s], part[s]);
    shift[s] = m_new == -kf_inf<float>() ? 0.0f : m_new;
    rescale[s] = exp2f((m[s] - shift[s]) * scale_log2);
    m[s] = m_new;
  }
  // probabilities and their row sums
#pragma unroll
  for (int s = 0; s < S::ROWS; ++s) {
    float v = 0.0f;
    if (owner) {
#pragma unroll
      for (int ni = 0; ni < NT; ++ni)
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          float& e = x[S::reg(s, ni, q)];
          e = exp2f((e - shift[s]) * scale_log2);
          v = SumOp::apply(v, e);
        }
      v = quad_allreduce<SumOp>(v);
    }
    part[s] = v;
  }
  if (S::CROSS_WARP) combine_warp_columns<SumOp, S, WM, WN>(part, scratch + WN * S::M);
#pragma unroll
  for (int s = 0; s < S::ROWS; ++s) l[s] = l[s] * rescale[s] + part[s];
}

// The same step for one row held in memory by one thread (any fragment the renderer could
// not keep in accumulator registers): x[j * stride] for j < n.
template <typename At>
KF_DEVICE void online_softmax_row(At x, int n, float& m, float& l, float& rescale, float scale_log2) {
  float mx = -kf_inf<float>();
  for (int j = 0; j < n; ++j) mx = MaxOp::apply(mx, x(j));
  const float m_new = MaxOp::apply(m, mx);
  const float shift = m_new == -kf_inf<float>() ? 0.0f : m_new;
  rescale = exp2f((m - shift) * scale_log2);
  m = m_new;
  float sum = 0.0f;
  for (int j = 0; j < n; ++j) {
    const float p = exp2f((x(j) - shift) * scale_log2);
    x(j) = p;
    sum += p;
  }
  l = l * rescale + sum;
}

// Final normalisation of a finished row: the natural-log log-sum-exp of the scaled scores,
// m * sm_scale + ln(l) (m is the running max of the raw scores), or `empty` for a row that
// saw nothing (l == 0); and the factor an output row is multiplied by, 1 / l (0 when empty).
KF_DEVICE float softmax_lse(float m, float l, float sm_scale, float empty) {
  return l > 0.0f ? m * sm_scale + logf(l) : empty;
}
KF_DEVICE float softmax_inv_sum(float l) { return l > 0.0f ? 1.0f / l : 0.0f; }

}  // namespace kf
