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
// Completion: an issued MMA is pending.  tcgen05.commit moves the thread's pending MMAs onto the
// mbarrier as an asynchronous operation (kf/emu/mbarrier.h) that computes them when a thread
// waits on the barrier, and then arrives.  A tcgen05.ld of columns an uncompleted MMA writes
// fails ("read before the MMA completed"), so a missing commit or wait is caught, not silently
// read as stale data.
#pragma once
#include <cstdint>

#include "kf/emu/mbarrier.h"
#include "kf/emu/shared.h"
#include "kf/emu/swizzle.h"
#include "kf/emu/types.h"
#include "kf/emu/wgmma.h"

namespace kf_emu {

constexpr int kTmemLanes = 128, kTmemCols = 512;

enum UmmaKind { UMMA_F16, UMMA_F8F6F4 };

struct UmmaOp {
  uint32_t d;
  uint64_t desc_a, desc_b;
  uint32_t idesc;
  bool accumulate;
  UmmaKind kind;
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

inline Idesc decode_idesc(uint32_t i, UmmaKind kind) {
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

inline void umma_execute(const UmmaOp& op) {
  const Idesc id = decode_idesc(op.idesc, op.kind);
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
      float& dst = g_tmem.cells[lane][col0 + c];
      dst = float((op.accumulate ? double(dst) : 0.0) + acc);
    }
  }
  for (int c = 0; c < id.n; ++c) g_tmem.pending[col0 + c] -= 1;
}

inline void tcgen05_mma(uint32_t d, uint64_t desc_a, uint64_t desc_b, uint32_t idesc, int accumulate,
                        UmmaKind kind) {
  const Idesc id = decode_idesc(idesc, kind);
  Lock g(g_tmem.mu);
  const uint32_t col0 = d & 0xffffu;
  if (!tmem_allocated_locked(col0, uint32_t(id.n)))
    fail("tcgen05.mma: accumulator columns %u..%u are not allocated tensor memory", col0, col0 + id.n - 1);
  for (int c = 0; c < id.n; ++c) g_tmem.pending[col0 + c] += 1;
  g_tmem.issued.push(UmmaOp{d, desc_a, desc_b, idesc, accumulate != 0, kind});
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
KF_DEVICE void tcgen05_commit(uint64_t* bar) { kf_emu::tcgen05_commit(bar); }
KF_DEVICE void tmem_wait_ld() {}
template <int NT> KF_DEVICE void tmem_ld_16x256b(float* d, uint32_t taddr) {
  static_assert(NT >= 1 && NT <= 32, "tcgen05.ld 16x256b: 1..32 atoms of 8 columns");
  kf_emu::tmem_ld_16x256b(d, taddr, NT);
}

}  // namespace kf
