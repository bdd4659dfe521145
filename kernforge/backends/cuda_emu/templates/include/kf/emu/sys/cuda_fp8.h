// Host-emulation shim for <cuda_fp8.h>: __nv_fp8_e4m3 (RNE, saturating to finite).
#pragma once
#include "../types.h"
