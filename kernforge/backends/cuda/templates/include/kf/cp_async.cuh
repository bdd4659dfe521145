// Asynchronous global->shared copies (sm_80+): the smem ring of T.Pipelined.
//
// Exact semantics (PTX ISA, "cp.async"):
//  * cp_async_cg_16(dst, src, src_bytes): `cp.async.cg.shared.global [dst], [src], 16, src_bytes;`
//    copies src_bytes (0..16) bytes from global `src` to shared `dst` and writes
//    zeros to the remaining 16 - src_bytes bytes.  dst and src are 16-byte
//    aligned.  The copy is asynchronous: it belongs to the calling thread's
//    current (uncommitted) group and is complete -- visible to the calling
//    thread -- only after a cp_async_wait<N> that covers its group.  Other
//    threads see it after that wait plus __syncthreads().
//  * cp_async_commit(): `cp.async.commit_group;` closes the current group
//    (an empty group is legal and counts).
//  * cp_async_wait<N>(): `cp.async.wait_group N;` blocks until at most N of
//    the calling thread's committed groups are still pending.
#pragma once
#include "kf/common.cuh"

#ifndef KF_HOST_EMULATION
namespace kf {

KF_DEVICE void cp_async_cg_16(void* dst_smem, const void* src_gmem, int src_bytes) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(dst_smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src_gmem), "r"(src_bytes)
               : "memory");
}

KF_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int N> KF_DEVICE void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

}  // namespace kf
#else
#include "kf/emu/cp_async.h"
#endif
