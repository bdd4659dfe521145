// Force-included (-include kf/emu/cuda_emu.h) with -DKF_HOST_EMULATION: turns
// the CUDA language used by kernforge's generated kernels into host C++.
//
// What each CUDA construct becomes:
//  * __global__/__device__/__host__/__forceinline__: plain (inline) functions;
//  * threadIdx/blockIdx/blockDim/gridDim: the running host thread's coordinates;
//  * __shared__: the per-block shared arena (see kf/emu/shared.h);
//  * __syncthreads, warp shuffles/votes/reductions: kf/emu/warp.h;
//  * PTX wrappers of the device library: kf/emu/<primitive>.h, included by the
//    library itself in its KF_HOST_EMULATION branch.
#pragma once
#ifndef KF_HOST_EMULATION
#error "kf/emu/cuda_emu.h is the host emulation of CUDA; build with -DKF_HOST_EMULATION"
#endif
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>

#include "sys/vector_types.h"
#include "types.h"
#include "runtime.h"
#include "shared.h"
#include "warp.h"
#include "intrinsics.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __maxnreg__(n)
#define __cluster_dims__(...)
#define __grid_constant__
#define __restrict__ __restrict
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ __attribute__((weak))  // see kf/emu/shared.h
#define __constant__ static
#define __managed__
#define __CUDACC__ 1  // __CUDA_ARCH__ comes from the build (-D__CUDA_ARCH__=800 for sm_80)

// The running thread's coordinates (CUDA: read-only special registers).
#define threadIdx (static_cast<const uint3&>(kf_emu::ctx().thread_idx))
#define blockIdx (static_cast<const uint3&>(kf_emu::ctx().block_idx))
#define blockDim (kf_emu::launch_dims().block)
#define gridDim (kf_emu::launch_dims().grid)
#define warpSize 32

