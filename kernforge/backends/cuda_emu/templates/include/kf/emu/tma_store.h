// Host emulation of the STSM + TMA-store epilogue primitives (kf/tma_store.cuh):
// stmatrix, the generic->async proxy fence, cp.async.bulk.tensor stores and the
// bulk async-groups that order them.
//
//  * stmatrix .m8n8.x<num>[.trans].b16 is the inverse of ldmatrix (kf/emu/mma.h): lane 8q+r
//    gives the shared address of row r of matrix q; register q of lane L holds matrix q's
//    (row L/4, cols 2(L%4)+{0,1}), or with .trans (rows 2(L%4)+{0,1}, col L/4).  Each lane
//    posts its address and registers to the warp, then writes the row it addressed from the
//    other lanes' posts, so a fragment built with the wrong lane mapping lands in the wrong
//    place here as on the GPU.
//  * Proxy fence: shared bytes written by stmatrix (or kf_emu::st_shared_generic) are marked
//    with the writing thread until that thread executes fence.proxy.async; a TMA store whose
//    box covers a still-marked 16-byte chunk fails the launch (the GPU would read stale data).
//  * TMA store: the box is read from shared memory (through the tensor map's swizzle) when the
//    store is issued and written to global memory, clipped at the tensor bounds (elements
//    outside are not written), when a wait_group.read covers its group.  If the staging bytes
//    differ from what was read at issue by then, the launch fails: the kernel overwrote the
//    staging buffer before the copy engine was done reading it.  A thread that returns with a
//    store still outstanding (not committed, or committed but not waited for) fails too.
//  * Staging writes while a store reads: from issue until the wait_group.read that covers it, a
//    store's shared source is marked (block-wide, per 16-byte chunk); stmatrix or the epilogue's
//    st.shared.v2 (staging_write_check) into a marked chunk fails the launch at once, whichever
//    thread writes, so a kernel that restages a tile before the previous tile's store was read
//    (a deferred wait placed too late, `wait_group.read 1` with one staging tile) fails
//    deterministically, not only when the bytes differ by the time of the wait.
// Bulk groups are per thread, as in PTX: commit_group closes the open group; wait_group.read N
// completes every committed group but the newest N.
#pragma once
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "kf/emu/proxy.h"
#include "kf/emu/shared.h"
#include "kf/emu/tma.h"
#include "kf/emu/warp.h"

namespace kf_emu {

// ---- shared chunks that an issued TMA store has not been waited for yet ------------------
struct StoreShadow {
  std::atomic<uint32_t>* pending = nullptr;  // stores reading each 16-byte chunk
  size_t chunks = 0;
};
static StoreShadow g_store_shadow;

inline void store_shadow_reset() {
  const size_t chunks = (smem_size() + 15) / 16;
  if (chunks != g_store_shadow.chunks) {
    std::free(static_cast<void*>(g_store_shadow.pending));
    g_store_shadow.pending = static_cast<std::atomic<uint32_t>*>(std::calloc(chunks, sizeof(std::atomic<uint32_t>)));
    if (!g_store_shadow.pending) throw std::bad_alloc();
    g_store_shadow.chunks = chunks;
  }
  for (size_t i = 0; i < chunks; ++i) g_store_shadow.pending[i].store(0, std::memory_order_relaxed);
}
static RegisterHook store_shadow_hook(hooks().block_start, store_shadow_reset);

// A store starts (`reading`) or stops reading the `bytes` shared bytes at `addr`.
inline void store_shadow_mark(uint32_t addr, uint32_t bytes, bool reading) {
  for (uint32_t c = addr / 16; c <= (addr + bytes - 1) / 16 && c < g_store_shadow.chunks; ++c) {
    if (reading)
      g_store_shadow.pending[c].fetch_add(1, std::memory_order_acq_rel);
    else
      g_store_shadow.pending[c].fetch_sub(1, std::memory_order_acq_rel);
  }
}

// A generic write of `bytes` shared bytes at `dst` by the epilogue (stmatrix, st.shared.v2).
inline void staging_write_check(const void* dst, uint32_t bytes) {
  if (!is_shared(dst)) return;  // the writer reports it
  const uint32_t addr = smem_addr(dst);
  for (uint32_t c = addr / 16; c <= (addr + bytes - 1) / 16 && c < g_store_shadow.chunks; ++c)
    if (g_store_shadow.pending[c].load(std::memory_order_acquire))
      fail("thread %u wrote shared %u while a TMA store (cp.async.bulk.tensor) was still reading it: the "
           "issuing thread's cp.async.bulk.wait_group.read must cover the store, then a barrier, before the "
           "staging tile is written again",
           ctx().tid, c * 16);
}

// ---- stmatrix ----------------------------------------------------------------------------
template <int NUM>
inline void stmatrix(void* row_ptr, const uint32_t (&r)[NUM], bool trans) {
  static_assert(NUM == 1 || NUM == 2 || NUM == 4, "stmatrix .x1, .x2 or .x4");
  if (!is_shared(row_ptr)) fail("stmatrix: row address is not in shared memory");
  if (smem_addr(row_ptr) % 16) fail("stmatrix: row address is not 16-byte aligned");
  uint64_t post[1 + NUM];
  post[0] = uint64_t(reinterpret_cast<uintptr_t>(row_ptr));
  for (int q = 0; q < NUM; ++q) post[1 + q] = r[q];
  auto rows = exchange(post, 1 + NUM);
  if (my_warp().lanes != kWarpSize) fail("stmatrix needs a full warp of 32 threads");
  const int lane = int(ctx().lane);
  if (lane >= 8 * NUM) return;  // lanes 8*NUM.. give no address
  const int q = lane / 8, row = lane % 8;
  staging_write_check(row_ptr, 16);
  uint16_t h[8];
  for (int col = 0; col < 8; ++col) {
    const int src_lane = trans ? 4 * col + row / 2 : 4 * row + col / 2;
    const int half = trans ? row % 2 : col % 2;
    h[col] = uint16_t(rows[src_lane][1 + q] >> (16 * half));
  }
  std::memcpy(row_ptr, h, 16);
  mark_generic_write(smem_addr(row_ptr), 16);
}

// ---- TMA stores and bulk async-groups ----------------------------------------------------
struct PendingStore {
  TensorMapDesc d;
  int32_t c[5];
  uint32_t base;
  int64_t count;
  unsigned char* data;  // the box as read at issue, box order
  uint64_t group;       // commit-group number (the open group is `committed`)
};
struct BulkState {
  Vec<PendingStore> stores;
  uint64_t committed = 0;
};
static thread_local BulkState g_bulk;

inline uint32_t box_smem_addr(const PendingStore& s, int64_t e) {
  return swizzle_addr(s.base + uint32_t(e * s.d.elem_bytes), s.d.swizzle_bytes);
}

inline void tma_store(const CUtensorMap* map, const void* src, const int32_t* coords) {
  PendingStore s;
  std::memcpy(&s.d, map, sizeof s.d);
  const TensorMapDesc& d = s.d;
  if (d.magic != kTensorMapMagic) fail("cp.async.bulk.tensor (store): tensor map was not encoded by kf_emu::encode_tensor_map");
  if (!is_shared(src)) fail("cp.async.bulk.tensor (store): source is not in shared memory");
  s.base = smem_addr(src);
  if (s.base % (d.swizzle_bytes ? 1024u : 128u))
    fail("cp.async.bulk.tensor (store): shared source must be 128-byte aligned (1024 with a swizzle)");
  s.count = 1;
  for (uint32_t i = 0; i < d.rank; ++i) s.count *= d.box[i];
  const int64_t bytes = s.count * d.elem_bytes;
  if (s.base + bytes > int64_t(smem_size())) fail("cp.async.bulk.tensor (store): box does not fit in shared memory");
  for (uint32_t i = 0; i < 5; ++i) s.c[i] = i < d.rank ? coords[i] : 0;
  for (uint32_t c = s.base / 16; c < (s.base + uint32_t(bytes) + 15) / 16; ++c) {
    const uint32_t w = g_proxy_shadow.owner[c].load(std::memory_order_acquire);
    if (w)
      fail("cp.async.bulk.tensor (store): shared bytes at %u were written by thread %u through the generic proxy "
           "with no fence.proxy.async.shared::cta after them",
           c * 16, w - 1);
  }
  s.data = static_cast<unsigned char*>(std::malloc(size_t(bytes)));
  if (!s.data) throw std::bad_alloc();
  for (int64_t e = 0; e < s.count; ++e)
    std::memcpy(s.data + e * d.elem_bytes, smem_base() + box_smem_addr(s, e), d.elem_bytes);
  s.group = g_bulk.committed;
  g_bulk.stores.push(s);
  store_shadow_mark(s.base, uint32_t(bytes), true);
}

// Fails if the staging bytes changed since the store read them; else writes the box to global.
inline void complete_store(PendingStore& s) {
  const TensorMapDesc& d = s.d;
  for (int64_t e = 0; e < s.count; ++e)
    if (std::memcmp(s.data + e * d.elem_bytes, smem_base() + box_smem_addr(s, e), d.elem_bytes))
      fail("cp.async.bulk.tensor (store): staging buffer at shared %u was overwritten before "
           "cp.async.bulk.wait_group.read covered the store",
           box_smem_addr(s, e));
  for (int64_t e = 0; e < s.count; ++e) {
    int64_t rem = e, offset = 0;
    bool inside = true;
    for (uint32_t i = 0; i < d.rank; ++i) {
      const int64_t g = int64_t(s.c[i]) + rem % d.box[i];
      rem /= d.box[i];
      inside = inside && g >= 0 && g < int64_t(d.dims[i]);
      offset += g * int64_t(d.strides[i]);
    }
    if (inside) std::memcpy(reinterpret_cast<char*>(d.global) + offset, s.data + e * d.elem_bytes, d.elem_bytes);
  }
  store_shadow_mark(s.base, uint32_t(s.count * d.elem_bytes), false);
  std::free(s.data);
  s.data = nullptr;
}

inline void bulk_commit_group() { g_bulk.committed += 1; }

inline void bulk_wait_group_read(int n) {
  BulkState& b = g_bulk;
  if (b.committed < uint64_t(n)) return;
  const uint64_t limit = b.committed - uint64_t(n);  // groups [0, limit) complete
  for (size_t i = 0; i < b.stores.size(); ++i)
    if (b.stores[i].group < limit) complete_store(b.stores[i]);
  b.stores.retain([limit](const PendingStore& s) { return s.group >= limit; });
}

inline void bulk_finish_thread() {
  BulkState& b = g_bulk;
  if (!b.stores.size()) return;
  for (size_t i = 0; i < b.stores.size(); ++i) complete_store(b.stores[i]);  // an overwrite reports first
  const bool open = b.stores[b.stores.size() - 1].group >= b.committed;
  fail("thread %u returned with %zu TMA store(s) %s", ctx().tid, b.stores.size(),
       open ? "never committed (cp.async.bulk.commit_group)" : "not waited for (cp.async.bulk.wait_group.read)");
}
inline void bulk_reset() {
  for (size_t i = 0; i < g_bulk.stores.size(); ++i) std::free(g_bulk.stores[i].data);
  g_bulk.stores.clear();
  g_bulk.committed = 0;
}
static RegisterHook bulk_finish_hook(hooks().thread_finish, bulk_finish_thread);
static RegisterHook bulk_reset_hook(hooks().thread_start, bulk_reset);

}  // namespace kf_emu
