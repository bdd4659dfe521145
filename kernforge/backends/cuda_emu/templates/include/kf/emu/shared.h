// Shared memory under emulation: one per-block arena, addressed like the GPU's.
//
// Blocks run one at a time, so shared memory is ordinary static storage that
// every host thread of the running block sees:
//  * dynamic shared memory is the array `kf_smem` defined here (the name the
//    CUDA renderer declares: `extern __shared__ __align__(128) unsigned char
//    kf_smem[];`), sized by -DKF_EMU_DYNAMIC_SMEM_BYTES.  It lives in the ELF
//    section `kf_emu_shared`, which is filled with 0xFF bytes before every
//    block: a read of shared memory nobody wrote in this block yields NaN / -1
//    instead of a stale value that happens to be right.
//  * `__shared__` expands to `__attribute__((weak))`: valid on that block-scope
//    extern declaration and on namespace-scope shared variables (plain statics,
//    not poisoned), and a compile error ("weak declaration ... must be public")
//    on a block-scope static `__shared__` array, which C++ cannot make
//    per-block with a prefix macro (`static` would break the extern form).
//    kernforge's renderer keeps all shared tiles in the dynamic arena.
//  * shared addresses: the emulated shared window (what __cvta_generic_to_shared
//    measures from) is this module's writable segment, 1024-byte aligned, so
//    32-bit shared addresses, smem descriptors (14 bits of addr >> 4, checked)
//    and address-based swizzles keep their meaning.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <link.h>

#include "runtime.h"

#ifndef KF_EMU_DYNAMIC_SMEM_BYTES
#define KF_EMU_DYNAMIC_SMEM_BYTES 16
#endif

#define KF_EMU_SHARED_SECTION __attribute__((section("kf_emu_shared"), used))

extern "C" char __start_kf_emu_shared[];
extern "C" char __stop_kf_emu_shared[];

namespace kf_emu {

// The dynamic shared memory of the running block.  1024-byte alignment, as the
// hardware's shared window has, keeps address-based swizzle patterns intact.
extern "C" {
alignas(1024) unsigned char kf_smem[KF_EMU_DYNAMIC_SMEM_BYTES] KF_EMU_SHARED_SECTION;
}
inline unsigned char* dynamic_smem() { return kf_smem; }

struct SharedWindow {
  char* base = nullptr;
  size_t size = 0;
};

// The writable PT_LOAD segment of this module (the one holding the dynamic
// shared memory), found once through the dynamic loader.
inline SharedWindow find_shared_window() {
  SharedWindow w;
  auto visit = [](dl_phdr_info* info, size_t, void* data) -> int {
    auto* out = static_cast<SharedWindow*>(data);
    const uintptr_t anchor = reinterpret_cast<uintptr_t>(kf_smem);
    for (int i = 0; i < info->dlpi_phnum; ++i) {
      const ElfW(Phdr)& ph = info->dlpi_phdr[i];
      if (ph.p_type != PT_LOAD || !(ph.p_flags & PF_W)) continue;
      const uintptr_t lo = info->dlpi_addr + ph.p_vaddr, hi = lo + ph.p_memsz;
      if (anchor >= lo && anchor < hi) {
        out->base = reinterpret_cast<char*>(lo & ~uintptr_t(1023));
        out->size = hi - (lo & ~uintptr_t(1023));
        return 1;
      }
    }
    return 0;
  };
  dl_iterate_phdr(visit, &w);
  return w;
}
static SharedWindow g_shared_window = find_shared_window();

inline char* smem_base() { return g_shared_window.base; }
inline size_t smem_size() { return g_shared_window.size; }

inline uint32_t smem_addr(const void* p) {
  const char* c = static_cast<const char*>(p);
  if (c < smem_base() || c >= smem_base() + smem_size())
    fail("a shared-memory address was taken of a pointer outside shared memory");
  return uint32_t(c - smem_base());
}
inline void* smem_ptr(uint32_t addr) {
  if (addr >= smem_size()) fail("shared-memory address %u outside the block's shared memory", addr);
  return smem_base() + addr;
}
inline bool is_shared(const void* p) {
  const char* c = static_cast<const char*>(p);
  return c >= smem_base() && c < smem_base() + smem_size();
}

inline void poison_shared() {
  std::memset(__start_kf_emu_shared, 0xff, size_t(__stop_kf_emu_shared - __start_kf_emu_shared));
}
static RegisterHook poison_shared_hook(hooks().block_start, poison_shared);

}  // namespace kf_emu

inline size_t __cvta_generic_to_shared(const void* p) { return kf_emu::smem_addr(p); }
inline void* __cvta_shared_to_generic(size_t a) { return kf_emu::smem_ptr(uint32_t(a)); }
inline unsigned __isShared(const void* p) { return kf_emu::is_shared(p); }
inline unsigned __isGlobal(const void* p) { return !kf_emu::is_shared(p); }
