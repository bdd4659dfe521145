// Proxy fence between ordinary shared-memory accesses and the async proxy.
//
// fence_proxy_async(): `fence.proxy.async.shared::cta;` orders this thread's earlier
// generic-proxy shared-memory accesses (plain loads/stores, cp.async) with later
// async-proxy accesses (wgmma operand reads, TMA writes).  Call it in every
// thread before the __syncthreads() that hands the memory to the async proxy.
// Host emulation has one memory view; it tracks the shared bytes that stmatrix (and
// kf_emu::st_shared_generic) wrote until the writer fences, and a TMA store that reads
// unfenced bytes fails (kf/emu/proxy.h).  Plain C++ stores are not tracked.
//
// Warp specialization (a producer warpgroup that only issues TMA beside the consumer
// warpgroups, docs/backends/cuda.md "Warp-specialized GEMM pipeline"):
//  * named_barrier_sync(id, count): `bar.sync id, count;` -- a barrier over `count`
//    threads (a multiple of 32) of the block, so the consumers synchronise among
//    themselves while the producer runs its own loop (barrier 0 is __syncthreads');
//  * setmaxnreg_dec<N>() / setmaxnreg_inc<N>(): `setmaxnreg.{dec,inc}.sync.aligned.u32 N;`
//    -- the executing warpgroup gives registers back to the CTA's pool, or takes them
//    (inc blocks until the pool has them).  N is a multiple of 8 in [24, 256] and every
//    thread of the warpgroup executes the same instruction.
// Host emulation: kf/emu/warpgroup.h (real barriers, and the register accounting).
#pragma once
#include "kf/common.cuh"
#ifdef KF_HOST_EMULATION
#include "kf/emu/proxy.h"
#include "kf/emu/warpgroup.h"
#endif

namespace kf {
#ifndef KF_HOST_EMULATION
KF_DEVICE void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
KF_DEVICE void named_barrier_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
template <int N>
KF_DEVICE void setmaxnreg_dec() {
  static_assert(N >= 24 && N <= 256 && N % 8 == 0, "setmaxnreg: a multiple of 8 in [24, 256]");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
KF_DEVICE void setmaxnreg_inc() {
  static_assert(N >= 24 && N <= 256 && N % 8 == 0, "setmaxnreg: a multiple of 8 in [24, 256]");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
#else
KF_DEVICE void fence_proxy_async() { kf_emu::fence_proxy_async(); }
KF_DEVICE void named_barrier_sync(int id, int count) { kf_emu::named_barrier_sync(id, count); }
// no static_assert here: the emulator checks the count at run time, so a test can plant a bad one
template <int N>
KF_DEVICE void setmaxnreg_dec() { kf_emu::setmaxnreg(false, N); }
template <int N>
KF_DEVICE void setmaxnreg_inc() { kf_emu::setmaxnreg(true, N); }
#endif
}  // namespace kf
