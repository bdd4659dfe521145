// What the device library's KF_HOST_EMULATION branch includes (kf/common.cuh):
// the whole CUDA-on-host emulation.  The emulation build also force-includes it
// (-include kf/emu/cuda_emu.h) so that kernels using builtins before any
// kernforge header still compile.
#pragma once
#include "cuda_emu.h"
