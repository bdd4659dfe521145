// Host emulation of kf/wgmma.cuh: wgmma.mma_async with shared-memory descriptors.
//
// Operands are read through the descriptor exactly as the PTX ISA defines the
// no-swizzle canonical layouts ("Shared Memory Matrix Layout", 8x8 core
// matrices of 16-bit elements, each 8 rows of 16 contiguous bytes):
//   K-major  (not transposed): elem(mn, k) at start + (mn/8)*SBO + (k/8)*LBO + (mn%8)*16 + (k%8)*2
//   MN-major (transposed):     elem(mn, k) at start + (mn/8)*SBO + (k/8)*LBO + (k%8)*16 + (mn%8)*2
// fp8 e4m3 (m64nNk32, K-major only; core matrices of 8 rows x 16 one-byte elements):
//   elem(mn, k) at start + (mn/8)*SBO + (k/16)*LBO + (mn%8)*16 + k%16
// (LBO: distance between core matrices adjacent along K; SBO: along M or N.)
// Swizzled layouts (descriptor layout type 1/2/3 = 128/64/32-byte swizzle, S bytes per row,
// E = S / element bytes elements per row): the unswizzled address
//   K-major:  start + (mn/8)*SBO + (mn%8)*S + k*bytes            (LBO unused)
//   MN-major: start + (mn/E)*LBO + (mn%E)*bytes + (k/8)*SBO + (k%8)*S
// is then swizzled with kf_emu::swizzle_addr (kf/emu/swizzle.h), as TMA's writes are.  A swizzled
// start must lie in row 0 of its 8-row atom (base offset 0, the atom 8*S-byte aligned); a nonzero
// base offset is not emulated and fails loudly.
//
// Accumulator layout (PTX ISA "wgmma .m64nNk16 register fragment D"): thread
// in warp w of the warpgroup, g = lane/4, t = lane%4, holds
//   d[4*j + q] = D(16*w + g + 8*(q/2), 8*j + 2*t + q%2).
//
// A from registers (wgmma_m64nNk16_f32_bf16_rs; PTX ISA "wgmma .m64nNk16 register fragment
// layout for matrix A"): the thread (w, g, t) holds a[r] = {A(16w + g + 8(r%2), 2t + 8(r/2) + h),
// h = 0 low / 1 high half}, so the full A rows 16w + g and 16w + g + 8 this thread's D elements
// need are spread over the four lanes 4g .. 4g+3 of its own warp.  Each thread's four registers
// are copied into the op at issue (the GPU reads the values the registers hold at issue; a
// fragment array may be out of scope by the wait, as a per-k-step temporary is), and at execution
// the warp's lanes swap those copies through the warp exchange (kf/emu/warp.h, the mechanism of
// shuffles and mma.sync: every lane executes the same ops at the same wait, one exchange per
// register-A op), and each lane rebuilds its two A rows.  Only the B operand is digested.
//
// Completion semantics: wgmma is asynchronous.  An issued wgmma is queued in the
// thread's open group, commit closes the group, and wait<N> executes every
// group but the newest N, reading shared memory *then*.  So reading d before
// the covering wait, or overwriting an operand tile before it, gives the wrong
// answer here as it can on the GPU.  Ops never waited for are dropped when the
// thread returns (their registers are gone).
#pragma once
#include <cstdint>
#include <cstring>

#include "kf/emu/shared.h"
#include "kf/emu/swizzle.h"
#include "kf/emu/types.h"
#include "kf/emu/warp.h"

namespace kf_emu {

struct SmemDesc {
  uint32_t start, lbo, sbo;
  uint32_t swizzle;  // bytes per swizzled row: 0 (none), 128, 64, 32
};

inline SmemDesc decode_desc(uint64_t desc, const char* which) {
  static const uint32_t kSwizzleBytes[4] = {0, 128, 64, 32};  // layout type 0..3
  const unsigned layout = unsigned(desc >> 62) & 3u, base = unsigned(desc >> 49) & 7u;
  if (base) fail("wgmma: nonzero matrix base offset in the descriptor for %s is not emulated", which);
  const SmemDesc s{uint32_t(desc & 0x3fff) << 4, uint32_t((desc >> 16) & 0x3fff) << 4,
                   uint32_t((desc >> 32) & 0x3fff) << 4, kSwizzleBytes[layout]};
  if (s.swizzle && (s.start / s.swizzle) % 8)
    fail("wgmma: the %u-byte-swizzled operand %s starts at shared address %u, inside its 8-row atom "
         "(row %u): the atom is not %u-byte aligned (base offset 0)", s.swizzle, which, s.start,
         (s.start / s.swizzle) % 8, 8 * s.swizzle);
  return s;
}

// The unswizzled byte address of element (mn, k) of a swizzled operand (see the header comment).
inline uint32_t swizzled_elem_addr(const SmemDesc& s, int mn, int k, bool mn_major, uint32_t bytes) {
  if (!mn_major) return s.start + uint32_t(mn / 8) * s.sbo + uint32_t(mn % 8) * s.swizzle + uint32_t(k) * bytes;
  const uint32_t per_row = s.swizzle / bytes;
  return s.start + uint32_t(mn) / per_row * s.lbo + uint32_t(mn) % per_row * bytes + uint32_t(k / 8) * s.sbo +
         uint32_t(k % 8) * s.swizzle;
}

enum WgmmaType { WG_F16, WG_BF16, WG_E4M3 };

inline float desc_elem(const SmemDesc& s, int mn, int k, bool mn_major, WgmmaType type) {
  if (type == WG_E4M3) {
    const uint32_t addr =
        s.swizzle ? swizzle_addr(swizzled_elem_addr(s, mn, k, false, 1), s.swizzle)
                  : s.start + uint32_t(mn / 8) * s.sbo + uint32_t(k / 16) * s.lbo + uint32_t(mn % 8) * 16 + uint32_t(k % 16);
    if (addr + 1 > smem_size()) fail("wgmma: operand element at shared address %u is outside shared memory", addr);
    return e4m3_bits_to_float(smem_base()[addr]);
  }
  const bool bf16 = type == WG_BF16;
  const uint32_t addr =
      s.swizzle ? swizzle_addr(swizzled_elem_addr(s, mn, k, mn_major, 2), s.swizzle)
                : s.start + uint32_t(mn / 8) * s.sbo + uint32_t(k / 8) * s.lbo +
                      (mn_major ? uint32_t(k % 8) * 16 + uint32_t(mn % 8) * 2 : uint32_t(mn % 8) * 16 + uint32_t(k % 8) * 2);
  if (addr + 2 > smem_size()) fail("wgmma: operand element at shared address %u is outside shared memory", addr);
  uint16_t bits;
  std::memcpy(&bits, smem_base() + addr, 2);
  return bf16 ? bf16_bits_to_float(bits) : f16_bits_to_float(bits);
}

struct WgmmaOp {
  float* d;
  int n;
  uint64_t desc_a, desc_b;
  bool accumulate;
  WgmmaType type;
  bool trans_a, trans_b;
  uint64_t group;  // commit-group number (the open group is `committed`)
  uint64_t digest;  // of the operand elements this thread reads, at issue (operand_digest)
  bool a_in_regs;   // the register-A form: desc_a unused, a_regs this thread's A fragment at issue
  uint32_t a_regs[4];
};

struct WgmmaState {
  Vec<WgmmaOp> ops;  // issue order
  uint64_t committed = 0;
};
static thread_local WgmmaState g_wgmma;

// The two rows of a register-A operand this thread's D elements need, A(16w + g + 8*rr, k) at
// rows[rr][k], gathered from the fragments its warp's lanes 4g .. 4g+3 held at issue.
inline void gather_a_rows(const WgmmaOp& op, float (&rows)[2][16]) {
  if (my_warp().lanes != kWarpSize) fail("wgmma with A in registers: the warpgroup's warps must be whole (32 lanes)");
  const uint64_t mine[2] = {op.a_regs[0] | uint64_t(op.a_regs[1]) << 32, op.a_regs[2] | uint64_t(op.a_regs[3]) << 32};
  auto lanes = exchange(mine, 2);
  const int g = int(ctx().lane) / 4;
  for (int rr = 0; rr < 2; ++rr)
    for (int k = 0; k < 16; ++k) {
      const int src = 4 * g + (k % 8) / 2, reg = rr + 2 * (k / 8), half = k % 2;  // the layout above
      const uint32_t word = uint32_t(lanes[src][reg / 2] >> (32 * (reg % 2)));
      rows[rr][k] = bf16_bits_to_float(uint16_t(word >> (16 * half)));
    }
}

inline void execute(const WgmmaOp& op) {
  const SmemDesc a = op.a_in_regs ? SmemDesc{} : decode_desc(op.desc_a, "A");
  const SmemDesc b = decode_desc(op.desc_b, "B");
  float a_rows[2][16];
  if (op.a_in_regs) gather_a_rows(op, a_rows);
  const int lane = int(ctx().lane), w = int(ctx().warp % 4), g = lane / 4, t = lane % 4;
  for (int j = 0; j < op.n / 8; ++j)
    for (int q = 0; q < 4; ++q) {
      const int row = 16 * w + g + 8 * (q / 2), col = 8 * j + 2 * t + q % 2;
      double acc = 0.0;
      for (int k = 0; k < (op.type == WG_E4M3 ? 32 : 16); ++k)
        acc += double(op.a_in_regs ? a_rows[q / 2][k] : desc_elem(a, row, k, op.trans_a, op.type)) *
               double(desc_elem(b, col, k, op.trans_b, op.type));
      float& dst = op.d[4 * j + q];
      dst = float((op.accumulate ? double(dst) : 0.0) + acc);
    }
}

// FNV-1a over the bits of the operand elements this thread's share of `op` reads (A rows
// 16w + g (+8), B columns 8j + 2t (+1), every k).  Taken at issue and again when the op executes
// at its wait: operands are read asynchronously anywhere in between on the GPU, so bytes that
// changed in that window (a ring stage refilled before the wgmmas reading it retired) are a race,
// reported as an error rather than left to a result that depends on the emulator's timing.
inline uint64_t operand_digest(const WgmmaOp& op) {
  const SmemDesc a = op.a_in_regs ? SmemDesc{} : decode_desc(op.desc_a, "A");
  const SmemDesc b = decode_desc(op.desc_b, "B");
  const int lane = int(ctx().lane), w = int(ctx().warp % 4), g = lane / 4, t = lane % 4;
  const int K = op.type == WG_E4M3 ? 32 : 16;
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](float x) {
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    h = (h ^ bits) * 1099511628211ull;
  };
  for (int k = 0; k < K; ++k) {
    for (int r = 0; r < 2 && !op.a_in_regs; ++r) mix(desc_elem(a, 16 * w + g + 8 * r, k, op.trans_a, op.type));
    for (int j = 0; j < op.n / 8; ++j)
      for (int c = 0; c < 2; ++c) mix(desc_elem(b, 8 * j + 2 * t + c, k, op.trans_b, op.type));
  }
  return h;
}

inline void wgmma_issue(float* d, int n, uint64_t desc_a, uint64_t desc_b, int scale_d, WgmmaType type, int ta,
                        int tb) {
  WgmmaOp op{d, n, desc_a, desc_b, scale_d != 0, type, ta != 0, tb != 0, g_wgmma.committed, 0, false, {}};
  op.digest = operand_digest(op);
  g_wgmma.ops.push(op);
}
inline void wgmma_issue_rs(float* d, int n, const uint32_t (&a)[4], uint64_t desc_b, int scale_d, int tb) {
  WgmmaOp op{d, n, 0, desc_b, scale_d != 0, WG_BF16, false, tb != 0, g_wgmma.committed, 0, true, {}};
  std::memcpy(op.a_regs, a, sizeof op.a_regs);
  op.digest = operand_digest(op);
  g_wgmma.ops.push(op);
}
inline void wgmma_commit() { g_wgmma.committed += 1; }
// Executes every op of the committed groups but the newest n, in issue order.
inline void wgmma_wait(int n) {
  WgmmaState& s = g_wgmma;
  if (s.committed < uint64_t(n)) return;
  const uint64_t limit = s.committed - uint64_t(n);
  for (size_t i = 0; i < s.ops.size(); ++i)
    if (s.ops[i].group < limit) {
      if (operand_digest(s.ops[i]) != s.ops[i].digest)
        fail("wgmma: its operands in shared memory changed between the wgmma's issue and the wait that "
             "retired it (a stage refilled before the wgmmas reading it completed)");
      execute(s.ops[i]);
    }
  s.ops.retain([limit](const WgmmaOp& op) { return op.group >= limit; });
}
inline void wgmma_reset() {
  g_wgmma.ops.clear();
  g_wgmma.committed = 0;
}
static RegisterHook wgmma_reset_hook(hooks().thread_start, wgmma_reset);

}  // namespace kf_emu

namespace kf {

KF_DEVICE uint64_t make_smem_desc(const void* ptr, uint32_t lbo_bytes, uint32_t sbo_bytes, uint32_t layout = 0) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
  if (addr >= (1u << 18))
    kf_emu::fail("make_smem_desc: emulated shared address %u does not fit the descriptor's 14-bit start field "
                 "(shared window over 256 KB)", addr);
  uint64_t desc = 0;
  desc |= static_cast<uint64_t>((addr >> 4) & 0x3FFF);
  desc |= static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFF) << 16;
  desc |= static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFF) << 32;
  desc |= static_cast<uint64_t>(layout & 3) << 62;
  return desc;
}

KF_DEVICE void wgmma_fence() {}
KF_DEVICE void wgmma_commit() { kf_emu::wgmma_commit(); }
template <int N> KF_DEVICE void wgmma_wait() { kf_emu::wgmma_wait(N); }
// A compiler-ordering fence on the GPU (kf/wgmma.cuh); the emulated wgmma reads and writes d
// at the wait, so there is nothing to order here.
template <int R> KF_DEVICE void wgmma_fence_operand(float (&)[R]) {}

template <int N, int TRANS_A, int TRANS_B>
KF_DEVICE void wgmma_m64nNk16_f32_bf16(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  static_assert(N % 8 == 0 && N >= 8 && N <= 256, "wgmma m64nNk16: N is a multiple of 8 in 8..256");
  kf_emu::wgmma_issue(d, N, desc_a, desc_b, scale_d, kf_emu::WG_BF16, TRANS_A, TRANS_B);
}
template <int N, int TRANS_A, int TRANS_B>
KF_DEVICE void wgmma_m64nNk16_f32_f16(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  static_assert(N % 8 == 0 && N >= 8 && N <= 256, "wgmma m64nNk16: N is a multiple of 8 in 8..256");
  kf_emu::wgmma_issue(d, N, desc_a, desc_b, scale_d, kf_emu::WG_F16, TRANS_A, TRANS_B);
}
template <int N>
KF_DEVICE void wgmma_m64nNk32_f32_e4m3(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  static_assert(N % 8 == 0 && N >= 8 && N <= 256, "wgmma m64nNk32: N is a multiple of 8 in 8..256");
  kf_emu::wgmma_issue(d, N, desc_a, desc_b, scale_d, kf_emu::WG_E4M3, 0, 0);
}
template <int N, int TRANS_B>
KF_DEVICE void wgmma_m64nNk16_f32_bf16_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {
  static_assert(N % 8 == 0 && N >= 8 && N <= 256, "wgmma m64nNk16: N is a multiple of 8 in 8..256");
  kf_emu::wgmma_issue_rs(d, N, a, desc_b, scale_d, TRANS_B);
}

}  // namespace kf
