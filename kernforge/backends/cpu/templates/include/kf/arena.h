// Per-thread storage for a block's on-chip buffers.
//
// A CPU block runs on one OpenMP thread, so its shared/fragment tiles are
// private to that thread for the block's duration.  They are too large for the
// worker threads' stacks (an MLA decode tile of 64x576 fp32 is 147 KB), so each
// thread keeps one 64-byte-aligned arena that grows to the largest plan it has
// served and is reused by every later block and launch.  The renderer places
// each buffer at an offset of the kernel's memory plan
// (kernforge.codegen.passes.allocate); buffers whose lifetimes do not overlap
// share bytes.
#pragma once

#include <cstddef>
#include <cstdlib>

namespace kf {

struct Arena {
  void* data = nullptr;
  size_t size = 0;
  ~Arena() { std::free(data); }
};

// The calling thread's arena, at least `bytes` long; nullptr if allocation fails.
inline char* thread_arena(size_t bytes) {
  static thread_local Arena arena;
  if (arena.size < bytes) {
    const size_t rounded = (bytes + 4095) & ~size_t(4095);
    void* fresh = std::aligned_alloc(64, rounded);
    if (fresh == nullptr) return nullptr;
    std::free(arena.data);
    arena.data = fresh;
    arena.size = rounded;
  }
  return static_cast<char*>(arena.data);
}

}  // namespace kf
