// Proxy fence between ordinary shared-memory accesses and the async proxy.
//
// fence_proxy_async(): `fence.proxy.async.shared::cta;` orders this thread's earlier
// generic-proxy shared-memory accesses (plain loads/stores, cp.async) with later
// async-proxy accesses (wgmma operand reads, TMA writes).  Call it in every
// thread before the __syncthreads() that hands the memory to the async proxy.
// Host emulation has one memory view, so the fence is a no-op there (a missing
// fence is one of the things emulation cannot catch: docs/backends/cuda-emu.md).
#pragma once
#include "kf/common.cuh"

namespace kf {
#ifndef KF_HOST_EMULATION
KF_DEVICE void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
#else
KF_DEVICE void fence_proxy_async() {}
#endif
}  // namespace kf
