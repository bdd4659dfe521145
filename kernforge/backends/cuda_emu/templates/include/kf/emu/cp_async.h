// Host emulation of kf/cp_async.cuh: cp.async with its completion semantics.
//
// A cp.async does not copy when issued.  It is queued in the calling thread's
// current group; commit closes the group; wait<N> performs every copy of all
// but the newest N committed groups.  So a kernel that reads the destination
// before the covering wait (or, from another thread, before wait + barrier)
// reads the poisoned or previous contents, as it could on the GPU.  Copies still
// outstanding when a thread returns are performed then (the GPU would finish
// them too; nothing can observe the difference).
#pragma once
#include <sched.h>

#include <cstdint>
#include <cstring>

#include "kf/emu/shared.h"

namespace kf_emu {

struct PendingCopy {
  void* dst;
  const void* src;
  int src_bytes;
  int total_bytes;
  uint64_t group;  // commit-group number (the open group is `committed`)
};

struct CpAsyncState {
  Vec<PendingCopy> copies;  // issue order
  uint64_t committed = 0;   // groups committed so far
};
static thread_local CpAsyncState g_cp_async;

inline void perform(const PendingCopy& c) {
  if (c.src_bytes > 0) std::memcpy(c.dst, c.src, size_t(c.src_bytes));
  std::memset(static_cast<char*>(c.dst) + c.src_bytes, 0, size_t(c.total_bytes - c.src_bytes));
}

inline void cp_async(void* dst, const void* src, int cp_size, int src_bytes) {
  if (!is_shared(dst)) fail("cp.async: destination is not in shared memory");
  if (smem_addr(dst) % unsigned(cp_size)) fail("cp.async: destination is not aligned to the copy size");
  if (src_bytes < 0 || src_bytes > cp_size) fail("cp.async: src-size %d outside 0..%d", src_bytes, cp_size);
  if (src_bytes > 0 && reinterpret_cast<uintptr_t>(src) % unsigned(cp_size)) fail("cp.async: source is not aligned to the copy size");
  if (src_bytes > 0 && is_shared(src)) fail("cp.async: source is in shared memory, expected global");
  g_cp_async.copies.push(PendingCopy{dst, src, src_bytes, cp_size, g_cp_async.committed});
}

inline void cp_async_commit() { g_cp_async.committed += 1; }

// Performs every copy of the committed groups but the newest n, oldest first.
inline void cp_async_wait(int n) {
  CpAsyncState& s = g_cp_async;
  if (s.committed < uint64_t(n)) return;
  const uint64_t limit = s.committed - uint64_t(n);  // groups [0, limit) complete
  // Race amplifier: let other threads run first, so that one which reads this
  // thread's copies without the barrier that should follow the wait sees them
  // missing even when the host has cores to spare.
  if (s.copies.size() && s.copies[0].group < limit) sched_yield();
  for (size_t i = 0; i < s.copies.size(); ++i)
    if (s.copies[i].group < limit) perform(s.copies[i]);
  s.copies.retain([limit](const PendingCopy& c) { return c.group >= limit; });
}

inline void cp_async_finish_thread() {
  cp_async_commit();
  cp_async_wait(0);
}
inline void cp_async_reset() {
  g_cp_async.copies.clear();
  g_cp_async.committed = 0;
}
static RegisterHook cp_async_finish_hook(hooks().thread_finish, cp_async_finish_thread);
static RegisterHook cp_async_reset_hook(hooks().thread_start, cp_async_reset);

}  // namespace kf_emu

namespace kf {

KF_DEVICE void cp_async_cg_16(void* dst_smem, const void* src_gmem, int src_bytes) {
  kf_emu::cp_async(dst_smem, src_gmem, 16, src_bytes);
}
KF_DEVICE void cp_async_commit() { kf_emu::cp_async_commit(); }
template <int N> KF_DEVICE void cp_async_wait() { kf_emu::cp_async_wait(N); }

}  // namespace kf
