// Host-emulation shim for <cuda.h>: the 128-byte tensor-map object.  Under
// emulation its bytes hold kf_emu::TensorMapDesc (see kf/emu/tma.h), written
// by kf_emu::encode_tensor_map instead of cuTensorMapEncodeTiled.
#pragma once
#include <cstdint>
struct alignas(64) CUtensorMap_st { unsigned long long opaque[16]; };
typedef CUtensorMap_st CUtensorMap;
