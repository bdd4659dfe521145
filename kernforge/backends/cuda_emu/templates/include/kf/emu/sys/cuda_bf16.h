// Host-emulation shim for <cuda_bf16.h>: __nv_bfloat16 with CUDA's RNE conversions.
#pragma once
#include "../types.h"
