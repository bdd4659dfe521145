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
#include <cstdint>
#include <cstring>
#include <deque>
#include <vector>

#include "kf/emu/shared.h"

namespace kf_emu {

struct PendingCopy {
  void* dst;
  const void* src;
  int src_bytes;
  int total_bytes;
};

struct CpAsyncState {
  std::vector<PendingCopy> open;               // the current, uncommitted group
  std::deque<std::vector<PendingCopy>> groups;  // committed, oldest first
};
static thread_local CpAsyncState g_cp_async;

inline void perform(const PendingCopy& c) {
  if (c.src_bytes > 0) std::memcpy(c.dst, c.src, size_t(c.src_bytes));
  std::memset(static_cast<char*>(c.dst) + c.src_bytes, 0, size_t(c.total_bytes - c.src_bytes));
}

inline void cp_async(void* dst, const void* src, int cp_size, int src_bytes) {
  if (!is_shared(dst)) fail("cp.async: destination is not in shared memory");
  if (smem_addr(dst) % unsigned(cp_size)) fail("cp.async: destination is not aligned to the copy size");
  if (src_bytes < 0 || src_bytes > cp_size) fail("cp.async: src-size " + std::to_string(src_bytes) + " outside 0.." + std::to_string(cp_size));
  if (src_bytes > 0 && reinterpret_cast<uintptr_t>(src) % unsigned(cp_size)) fail("cp.async: source is not aligned to the copy size");
  if (src_bytes > 0 && is_shared(src)) fail("cp.async: source is in shared memory, expected global");
  g_cp_async.open.push_back(PendingCopy{dst, src, src_bytes, cp_size});
}

inline void cp_async_commit() {
  g_cp_async.groups.push_back(std::move(g_cp_async.open));
  g_cp_async.open.clear();
}

inline void cp_async_wait(int n) {
  auto& groups = g_cp_async.groups;
  while (int(groups.size()) > n) {
    for (const PendingCopy& c : groups.front()) perform(c);
    groups.pop_front();
  }
}

inline void cp_async_finish_thread() {
  cp_async_commit();
  cp_async_wait(0);
}
inline void cp_async_reset() { g_cp_async = CpAsyncState{}; }
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
