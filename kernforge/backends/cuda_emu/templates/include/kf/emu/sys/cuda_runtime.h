// Host-emulation shim: what kernels get from <cuda_runtime.h>.
#pragma once
#include "vector_types.h"
#include "cuda_fp16.h"
#include "cuda_bf16.h"
