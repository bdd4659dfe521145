// Shared memory under emulation: one per-block arena, addressed like the GPU's.
//
// `__shared__` expands to `static` plus a section attribute, so every static
// shared variable -- in the kernel or in a device-library helper -- is a single
// object that all host threads of the running block see (blocks run one at a
// time).  They and the dynamic shared memory live in the ELF section
// `kf_emu_shared`, bounded by the linker's __start_/__stop_ symbols; the whole
// section is filled with 0xFF bytes before every block, so a read of shared
// memory nobody wrote in this block yields NaN / -1 instead of a stale value
// that happens to be right.
//
// GCC ignores the section attribute on statics of function *templates*; those
// still behave as shared memory (one object per block) but sit in .bss and are
// not poisoned.  To give them shared addresses too, the emulated shared window
// (what __cvta_generic_to_shared measures from) is this module's whole
// writable segment, whose start is page aligned -- so address bits used by
// hardware swizzles and smem descriptors (14 bits of addr >> 4) keep their
// meaning as long as the segment stays under 256 KB, which is checked.
// Builds pass -fno-weak: otherwise inline functions' statics are COMDAT objects
// that cannot share a named section.
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

// The dynamic shared memory of the running block (size fixed at build time by
// the launcher from the kernel's dynamic_smem).  1024-byte alignment also makes
// the section, and so the emulated shared window, start 1024-aligned.
alignas(1024) static unsigned char dynamic_smem_storage[KF_EMU_DYNAMIC_SMEM_BYTES] KF_EMU_SHARED_SECTION;

inline unsigned char* dynamic_smem() { return dynamic_smem_storage; }

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
    const uintptr_t anchor = reinterpret_cast<uintptr_t>(dynamic_smem_storage);
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
  if (addr >= smem_size()) fail("shared-memory address " + std::to_string(addr) + " outside the block's shared memory");
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
