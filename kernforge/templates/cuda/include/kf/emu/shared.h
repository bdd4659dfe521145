// Shared memory under emulation: one per-block arena, addressed like the GPU's.
//
// `__shared__` expands to `static` plus a section attribute, so every static
// shared variable -- in the kernel or in a device-library helper -- is a single
// object that all host threads of the running block see (blocks run one at a
// time).  All of them, and the dynamic shared memory, live in the ELF section
// `kf_emu_shared`; the linker's __start_/__stop_ symbols bound it, which gives:
//  * shared-window addresses: __cvta_generic_to_shared(p) is the offset of p
//    from the section start (1024-byte aligned, like the hardware window), so
//    32-bit addresses, smem descriptors and address-based swizzles mean the
//    same thing as on the GPU;
//  * poisoning: the whole arena is filled with 0xFF bytes before every block,
//    so a read of shared memory nobody wrote in this block yields NaN / -1
//    instead of a stale value that happens to be right.
// Builds must pass -fno-weak: inline functions' static locals are otherwise
// COMDAT objects that cannot share a named section.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

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
inline char* smem_base() { return __start_kf_emu_shared; }
inline size_t smem_size() { return size_t(__stop_kf_emu_shared - __start_kf_emu_shared); }

inline uint32_t smem_addr(const void* p) {
  const char* c = static_cast<const char*>(p);
  if (c < __start_kf_emu_shared || c >= __stop_kf_emu_shared)
    fail("a shared-memory address was taken of a pointer outside shared memory");
  return uint32_t(c - __start_kf_emu_shared);
}
inline void* smem_ptr(uint32_t addr) {
  if (addr >= smem_size()) fail("shared-memory address " + std::to_string(addr) + " outside the block's shared memory");
  return __start_kf_emu_shared + addr;
}
inline bool is_shared(const void* p) {
  const char* c = static_cast<const char*>(p);
  return c >= __start_kf_emu_shared && c < __stop_kf_emu_shared;
}

inline void poison_shared() { std::memset(__start_kf_emu_shared, 0xff, smem_size()); }
static RegisterHook poison_shared_hook(hooks().block_start, poison_shared);

}  // namespace kf_emu

inline size_t __cvta_generic_to_shared(const void* p) { return kf_emu::smem_addr(p); }
inline void* __cvta_shared_to_generic(size_t a) { return kf_emu::smem_ptr(uint32_t(a)); }
inline unsigned __isShared(const void* p) { return kf_emu::is_shared(p); }
inline unsigned __isGlobal(const void* p) { return !kf_emu::is_shared(p); }
