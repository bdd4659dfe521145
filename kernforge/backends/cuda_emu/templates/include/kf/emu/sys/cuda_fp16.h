// Host-emulation shim for <cuda_fp16.h>: __half with CUDA's RNE conversions.
#pragma once
#include "../types.h"
