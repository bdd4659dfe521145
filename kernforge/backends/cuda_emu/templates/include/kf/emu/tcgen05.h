// Host emulation of kf/tcgen05.cuh: tensor memory, tcgen05.mma with UMMA descriptors, commit, ld.
//
// TMEM is CTA state: each CTA of a cluster has its own 128 lanes x 512 columns of 32-bit cells,
// allocated in power-of-two column ranges (32..512).  An allocation the free columns cannot hold,
// a dealloc that does not match an allocation, an access outside the allocated columns, or
// columns still allocated when the CTA's last thread exits fail the launch (on the GPU a second
// alloc would block forever).  Every tcgen05 instruction of a kernel must name the same
// .cta_group (PTX ISA); a launch that mixes ::1 and ::2 fails.
//
// CTA pairs (.cta_group::2; the pair of CTA r is r ^ 1, CTA "even" the one whose rank has bit 0
// clear; the launch needs a cluster of an even size >= 2):
//  * alloc / dealloc are collective over one warp of each CTA of the pair: the first warp waits
//    (bounded: a peer that never comes is a deadlock report) for the other, both must name the
//    same column count (and address), and the pair gets the same columns in both CTAs' TMEM;
//  * mma (kind::f16 and kind::f8f6f4, M = 256 only: PTX data-path layout A) is issued by one
//    thread of the pair and computes D[256 x N] = A[256 x K] B[K x N]: rows 0-127 of A from the
//    even CTA's shared memory and 128-255 from the odd CTA's, both at the descriptor's offset
//    within their CTA; B's columns 0 .. N/2-1 from the even CTA's and N/2 .. N-1 from the odd
//    CTA's, at the B descriptor's offset (each CTA holds N/2 x K); D's rows 0-127 land in the
//    even CTA's TMEM, 128-255 in the odd CTA's, row r % 128 in lane r % 128 at the same column.
//    The issuing thread must have passed a cluster barrier (kf/emu/cluster.h's cross-CTA
//    rules: the peer's shared memory and TMEM exist) and the kernel must end with one.  The
//    operand bytes of both CTAs are digested at issue and again when the MMA executes: a change
//    in between (a stage refilled, or a peer's data landing after the issue) fails the launch;
//  * commit.cta_group::2 ... .multicast::cluster [bar], ctaMask: one arrival on the barrier at
//    bar's offset in every CTA of ctaMask once the thread's MMAs completed; without .multicast
//    only [bar] gets it (a peer waiting on its own barrier then never completes: deadlock report).
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
// waits on the barrier, and then arrives; the thread's earlier committed batches run first (a
// commit tracks all of the thread's earlier tcgen05 operations, so waiting on the last commit
// is enough).  A tcgen05.ld of columns an uncompleted MMA writes
// fails ("read before the MMA completed"), so a missing commit or wait is caught, not silently
// read as stale data.
#pragma once
#include <cmath>
#include <cstdint>

#include "kf/emu/cluster.h"
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
  uint32_t issuer = 0;        // CTA rank of the issuing thread (descriptors address its shared memory)
  uint32_t cta_group = 1;
  uint64_t digest = 0;        // cta_group::2: both CTAs' operand bytes at issue (pair_digest)
};
// A committed batch; a multicast commit attaches it to several barriers, so it runs once.
struct UmmaBatch {
  Vec<UmmaOp> ops;
  uint32_t cta = 0, tid = 0;  // the committing thread
  bool done = false;
};

// One CTA's tensor memory.
struct Tmem {
  float cells[kTmemLanes][kTmemCols];
  uint32_t alloc_start[8] = {}, alloc_cols[8] = {};
  int n_allocs = 0;
  uint32_t used = 0;                  // allocated columns
  uint16_t pending[kTmemCols] = {};   // MMAs issued and not yet completed, per column
  Vec<UmmaOp> issued;                 // this CTA's MMAs not yet committed
  std::atomic<uint32_t> finished{0};  // threads of this CTA that returned
};
// A collective of one warp from each CTA of a pair (alloc / dealloc .cta_group::2).
struct PairMeet {
  uint32_t first = UINT32_MAX;  // rank of the CTA whose warp arrived first, or none
  uint32_t ncols = 0, taddr = 0, result = 0;
  std::atomic<uint32_t> gen{0};
};
struct TmemState {
  Mutex mu;  // one lock over every CTA's TMEM: a pair MMA writes two
  Tmem cta[kMaxCluster];
  Vec<UmmaBatch*> batches;  // committed batches, performed at a barrier wait
  uint32_t cta_group = 0;   // of the launch's first tcgen05 instruction (0: none yet)
  PairMeet alloc[kMaxCluster / 2], dealloc[kMaxCluster / 2];
};
static TmemState g_tmem;
inline Tmem& tmem_of(uint32_t rank) { return g_tmem.cta[rank]; }
inline Tmem& my_tmem() { return tmem_of(ctx().cta_rank); }

// PTX: all tcgen05 instructions of a kernel name the same .cta_group.  Called under g_tmem.mu.
inline void check_cta_group_locked(uint32_t group, const char* op) {
  if (!g_tmem.cta_group) g_tmem.cta_group = group;
  if (g_tmem.cta_group != group)
    fail("%s: .cta_group::%u in a kernel whose tcgen05 instructions use .cta_group::%u (PTX: all tcgen05 "
         "instructions of a kernel must name the same .cta_group)", op, group, g_tmem.cta_group);
}
inline void check_cta_group(uint32_t group, const char* op) {
  Lock g(g_tmem.mu);
  check_cta_group_locked(group, op);
}
// The calling CTA's pair peer; fails outside a cluster of an even size.
inline uint32_t pair_peer(const char* op) {
  const uint32_t n = cluster_run().size, me = ctx().cta_rank;
  if (n < 2 || n % 2)
    fail("%s: .cta_group::2 needs a cluster of an even number of CTAs (this launch has %u)", op, n);
  return me ^ 1u;
}

inline bool tmem_allocated_locked(const Tmem& t, uint32_t col, uint32_t ncols) {
  for (int i = 0; i < t.n_allocs; ++i)
    if (col >= t.alloc_start[i] && col + ncols <= t.alloc_start[i] + t.alloc_cols[i]) return true;
  return false;
}

// First aligned range of ncols columns free in every CTA of `ts` (UINT32_MAX: none).
inline uint32_t tmem_free_range_locked(Tmem* const* ts, int nt, uint32_t ncols) {
  for (int i = 0; i < nt; ++i)
    if (ts[i]->used + ncols > uint32_t(kTmemCols))
      fail("tcgen05.alloc: %u columns requested with %u of %d already allocated: tensor memory over-allocated "
           "(the GPU would wait forever)", ncols, ts[i]->used, kTmemCols);
  for (uint32_t start = 0; start < uint32_t(kTmemCols); start += ncols) {
    bool clash = false;
    for (int j = 0; j < nt; ++j)
      for (int i = 0; i < ts[j]->n_allocs; ++i)
        clash |= start < ts[j]->alloc_start[i] + ts[j]->alloc_cols[i] && ts[j]->alloc_start[i] < start + ncols;
    if (!clash) return start;
  }
  return UINT32_MAX;
}
inline void tmem_take_locked(Tmem& t, uint32_t start, uint32_t ncols) {
  t.alloc_start[t.n_allocs] = start;
  t.alloc_cols[t.n_allocs++] = ncols;
  t.used += ncols;
}
// Releases the allocation at taddr; false if none matches.
inline bool tmem_release_locked(Tmem& t, uint32_t taddr, uint32_t ncols) {
  for (int i = 0; i < t.n_allocs; ++i)
    if (t.alloc_start[i] == (taddr & 0xffffu) && t.alloc_cols[i] == ncols && (taddr >> 16) == 0) {
      for (uint32_t c = taddr & 0xffffu; c < (taddr & 0xffffu) + ncols; ++c)
        if (t.pending[c]) fail("tcgen05.dealloc: column %u still has an MMA in flight", c);
      t.alloc_start[i] = t.alloc_start[t.n_allocs - 1];
      t.alloc_cols[i] = t.alloc_cols[--t.n_allocs];
      t.used -= ncols;
      return true;
    }
  return false;
}

inline void check_ncols(uint32_t ncols, const char* op) {
  if (ncols < 32 || ncols > 512 || (ncols & (ncols - 1)))
    fail("%s: %u columns; the count must be a power of two in 32..512", op, ncols);
}

inline void tmem_alloc(uint32_t* slot, uint32_t ncols) {
  check_ncols(ncols, "tcgen05.alloc");
  if (ctx().lane != 0) return;  // one allocation per warp (.sync.aligned)
  Lock g(g_tmem.mu);
  check_cta_group_locked(1, "tcgen05.alloc");
  Tmem* t = &my_tmem();
  const uint32_t start = tmem_free_range_locked(&t, 1, ncols);
  if (start == UINT32_MAX) fail("tcgen05.alloc: no free aligned range of %u columns", ncols);
  tmem_take_locked(*t, start, ncols);
  *slot = start;  // lane 0, column start
}

inline void tmem_dealloc(uint32_t taddr, uint32_t ncols) {
  if (ctx().lane != 0) return;
  Lock g(g_tmem.mu);
  check_cta_group_locked(1, "tcgen05.dealloc");
  if (!tmem_release_locked(my_tmem(), taddr, ncols))
    fail("tcgen05.dealloc: address 0x%x with %u columns matches no allocation", taddr, ncols);
}

// Lane 0 of one warp per CTA of the pair meets the other's; the second to come runs `both`
// (under g_tmem.mu) and its result goes to both.  A peer that never comes: deadlock report.
template <class F>
inline uint32_t pair_meet(PairMeet& m, uint32_t ncols, uint32_t taddr, const char* what, F&& both) {
  const uint32_t me = ctx().cta_rank;
  uint32_t gen;
  {
    Lock g(g_tmem.mu);
    if (m.first == UINT32_MAX) {
      m.first = me;
      m.ncols = ncols;
      m.taddr = taddr;
      gen = m.gen.load(std::memory_order_acquire);
    } else {
      if (m.first == me)
        fail("%s: a second warp of CTA %u joined before the peer CTA's warp (one warp per CTA of the pair)", what,
             me);
      if (m.ncols != ncols || m.taddr != taddr)
        fail("%s: the CTAs of the pair disagree (CTA %u: 0x%x, %u columns; CTA %u: 0x%x, %u columns)", what,
             m.first, m.taddr, m.ncols, me, taddr, ncols);
      m.result = both();
      m.first = UINT32_MAX;
      m.gen.fetch_add(1, std::memory_order_acq_rel);
      futex_wake(&m.gen);
      return m.result;
    }
  }
  wait_changed(m.gen, gen, what);
  check_abort();
  return m.result;  // the peer cannot start the next round before this warp returns
}

// tcgen05.alloc.cta_group::2: the same columns in both CTAs' TMEM, written to each CTA's slot.
inline void tmem_alloc_pair(uint32_t* slot, uint32_t ncols) {
  check_ncols(ncols, "tcgen05.alloc.cta_group::2");
  const uint32_t peer = pair_peer("tcgen05.alloc.cta_group::2");
  check_cta_group(2, "tcgen05.alloc");
  if (ctx().lane != 0) return;
  const uint32_t me = ctx().cta_rank;
  *slot = pair_meet(g_tmem.alloc[me / 2], ncols, 0,
                    "tcgen05.alloc.cta_group::2 (did the peer CTA's warp allocate too?)", [&] {
                      Tmem* ts[2] = {&tmem_of(me), &tmem_of(peer)};
                      const uint32_t start = tmem_free_range_locked(ts, 2, ncols);
                      if (start == UINT32_MAX)
                        fail("tcgen05.alloc.cta_group::2: no aligned range of %u columns free in both CTAs", ncols);
                      tmem_take_locked(*ts[0], start, ncols);
                      tmem_take_locked(*ts[1], start, ncols);
                      return start;
                    });
}

// tcgen05.dealloc.cta_group::2: releases the columns in both CTAs once both warps came.
inline void tmem_dealloc_pair(uint32_t taddr, uint32_t ncols) {
  const uint32_t peer = pair_peer("tcgen05.dealloc.cta_group::2");
  check_cta_group(2, "tcgen05.dealloc");
  if (ctx().lane != 0) return;
  const uint32_t me = ctx().cta_rank;
  pair_meet(g_tmem.dealloc[me / 2], ncols, taddr,
            "tcgen05.dealloc.cta_group::2 (did the peer CTA's warp deallocate too?)", [&] {
              for (uint32_t r : {me, peer})
                if (!tmem_release_locked(tmem_of(r), taddr, ncols))
                  fail("tcgen05.dealloc.cta_group::2: address 0x%x with %u columns matches no allocation of CTA %u",
                       taddr, ncols, r);
              return 0u;
            });
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

inline Idesc decode_idesc(uint32_t i, UmmaKind kind, uint32_t cta_group = 1) {
  if (kind == UMMA_MXF8F6F4) {
    if (cta_group != 1) fail("tcgen05.mma kind::mxf8f6f4.block_scale: only .cta_group::1 is emulated");
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
  if (cta_group == 2) {  // M = 256 (layout A, 128 rows per CTA); N / 2 columns of B per CTA
    if (d.m != 256 || d.n < 32 || d.n > 256 || d.n % 16)
      fail("tcgen05.mma cta_group::2: M = %d, N = %d is not emulated (M = 256, N = 32..256 in steps of 16)", d.m,
           d.n);
    return d;
  }
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
inline uint8_t scale_byte_in(const Tmem& t, uint32_t col, int r, unsigned id, const char* which) {
  const uint32_t c = col + uint32_t(r / 32);
  if (!tmem_allocated_locked(t, c, 1))
    fail("tcgen05.mma block_scale: scale factor column %u of %s is not allocated tensor memory", c, which);
  uint8_t b[4];
  for (int q = 0; q < 4; ++q) {
    uint32_t bits;
    std::memcpy(&bits, &t.cells[32 * q + r % 32][c], 4);
    b[q] = uint8_t(bits >> (8 * id));
  }
  if (b[1] != b[0] || b[2] != b[0] || b[3] != b[0])
    fail("tcgen05.mma block_scale: %s's scale factor %d (column %u, lane %d) differs between the four lane "
         "quarters (%u %u %u %u): copy the factors with tcgen05.cp .warpx4", which, r, c, r % 32, b[0], b[1], b[2],
         b[3]);
  return b[0];
}

inline void cp_execute(Tmem& t, const UmmaOp& op) {
  const uint32_t col0 = op.d & 0xffffu;
  const SmemDesc s = decode_umma_desc(op.desc_a, "the tcgen05.cp source");
  for (int r = 0; r < 32; ++r) {
    const uint32_t addr = s.start + uint32_t(r / 8) * s.sbo + uint32_t(r % 8) * 16u;
    if (addr + 16 > smem_size()) fail("tcgen05.cp: source row %d at shared address %u is outside shared memory", r, addr);
    for (int q = 0; q < 4; ++q)
      for (int c = 0; c < 4; ++c) std::memcpy(&t.cells[32 * q + r][col0 + c], smem_base() + addr + 4 * c, 4);
  }
  for (int c = 0; c < 4; ++c) t.pending[col0 + c] -= 1;
}

// ---- CTA pairs (.cta_group::2) ----
// A descriptor's start moved from the issuing CTA's shared memory to CTA `to`'s (same offset).
inline SmemDesc desc_in_cta(SmemDesc s, uint32_t from, uint32_t to, const char* which) {
  const uint32_t stride = cta_smem_stride(), base = smem_addr(dynamic_smem()) + from * stride;
  if (s.start < base || s.start >= base + stride)
    fail("tcgen05.mma.cta_group::2: the %s descriptor's start %u is outside the issuing CTA's dynamic shared memory",
         which, s.start);
  s.start = s.start - from * stride + to * stride;
  return s;
}
// The pair MMA's operands: A's row half h and B's column half h come from CTA even + h.
struct PairOperands {
  Idesc id;
  uint32_t even;
  SmemDesc a[2], b[2];
  int ksteps;
  float a_elem(int r, int k) const { return desc_elem(a[r / 128], r % 128, k, id.trans_a, id.type); }
  float b_elem(int c, int k) const { return desc_elem(b[c / (id.n / 2)], c % (id.n / 2), k, id.trans_b, id.type); }
};
inline PairOperands pair_operands(const UmmaOp& op) {
  PairOperands p;
  p.id = decode_idesc(op.idesc, op.kind, 2);
  p.even = op.issuer & ~1u;
  p.ksteps = p.id.type == WG_E4M3 ? 32 : 16;
  const SmemDesc a = decode_umma_desc(op.desc_a, "A"), b = decode_umma_desc(op.desc_b, "B");
  for (uint32_t h = 0; h < 2; ++h) {
    p.a[h] = desc_in_cta(a, op.issuer, p.even + h, "A");
    p.b[h] = desc_in_cta(b, op.issuer, p.even + h, "B");
  }
  return p;
}
// FNV-1a over every operand element the pair MMA reads, in both CTAs.
inline uint64_t pair_digest(const UmmaOp& op) {
  const PairOperands p = pair_operands(op);
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](float x) {
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    h = (h ^ bits) * 1099511628211ull;
  };
  for (int k = 0; k < p.ksteps; ++k) {
    for (int r = 0; r < 256; ++r) mix(p.a_elem(r, k));
    for (int c = 0; c < p.id.n; ++c) mix(p.b_elem(c, k));
  }
  return h;
}
inline void pair_execute(const UmmaOp& op) {
  if (pair_digest(op) != op.digest)
    fail("tcgen05.mma.cta_group::2: an operand in the shared memory of CTA %u or %u changed between the issue and "
         "the completion of the MMA (a stage refilled while the MMA read it, or a CTA's tile landed after the "
         "issue: the issuing thread must wait for both CTAs' data)", op.issuer & ~1u, (op.issuer & ~1u) + 1);
  const PairOperands p = pair_operands(op);
  const uint32_t col0 = op.d & 0xffffu, lane0 = op.d >> 16;
  for (int r = 0; r < 256; ++r) {
    Tmem& t = tmem_of(p.even + uint32_t(r / 128));
    for (int c = 0; c < p.id.n; ++c) {
      double acc = 0.0;
      for (int k = 0; k < p.ksteps; ++k) acc += double(p.a_elem(r, k)) * double(p.b_elem(c, k));
      float& dst = t.cells[lane0 + uint32_t(r % 128)][col0 + c];
      dst = float((op.accumulate ? double(dst) : 0.0) + acc);
    }
  }
  for (uint32_t h = 0; h < 2; ++h)
    for (int c = 0; c < p.id.n; ++c) tmem_of(p.even + h).pending[col0 + c] -= 1;
}

inline void umma_execute(const UmmaOp& op) {
  if (op.cta_group == 2) return pair_execute(op);
  Tmem& t = tmem_of(op.issuer);
  if (op.kind == UMMA_CP_32X128B_WARPX4) return cp_execute(t, op);
  const Idesc id = decode_idesc(op.idesc, op.kind);
  const bool scaled = op.kind == UMMA_MXF8F6F4;
  const MxIdesc mx = scaled ? decode_mx_idesc(op.idesc) : MxIdesc{};
  const int ksteps = id.type == WG_E4M3 ? 32 : 16;
  const SmemDesc a = decode_umma_desc(op.desc_a, "A"), b = decode_umma_desc(op.desc_b, "B");
  const uint32_t col0 = op.d & 0xffffu;
  auto scale_byte = [&t](uint32_t col, int r, unsigned sf_id, const char* which) {  // in the issuer's TMEM
    return scale_byte_in(t, col, r, sf_id, which);
  };
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
      float& dst = t.cells[lane][col0 + c];
      dst = float((op.accumulate ? double(dst) : 0.0) + acc);
    }
  }
  for (int c = 0; c < id.n; ++c) t.pending[col0 + c] -= 1;
}

inline void tcgen05_mma(uint32_t d, uint64_t desc_a, uint64_t desc_b, uint32_t idesc, int accumulate,
                        UmmaKind kind, uint32_t sfa = 0, uint32_t sfb = 0) {
  const Idesc id = decode_idesc(idesc, kind);
  Lock g(g_tmem.mu);
  check_cta_group_locked(1, "tcgen05.mma");
  Tmem& t = my_tmem();
  const uint32_t col0 = d & 0xffffu;
  if (!tmem_allocated_locked(t, col0, uint32_t(id.n)))
    fail("tcgen05.mma: accumulator columns %u..%u are not allocated tensor memory", col0, col0 + id.n - 1);
  if (kind == UMMA_MXF8F6F4 && ((sfa >> 16) || (sfb >> 16)))
    fail("tcgen05.mma block_scale: scale-factor addresses 0x%x / 0x%x must start at lane 0", sfa, sfb);
  for (int c = 0; c < id.n; ++c) t.pending[col0 + c] += 1;
  UmmaOp op{d, desc_a, desc_b, idesc, accumulate != 0, kind};
  op.sfa = sfa;
  op.sfb = sfb;
  op.issuer = ctx().cta_rank;
  t.issued.push(op);
}

// tcgen05.mma.cta_group::2 (kind::f16 / kind::f8f6f4): see the header comment.
inline void tcgen05_mma_pair(uint32_t d, uint64_t desc_a, uint64_t desc_b, uint32_t idesc, int accumulate,
                             UmmaKind kind) {
  const uint32_t me = ctx().cta_rank, peer = pair_peer("tcgen05.mma.cta_group::2");
  const Idesc id = decode_idesc(idesc, kind, 2);
  if (d >> 16) fail("tcgen05.mma.cta_group::2: M = 256 writes lanes 0-127 of each CTA; d 0x%x starts at lane %u", d,
                    d >> 16);
  note_access(peer, "tcgen05.mma.cta_group::2");  // reads the peer's shared memory, writes its TMEM
  UmmaOp op{d, desc_a, desc_b, idesc, accumulate != 0, kind};
  op.issuer = me;
  op.cta_group = 2;
  op.digest = pair_digest(op);
  Lock g(g_tmem.mu);
  check_cta_group_locked(2, "tcgen05.mma");
  const uint32_t col0 = d & 0xffffu;
  for (uint32_t r : {me, peer})
    if (!tmem_allocated_locked(tmem_of(r), col0, uint32_t(id.n)))
      fail("tcgen05.mma.cta_group::2: accumulator columns %u..%u are not allocated in CTA %u's tensor memory", col0,
           col0 + id.n - 1, r);
  for (uint32_t r : {me, peer})
    for (int c = 0; c < id.n; ++c) tmem_of(r).pending[col0 + c] += 1;
  tmem_of(me).issued.push(op);
}

// tcgen05.cp.cta_group::1.32x128b.warpx4: 32 rows x 16 bytes of shared memory into columns
// taddr .. taddr + 3 of lanes r, 32 + r, 64 + r and 96 + r; queued in order with the MMAs.
inline void tcgen05_cp_32x128b_warpx4(uint32_t taddr, uint64_t sdesc) {
  if (taddr >> 16) fail("tcgen05.cp .32x128b.warpx4: destination 0x%x must start at lane 0", taddr);
  if ((sdesc >> 61) & 7u) fail("tcgen05.cp: only an unswizzled source descriptor is emulated");
  decode_umma_desc(sdesc, "the tcgen05.cp source");
  Lock g(g_tmem.mu);
  check_cta_group_locked(1, "tcgen05.cp");
  Tmem& t = my_tmem();
  const uint32_t col0 = taddr & 0xffffu;
  if (!tmem_allocated_locked(t, col0, 4)) fail("tcgen05.cp: columns %u..%u are not allocated tensor memory", col0, col0 + 3);
  for (int c = 0; c < 4; ++c) t.pending[col0 + c] += 1;
  UmmaOp op{taddr, sdesc, 0, 0, false, UMMA_CP_32X128B_WARPX4};
  op.issuer = ctx().cta_rank;
  t.issued.push(op);
}

struct UmmaBatchRef {
  UmmaBatch* batch;
};
inline void perform_umma_batch(const unsigned char* payload) {
  UmmaBatchRef ref;
  std::memcpy(&ref, payload, sizeof ref);
  Lock g(g_tmem.mu);
  // PTX: a commit tracks every earlier asynchronous tcgen05 operation of the thread, so the
  // thread's earlier batches (committed to other barriers, maybe never waited on) run first.
  for (size_t i = 0; i < g_tmem.batches.size(); ++i) {
    UmmaBatch* b = g_tmem.batches[i];
    if (b->done || b->cta != ref.batch->cta || b->tid != ref.batch->tid) continue;
    for (size_t j = 0; j < b->ops.size(); ++j) umma_execute(b->ops[j]);
    b->done = true;  // a multicast commit's other barriers find it done
    if (b == ref.batch) break;
  }
}

// The committed MMAs complete (and each barrier gets its arrival) when a thread waits on one of
// the barriers: `bar` (cta_mask 0), or the barrier at bar's offset in every CTA of cta_mask.
inline void tcgen05_commit(const void* bar, uint32_t cta_group = 1, uint16_t cta_mask = 0) {
  const uint32_t n = cluster_run().size;
  if (cta_group == 2) pair_peer("tcgen05.commit.cta_group::2");
  if (cta_mask && (n < 16 && (cta_mask >> n)))
    fail("tcgen05.commit.multicast: ctaMask 0x%x names CTAs outside the %u-CTA cluster", cta_mask, n);
  for (uint32_t r = 0; r < n; ++r)
    if ((cta_mask >> r) & 1u) note_access(r, "tcgen05.commit.multicast::cluster");
  UmmaBatch* batch = new UmmaBatch;
  batch->cta = ctx().cta_rank;
  batch->tid = ctx().tid;
  {
    Lock g(g_tmem.mu);
    check_cta_group_locked(cta_group, "tcgen05.commit");
    Tmem& t = my_tmem();
    for (size_t i = 0; i < t.issued.size(); ++i) batch->ops.push(t.issued[i]);
    t.issued.clear();
    g_tmem.batches.push(batch);
  }
  const uint32_t addr = smem_addr(bar);
  for (uint32_t r = 0; r < (cta_mask ? n : 1u); ++r) {
    if (cta_mask && !((cta_mask >> r) & 1u)) continue;
    const void* target = cta_mask ? smem_ptr(mapa_shared(addr, r)) : bar;
    mbarrier_attach_copy(target, perform_umma_batch, UmmaBatchRef{batch}, 1);
    mbarrier_arrive(target, 1, 1);  // the one byte of "transaction" is the batch: done only once performed
  }
}

// .16x256b: this thread's 4 * nt registers of the warp's 16 lanes from taddr.
inline void tmem_ld_16x256b(float* d, uint32_t taddr, int nt) {
  const uint32_t lane0 = taddr >> 16, col0 = taddr & 0xffffu, quarter = 32u * (ctx().warp % 4u);
  if (lane0 < quarter || lane0 + 16 > quarter + 32)
    fail("tcgen05.ld: warp %u may access lanes %u..%u only, not %u..%u", ctx().warp, quarter, quarter + 31, lane0,
         lane0 + 15);
  Lock g(g_tmem.mu);
  const Tmem& tm = my_tmem();
  if (!tmem_allocated_locked(tm, col0, uint32_t(8 * nt)))
    fail("tcgen05.ld: columns %u..%u are not allocated tensor memory", col0, col0 + 8 * nt - 1);
  for (uint32_t c = col0; c < col0 + 8u * nt; ++c)
    if (tm.pending[c])
      fail("tcgen05.ld: column %u read before the tcgen05.mma writing it completed (no tcgen05.commit + mbarrier "
           "wait in between)", c);
  const int g_ = int(ctx().lane / 4), t = int(ctx().lane % 4);
  for (int j = 0; j < nt; ++j)
    for (int q = 0; q < 4; ++q)
      d[4 * j + q] = tm.cells[lane0 + g_ + 8 * (q / 2)][col0 + 8 * j + 2 * t + q % 2];
}

inline void tmem_block_start() {
  Lock g(g_tmem.mu);
  for (uint32_t r = 0; r < cluster_run().size; ++r) {
    Tmem& t = tmem_of(r);
    t.n_allocs = 0;
    t.used = 0;
    std::memset(t.pending, 0, sizeof t.pending);
    t.issued.clear();
    for (auto& lane : t.cells)
      for (float& c : lane) c = __builtin_nanf("");  // poison: a read of unwritten TMEM shows
    t.finished.store(0);
  }
  for (size_t i = 0; i < g_tmem.batches.size(); ++i) delete g_tmem.batches[i];
  g_tmem.batches.clear();
  g_tmem.cta_group = 0;
  for (PairMeet* ms : {g_tmem.alloc, g_tmem.dealloc})
    for (int i = 0; i < kMaxCluster / 2; ++i) ms[i].first = UINT32_MAX;
}
// Each CTA's last thread to exit checks that every column of its TMEM was deallocated.
inline void tmem_thread_finish() {
  Tmem& t = my_tmem();
  if (t.finished.fetch_add(1) + 1 != ctx().block->nthreads) return;
  Lock g(g_tmem.mu);
  if (t.used)
    fail("tcgen05: %u tensor-memory columns of CTA %u still allocated when it exited", t.used, ctx().cta_rank);
}
inline void tmem_wake() {
  for (PairMeet* ms : {g_tmem.alloc, g_tmem.dealloc})
    for (int i = 0; i < kMaxCluster / 2; ++i) {
      ms[i].gen.fetch_add(1, std::memory_order_acq_rel);
      futex_wake(&ms[i].gen);
    }
}
static RegisterHook tmem_block_hook(hooks().block_start, tmem_block_start);
static RegisterHook tmem_finish_hook(hooks().thread_finish, tmem_thread_finish);
static RegisterHook tmem_wake_hook(hooks().wake, tmem_wake);

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
KF_DEVICE void tmem_relinquish_alloc_permit() { kf_emu::check_cta_group(1, "tcgen05.relinquish_alloc_permit"); }
KF_DEVICE void tmem_dealloc(uint32_t taddr, uint32_t ncols) { kf_emu::tmem_dealloc(taddr, ncols); }
KF_DEVICE void tmem_alloc_cg2(uint32_t* slot, uint32_t ncols) { kf_emu::tmem_alloc_pair(slot, ncols); }
KF_DEVICE void tmem_relinquish_alloc_permit_cg2() {
  kf_emu::check_cta_group(2, "tcgen05.relinquish_alloc_permit");
}
KF_DEVICE void tmem_dealloc_cg2(uint32_t taddr, uint32_t ncols) { kf_emu::tmem_dealloc_pair(taddr, ncols); }
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
KF_DEVICE void tcgen05_mma_f16_cg2(uint32_t d_tmem, uint64_t desc_a, uint64_t desc_b, uint32_t idesc,
                                   int accumulate) {
  kf_emu::tcgen05_mma_pair(d_tmem, desc_a, desc_b, idesc, accumulate, kf_emu::UMMA_F16);
}
KF_DEVICE void tcgen05_mma_f8f6f4_cg2(uint32_t d_tmem, uint64_t desc_a, uint64_t desc_b, uint32_t idesc,
                                      int accumulate) {
  kf_emu::tcgen05_mma_pair(d_tmem, desc_a, desc_b, idesc, accumulate, kf_emu::UMMA_F8F6F4);
}
KF_DEVICE void tcgen05_commit(uint64_t* bar) { kf_emu::tcgen05_commit(bar); }
KF_DEVICE void tcgen05_commit_cg2(uint64_t* bar) { kf_emu::tcgen05_commit(bar, 2); }
KF_DEVICE void tcgen05_commit_cg2_multicast(uint64_t* bar, uint16_t cta_mask) {
  kf_emu::tcgen05_commit(bar, 2, cta_mask);
}
KF_DEVICE void tmem_wait_ld() {}
template <int NT> KF_DEVICE void tmem_ld_16x256b(float* d, uint32_t taddr) {
  static_assert(NT >= 1 && NT <= 32, "tcgen05.ld 16x256b: 1..32 atoms of 8 columns");
  kf_emu::tmem_ld_16x256b(d, taddr, NT);
}

}  // namespace kf
