// Host emulation of kf/tcgen05.cuh: tensor memory, tcgen05.mma with UMMA descriptors, commit, ld.
//
// TMEM is block state: 128 lanes x 512 columns of 32-bit cells, allocated in power-of-two column
// ranges (32..512).  An allocation the free columns cannot hold, a dealloc that does not match an
// allocation, an access outside the allocated columns, or columns still allocated when the
// block's last thread exits fail the launch (on the GPU a second alloc would block forever).
//
// tcgen05.mma decodes both operand descriptors in the sm_100 format (version bits 46-47 = 1,
// layout type bits 61-63: 0 none, 2 128-byte, 4 64-byte, 6 32-byte swizzle; base offset 0) and
// reads shared memory through them as kf/emu/wgmma.h does (same canonical layouts), and decodes
// the instruction descriptor: D f32, A/B f16 or bf16, transpose bits, N = bits 17-22 << 3,
// M = bits 24-28 << 4 (64: data-path layout F, row r in lane 32 * (r / 16) + r % 16 + the
// address's lane; 128: layout D, row r in lane r); kind::f8f6f4 (its own entry point: its type
// codes overlap kind::f16's) takes e4m3 only, K-major, K = 32 per instruction.  Anything else
// fails loudly.
//
// Block-scaled fp8 (kind::mxf8f6f4.block_scale, scale_vec::1X, UE8M0 scales only): the instruction
// descriptor has no D-type field (D is f32); bits 4-5 pick the byte of B's scale cells (SFB id), bit
// 23 the scale type (1 = UE8M0, required), 24-28 M >> 4 (128 only), 29-30 the byte of A's (SFA id).
// Row r of A is scaled by byte SFA id of the cell at lane r % 32, column (scale address) + r / 32,
// and column n of B by byte SFB id of lane n % 32, column + n / 32: the layout tcgen05.cp
// .32x128b.warpx4 writes, which copies 32 rows of 16 shared bytes into every 32-lane quarter, so
// all four quarters must hold the same byte (else the launch fails: a copy without warpx4).
// UE8M0 e is 2^(e - 127) exactly (e = 0: 2^-127), e = 255 NaN.  D = [D +] sum_k A B sa(r) sb(n)
// over the instruction's 32 K elements, summed in double and rounded to f32 once.
// tcgen05.cp (kf::tcgen05_cp_32x128b_warpx4) is queued with the MMAs and performed in issue order
// with them (PTX: a thread's tcgen05.cp and tcgen05.mma execute in order); it reads shared memory
// through an unswizzled descriptor (row r at start + (r / 8) * SBO + (r % 8) * 16).
//
// Completion: an issued MMA is pending.  tcgen05.commit moves the thread's pending MMAs onto the
// mbarrier as an asynchronous operation (kf/emu/mbarrier.h) that computes them when a thread
// waits on the barrier, and then arrives.  A tcgen05.ld of columns an uncompleted MMA writes
// fails ("read before the MMA completed"), so a missing commit or wait is caught, not silently
// read as stale data.
#pragma once
#include <cmath>
#include <cstdint>

#include "kf/emu/mbarrier.h"
#include "kf/emu/shared.h"
#include "kf/emu/swizzle.h"
#include "kf/emu/types.h"
#include "kf/emu/wgmma.h"

namespace kf_emu {

constexpr int kTmemLanes = 128, kTmemCols = 512;

enum UmmaKind { UMMA_F16, UMMA_F8F6F4, UMMA_MXF8F6F4, UMMA_CP_32X128B_WARPX4 };

struct UmmaOp {
  uint32_t d;  // accumulator address (MMA) or destination (tcgen05.cp)
  uint64_t desc_a, desc_b;  // tcgen05.cp: desc_a is the source
  uint32_t idesc;
  bool accumulate;
  UmmaKind kind;
  uint32_t sfa = 0, sfb = 0;  // block-scaled MMA: scale-factor addresses
};

struct Tmem {
  Mutex mu;
  float cells[kTmemLanes][kTmemCols];
  uint32_t alloc_start[8] = {}, alloc_cols[8] = {};
  int n_allocs = 0;
  uint32_t used = 0;                  // allocated columns
  uint16_t pending[kTmemCols] = {};   // MMAs issued and not yet completed, per column
  Vec<UmmaOp> issued;                 // this block's MMAs not yet committed
  Vec<Vec<UmmaOp>*> batches;          // committed batches, performed at the barrier wait
  std::atomic<uint32_t> finished{0};
};
static Tmem g_tmem;

inline bool tmem_allocated_locked(uint32_t col, uint32_t ncols) {
  for (int i = 0; i < g_tmem.n_allocs; ++i)
    if (col >= g_tmem.alloc_start[i] && col + ncols <= g_tmem.alloc_start[i] + g_tmem.alloc_cols[i]) return true;
  return false;
}

inline void tmem_alloc(uint32_t* slot, uint32_t ncols) {
  if (ncols < 32 || ncols > 512 || (ncols & (ncols - 1)))
    fail("tcgen05.alloc: %u columns; the count must be a power of two in 32..512", ncols);
  if (ctx().lane != 0) return;  // one allocation per warp (.sync.aligned)
  Lock g(g_tmem.mu);
  if (g_tmem.used + ncols > uint32_t(kTmemCols))
    fail("tcgen05.alloc: %u columns requested with %u of %d already allocated: tensor memory over-allocated "
         "(the GPU would wait forever)", ncols, g_tmem.used, kTmemCols);
  uint32_t start = 0;  // first free aligned range
  for (; start < uint32_t(kTmemCols); start += ncols) {
    bool clash = false;
    for (int i = 0; i < g_tmem.n_allocs; ++i)
      clash |= start < g_tmem.alloc_start[i] + g_tmem.alloc_cols[i] && g_tmem.alloc_start[i] < start + ncols;
    if (!clash) break;
  }
  if (start >= uint32_t(kTmemCols)) fail("tcgen05.alloc: no free aligned range of %u columns", ncols);
  g_tmem.alloc_start[g_tmem.n_allocs] = start;
  g_tmem.alloc_cols[g_tmem.n_allocs++] = ncols;
  g_tmem.used += ncols;
  *slot = start;  // lane 0, column start
}

inline void tmem_dealloc(uint32_t taddr, uint32_t ncols) {
  if (ctx().lane != 0) return;
  Lock g(g_tmem.mu);
  for (int i = 0; i < g_tmem.n_allocs; ++i)
    if (g_tmem.alloc_start[i] == (taddr & 0xffffu) && g_tmem.alloc_cols[i] == ncols && (taddr >> 16) == 0) {
      for (uint32_t c = taddr & 0xffffu; c < (taddr & 0xffffu) + ncols; ++c)
        if (g_tmem.pending[c]) fail("tcgen05.dealloc: column %u still has an MMA in flight", c);
      g_tmem.alloc_start[i] = g_tmem.alloc_start[g_tmem.n_allocs - 1];
      g_tmem.alloc_cols[i] = g_tmem.alloc_cols[--g_tmem.n_allocs];
      g_tmem.used -= ncols;
      return;
    }
  fail("tcgen05.dealloc: address 0x%x with %u columns matches no allocation", taddr, ncols);
}

inline SmemDesc decode_umma_desc(uint64_t desc, const char* which) {
  const unsigned version = unsigned(desc >> 46) & 3u, base = unsigned(desc >> 49) & 7u,
                 layout = unsigned(desc >> 61) & 7u;
  if (version != 1)
    fail("tcgen05.mma: descriptor for %s has version %u, not 1 (an sm_90 wgmma descriptor?)", which, version);
  if (base) fail("tcgen05.mma: nonzero matrix base offset in the descriptor for %s is not emulated", which);
  uint32_t swizzle;
  switch (layout) {
    case 0: swizzle = 0; break;
    case 2: swizzle = 128; break;
    case 4: swizzle = 64; break;
    case 6: swizzle = 32; break;
    default: fail("tcgen05.mma: layout type %u of the descriptor for %s is not emulated", layout, which);
  }
  const SmemDesc s{uint32_t(desc & 0x3fff) << 4, uint32_t((desc >> 16) & 0x3fff) << 4,
                   uint32_t((desc >> 32) & 0x3fff) << 4, swizzle};
  if (s.swizzle && (s.start / s.swizzle) % 8)
    fail("tcgen05.mma: the %u-byte-swizzled operand %s starts inside its 8-row atom (base offset 0)", s.swizzle,
         which);
  return s;
}

struct Idesc {
  int m, n;
  WgmmaType type;
  bool trans_a, trans_b;
};

// kind::mxf8f6f4.block_scale's descriptor (see the header comment): e4m3 x e4m3, K-major, M = 128.
struct MxIdesc {
  int m, n;
  unsigned sfa_id, sfb_id;
};
inline MxIdesc decode_mx_idesc(uint32_t i) {
  if (i & 0x7u) fail("tcgen05.mma kind::mxf8f6f4: instruction descriptor 0x%08x asks for sparsity", i);
  if (((i >> 7) & 7u) || ((i >> 10) & 7u))
    fail("tcgen05.mma kind::mxf8f6f4: A/B types %u/%u: only e4m3 (0) is emulated", (i >> 7) & 7u, (i >> 10) & 7u);
  if (i & (3u << 13)) fail("tcgen05.mma: negated operands are not emulated");
  if (i & (3u << 15)) fail("tcgen05.mma kind::mxf8f6f4: MN-major operands are not emulated (K-major only)");
  if (!((i >> 23) & 1u)) fail("tcgen05.mma kind::mxf8f6f4: scale type bit 23 is 0 (UE4M3); mxf8f6f4 takes UE8M0");
  if (i >> 31) fail("tcgen05.mma kind::mxf8f6f4: bit 31 (K size) must be 0");
  const MxIdesc d{int((i >> 24) & 31u) << 4, int((i >> 17) & 63u) << 3, (i >> 29) & 3u, (i >> 4) & 3u};
  if (d.m != 128 || d.n < 16 || d.n > 256 || d.n % 16)
    fail("tcgen05.mma kind::mxf8f6f4.block_scale cta_group::1: M = %d, N = %d is not emulated (M = 128)", d.m, d.n);
  return d;
}

inline Idesc decode_idesc(uint32_t i, UmmaKind kind) {
  if (kind == UMMA_MXF8F6F4) {
    const MxIdesc mx = decode_mx_idesc(i);
    return Idesc{mx.m, mx.n, WG_E4M3, false, false};
  }
  if (i & 0x7u) fail("tcgen05.mma: instruction descriptor 0x%08x asks for sparsity or saturation", i);
  if (((i >> 4) & 3u) != 1u) fail("tcgen05.mma: instruction descriptor 0x%08x: D type is not f32", i);
  const unsigned at = (i >> 7) & 7u, bt = (i >> 10) & 7u;
  if (kind == UMMA_F16 && (at != bt || at > 1))
    fail("tcgen05.mma kind::f16: A/B types %u/%u are not both f16 (0) or bf16 (1)", at, bt);
  if (kind == UMMA_F8F6F4 && (at || bt))
    fail("tcgen05.mma kind::f8f6f4: A/B types %u/%u: only e4m3 (0) is emulated", at, bt);
  if (kind == UMMA_F8F6F4 && (i & (3u << 15)))
    fail("tcgen05.mma kind::f8f6f4: MN-major 8-bit operands are not emulated (kernforge issues K-major only)");
  if (i & (3u << 13)) fail("tcgen05.mma: negated operands are not emulated");
  const Idesc d{int((i >> 24) & 31u) << 4, int((i >> 17) & 63u) << 3,
                kind == UMMA_F8F6F4 ? WG_E4M3 : at ? WG_BF16 : WG_F16, bool((i >> 15) & 1u), bool((i >> 16) & 1u)};
  if (d.m == 64 ? (d.n < 8 || d.n > 256 || d.n % 8) : d.m == 128 ? (d.n < 16 || d.n > 256 || d.n % 16) : true)
    fail("tcgen05.mma cta_group::1: M = %d, N = %d is not a valid shape", d.m, d.n);
  return d;
}

// Lane of row r of an M-row accumulator at TMEM address d (data-path layouts F and D).
inline uint32_t umma_lane(int m, uint32_t d, int r) {
  return (d >> 16) + (m == 64 ? uint32_t(32 * (r / 16) + r % 16) : uint32_t(r));
}

// UE8M0 exponent byte -> its value, exactly: 2^(e - 127), e = 255 NaN.
inline double ue8m0_value(uint8_t e) { return e == 255 ? double(NAN) : std::ldexp(1.0, int(e) - 127); }

// Byte `id` of the scale factor of row (or column) r in the cells at column `col`: lane r % 32 of
// every lane quarter, column col + r / 32; the quarters must agree (tcgen05.cp ... .warpx4).
inline uint8_t scale_byte(uint32_t col, int r, unsigned id, const char* which) {
  const uint32_t c = col + uint32_t(r / 32);
  if (!tmem_allocated_locked(c, 1))
    fail("tcgen05.mma block_scale: scale factor column %u of %s is not allocated tensor memory", c, which);
  uint8_t b[4];
  for (int q = 0; q < 4; ++q) {
    uint32_t bits;
    std::memcpy(&bits, &g_tmem.cells[32 * q + r % 32][c], 4);
    b[q] = uint8_t(bits >> (8 * id));
  }
  if (b[1] != b[0] || b[2] != b[0] || b[3] != b[0])
    fail("tcgen05.mma block_scale: %s's scale factor %d (column %u, lane %d) differs between the four lane "
         "quarters (%u %u %u %u): copy the factors with tcgen05.cp .warpx4", which, r, c, r % 32, b[0], b[1], b[2],
         b[3]);
  return b[0];
}

inline void cp_execute(const UmmaOp& op) {
  const uint32_t col0 = op.d & 0xffffu;
  const SmemDesc s = decode_umma_desc(op.desc_a, "the tcgen05.cp source");
  for (int r = 0; r < 32; ++r) {
    const uint32_t addr = s.start + uint32_t(r / 8) * s.sbo + uint32_t(r % 8) * 16u;
    if (addr + 16 > smem_size()) fail("tcgen05.cp: source row %d at shared address %u is outside shared memory", r, addr);
    for (int q = 0; q < 4; ++q)
      for (int c = 0; c < 4; ++c) std::memcpy(&g_tmem.cells[32 * q + r][col0 + c], smem_base() + addr + 4 * c, 4);
  }
  for (int c = 0; c < 4; ++c) g_tmem.pending[col0 + c] -= 1;
}

inline void umma_execute(const UmmaOp& op) {
  if (op.kind == UMMA_CP_32X128B_WARPX4) return cp_execute(op);
  const Idesc id = decode_idesc(op.idesc, op.kind);
  const bool scaled = op.kind == UMMA_MXF8F6F4;
  const MxIdesc mx = scaled ? decode_mx_idesc(op.idesc) : MxIdesc{};
  const int ksteps = id.type == WG_E4M3 ? 32 : 16;
  const SmemDesc a = decode_umma_desc(op.desc_a, "A"), b = decode_umma_desc(op.desc_b, "B");
  const uint32_t col0 = op.d & 0xffffu;
  for (int r = 0; r < id.m; ++r) {
    const uint32_t lane = umma_lane(id.m, op.d, r);
    if (lane >= uint32_t(kTmemLanes)) fail("tcgen05.mma: accumulator row %d falls outside tensor memory", r);
    for (int c = 0; c < id.n; ++c) {
      double acc = 0.0;
      for (int k = 0; k < ksteps; ++k)
        acc += double(desc_elem(a, r, k, id.trans_a, id.type)) * double(desc_elem(b, c, k, id.trans_b, id.type));
      if (scaled)
        acc *= ue8m0_value(scale_byte(op.sfa & 0xffffu, r, mx.sfa_id, "A")) *
               ue8m0_value(scale_byte(op.sfb & 0xffffu, c, mx.sfb_id, "B"));
      float& dst = g_tmem.cells[lane][col0 + c];
      dst = float((op.accumulate ? double(dst) : 0.0) + acc);
    }
  }
  for (int c = 0; c < id.n; ++c) g_tmem.pending[col0 + c] -= 1;
}

inline void tcgen05_mma(uint32_t d, uint64_t desc_a, uint64_t desc_b, uint32_t idesc, int accumulate,
                        UmmaKind kind, uint32_t sfa = 0, uint32_t sfb = 0) {
  const Idesc id = decode_idesc(idesc, kind);
  Lock g(g_tmem.mu);
  const uint32_t col0 = d & 0xffffu;
  if (!tmem_allocated_locked(col0, uint32_t(id.n)))
    fail("tcgen05.mma: accumulator columns %u..%u are not allocated tensor memory", col0, col0 + id.n - 1);
  if (kind == UMMA_MXF8F6F4 && ((sfa >> 16) || (sfb >> 16)))
    fail("tcgen05.mma block_scale: scale-factor addresses 0x%x / 0x%x must start at lane 0", sfa, sfb);
  for (int c = 0; c < id.n; ++c) g_tmem.pending[col0 + c] += 1;
  UmmaOp op{d, desc_a, desc_b, idesc, accumulate != 0, kind};
  op.sfa = sfa;
  op.sfb = sfb;
  g_tmem.issued.push(op);
}

// tcgen05.cp.cta_group::1.32x128b.warpx4: 32 rows x 16 bytes of shared memory into columns
// taddr .. taddr + 3 of lanes r, 32 + r, 64 + r and 96 + r; queued in order with the MMAs.
inline void tcgen05_cp_32x128b_warpx4(uint32_t taddr, uint64_t sdesc) {
  if (taddr >> 16) fail("tcgen05.cp .32x128b.warpx4: destination 0x%x must start at lane 0", taddr);
  if ((sdesc >> 61) & 7u) fail("tcgen05.cp: only an unswizzled source descriptor is emulated");
  decode_umma_desc(sdesc, "the tcgen05.cp source");
  Lock g(g_tmem.mu);
  const uint32_t col0 = taddr & 0xffffu;
  if (!tmem_allocated_locked(col0, 4)) fail("tcgen05.cp: columns %u..%u are not allocated tensor memory", col0, col0 + 3);
  for (int c = 0; c < 4; ++c) g_tmem.pending[col0 + c] += 1;
  g_tmem.issued.push(UmmaOp{taddr, sdesc, 0, 0, false, UMMA_CP_32X128B_WARPX4});
}

struct UmmaBatchRef {
  Vec<UmmaOp>* ops;
};
inline void perform_umma_batch(const unsigned char* payload) {
  UmmaBatchRef ref;
  std::memcpy(&ref, payload, sizeof ref);
  Lock g(g_tmem.mu);
  for (size_t i = 0; i < ref.ops->size(); ++i) umma_execute((*ref.ops)[i]);
  ref.ops->clear();
}

// The committed MMAs complete (and the barrier gets its arrival) when a thread waits on `bar`.
inline void tcgen05_commit(const void* bar) {
  Vec<UmmaOp>* batch = new Vec<UmmaOp>;
  {
    Lock g(g_tmem.mu);
    for (size_t i = 0; i < g_tmem.issued.size(); ++i) batch->push(g_tmem.issued[i]);
    g_tmem.issued.clear();
    g_tmem.batches.push(batch);
  }
  mbarrier_attach_copy(bar, perform_umma_batch, UmmaBatchRef{batch}, 1);
  mbarrier_arrive(bar, 1, 1);  // the one byte of "transaction" is the batch: done only once performed
}

// .16x256b: this thread's 4 * nt registers of the warp's 16 lanes from taddr.
inline void tmem_ld_16x256b(float* d, uint32_t taddr, int nt) {
  const uint32_t lane0 = taddr >> 16, col0 = taddr & 0xffffu, quarter = 32u * (ctx().warp % 4u);
  if (lane0 < quarter || lane0 + 16 > quarter + 32)
    fail("tcgen05.ld: warp %u may access lanes %u..%u only, not %u..%u", ctx().warp, quarter, quarter + 31, lane0,
         lane0 + 15);
  Lock g(g_tmem.mu);
  if (!tmem_allocated_locked(col0, uint32_t(8 * nt)))
    fail("tcgen05.ld: columns %u..%u are not allocated tensor memory", col0, col0 + 8 * nt - 1);
  for (uint32_t c = col0; c < col0 + 8u * nt; ++c)
    if (g_tmem.pending[c])
      fail("tcgen05.ld: column %u read before the tcgen05.mma writing it completed (no tcgen05.commit + mbarrier "
           "wait in between)", c);
  const int g_ = int(ctx().lane / 4), t = int(ctx().lane % 4);
  for (int j = 0; j < nt; ++j)
    for (int q = 0; q < 4; ++q)
      d[4 * j + q] = g_tmem.cells[lane0 + g_ + 8 * (q / 2)][col0 + 8 * j + 2 * t + q % 2];
}

inline void tmem_block_start() {
  Lock g(g_tmem.mu);
  g_tmem.n_allocs = 0;
  g_tmem.used = 0;
  std::memset(g_tmem.pending, 0, sizeof g_tmem.pending);
  g_tmem.issued.clear();
  for (size_t i = 0; i < g_tmem.batches.size(); ++i) delete g_tmem.batches[i];
  g_tmem.batches.clear();
  for (auto& lane : g_tmem.cells)
    for (float& c : lane) c = __builtin_nanf("");  // poison: a read of unwritten TMEM shows
  g_tmem.finished.store(0);
}
// The block's last thread to exit checks that every column was deallocated.
inline void tmem_thread_finish() {
  if (g_tmem.finished.fetch_add(1) + 1 != ctx().block->nthreads) return;
  Lock g(g_tmem.mu);
  if (g_tmem.used) fail("tcgen05: %u tensor-memory columns still allocated when the block exited", g_tmem.used);
}
static RegisterHook tmem_block_hook(hooks().block_start, tmem_block_start);
static RegisterHook tmem_finish_hook(hooks().thread_finish, tmem_thread_finish);

}  // namespace kf_emu

namespace kf {

KF_DEVICE uint64_t make_umma_desc(const void* ptr, uint32_t lbo_bytes, uint32_t sbo_bytes, uint32_t layout = 0) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
  if (addr >= (1u << 18))
    kf_emu::fail("make_umma_desc: emulated shared address %u does not fit the 14-bit start field", addr);
  uint64_t desc = 0;
  desc |= static_cast<uint64_t>((addr >> 4) & 0x3FFF);
  desc |= static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFF) << 16;
  desc |= static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFF) << 32;
  desc |= static_cast<uint64_t>(1) << 46;
  desc |= static_cast<uint64_t>(layout & 7) << 61;
  return desc;
}
KF_DEVICE void tmem_alloc(uint32_t* slot, uint32_t ncols) { kf_emu::tmem_alloc(slot, ncols); }
KF_DEVICE void tmem_relinquish_alloc_permit() {}
KF_DEVICE void tmem_dealloc(uint32_t taddr, uint32_t ncols) { kf_emu::tmem_dealloc(taddr, ncols); }
// Emulated tcgen05 operations take effect in program order under one lock: nothing to fence.
KF_DEVICE void tcgen05_fence_before() {}
KF_DEVICE void tcgen05_fence_after() {}
KF_DEVICE void tcgen05_mma_f16(uint32_t d_tmem, uint64_t desc_a, uint64_t desc_b, uint32_t idesc, int accumulate) {
  kf_emu::tcgen05_mma(d_tmem, desc_a, desc_b, idesc, accumulate, kf_emu::UMMA_F16);
}
KF_DEVICE void tcgen05_mma_f8f6f4(uint32_t d_tmem, uint64_t desc_a, uint64_t desc_b, uint32_t idesc,
                                  int accumulate) {
  kf_emu::tcgen05_mma(d_tmem, desc_a, desc_b, idesc, accumulate, kf_emu::UMMA_F8F6F4);
}
KF_DEVICE void tcgen05_mma_mxf8f6f4_block_scale(uint32_t d_tmem, uint64_t desc_a, uint64_t desc_b, uint32_t idesc,
                                                uint32_t sfa_tmem, uint32_t sfb_tmem, int accumulate) {
  kf_emu::tcgen05_mma(d_tmem, desc_a, desc_b, idesc, accumulate, kf_emu::UMMA_MXF8F6F4, sfa_tmem, sfb_tmem);
}
KF_DEVICE void tcgen05_cp_32x128b_warpx4(uint32_t taddr, uint64_t sdesc) {
  kf_emu::tcgen05_cp_32x128b_warpx4(taddr, sdesc);
}
KF_DEVICE void tcgen05_commit(uint64_t* bar) { kf_emu::tcgen05_commit(bar); }
KF_DEVICE void tmem_wait_ld() {}
template <int NT> KF_DEVICE void tmem_ld_16x256b(float* d, uint32_t taddr) {
  static_assert(NT >= 1 && NT <= 32, "tcgen05.ld 16x256b: 1..32 atoms of 8 columns");
  kf_emu::tmem_ld_16x256b(d, taddr, NT);
}

}  // namespace kf
