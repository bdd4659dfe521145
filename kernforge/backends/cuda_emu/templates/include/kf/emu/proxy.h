// Host emulation of fence.proxy.async.shared::cta (kf/fence.cuh): which shared bytes a
// thread wrote through the generic proxy (stmatrix, kf_emu::st_shared_generic) and has not
// fenced yet.  The async proxy's readers (kf/emu/tma_store.h) check these marks, so a TMA
// store of data whose writer skipped the fence fails the launch instead of passing by luck of
// the host's single memory view.  Plain C++ stores to shared memory are not tracked.
#pragma once
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "kf/emu/shared.h"

namespace kf_emu {

// ---- generic-proxy writes not yet fenced -------------------------------------------------
// One slot per 16-byte chunk of the shared window: 0 = fenced/untracked, t + 1 = written by
// thread t through the generic proxy with no fence.proxy.async since.
struct ProxyShadow {
  std::atomic<uint32_t>* owner = nullptr;
  size_t chunks = 0;
};
static ProxyShadow g_proxy_shadow;
static thread_local Vec<uint32_t> g_my_unfenced;  // chunks this thread marked

inline void proxy_shadow_reset() {
  const size_t chunks = (smem_size() + 15) / 16;
  if (chunks != g_proxy_shadow.chunks) {
    std::free(static_cast<void*>(g_proxy_shadow.owner));
    g_proxy_shadow.owner = static_cast<std::atomic<uint32_t>*>(std::calloc(chunks, sizeof(std::atomic<uint32_t>)));
    if (!g_proxy_shadow.owner) throw std::bad_alloc();
    g_proxy_shadow.chunks = chunks;
  }
  for (size_t i = 0; i < chunks; ++i) g_proxy_shadow.owner[i].store(0, std::memory_order_relaxed);
}
static RegisterHook proxy_shadow_hook(hooks().block_start, proxy_shadow_reset);
inline void proxy_thread_reset() { g_my_unfenced.clear(); }
static RegisterHook proxy_thread_hook(hooks().thread_start, proxy_thread_reset);

inline void mark_generic_write(uint32_t addr, uint32_t bytes) {
  for (uint32_t c = addr / 16; c <= (addr + bytes - 1) / 16 && c < g_proxy_shadow.chunks; ++c) {
    g_proxy_shadow.owner[c].store(ctx().tid + 1, std::memory_order_release);
    g_my_unfenced.push(c);
  }
}

// fence.proxy.async.shared::cta: this thread's earlier generic writes become visible to the async proxy.
inline void fence_proxy_async() {
  for (size_t i = 0; i < g_my_unfenced.size(); ++i) {
    uint32_t mine = ctx().tid + 1;
    g_proxy_shadow.owner[g_my_unfenced[i]].compare_exchange_strong(mine, 0, std::memory_order_acq_rel);
  }
  g_my_unfenced.clear();
}

// A plain st.shared of `bytes` bytes that the proxy check tracks (the fp32 epilogue's stores).
inline void st_shared_generic(void* dst, const void* src, uint32_t bytes) {
  if (!is_shared(dst)) fail("st.shared: destination is not in shared memory");
  std::memcpy(dst, src, bytes);
  mark_generic_write(smem_addr(dst), bytes);
}

}  // namespace kf_emu
