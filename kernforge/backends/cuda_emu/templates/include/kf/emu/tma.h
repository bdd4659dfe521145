// Host emulation of TMA tile loads: cp.async.bulk.tensor.<n>d.shared::cluster.global
// .tile.mbarrier::complete_tx::bytes, and of the tensor map that describes them.
//
// Under emulation the 128 opaque bytes of a CUtensorMap hold a TensorMapDesc,
// written by encode_tensor_map (the host side's stand-in for the driver's
// cuTensorMapEncodeTiled, with the same argument meaning and checks).
//
// A load copies a box of the global tensor, elements outside the tensor read as
// zero, into shared memory in box order (dimension 0 innermost).  With a
// swizzle mode each element goes to kf_emu::swizzle_addr of its box-order address
// (kf/emu/swizzle.h: the 16-byte chunk index XOR bits 7.. of the shared address, as
// the hardware does), which is why the destination must be 1024-byte aligned then.
// The L2 cache-policy operand of the .L2::cache_hint form is accepted and has no
// effect here (there is no cache to steer).
// The copy completes on its mbarrier (kf/emu/mbarrier.h): it is performed when
// a thread waits on that barrier, and its bytes count against expect_tx.
#pragma once
#include <cstdint>
#include <cstring>

#include "kf/emu/mbarrier.h"
#include "kf/emu/swizzle.h"
#include "sys/cuda.h"

namespace kf_emu {

constexpr uint32_t kTensorMapMagic = 0x4b46544d;  // "KFTM"
// what kf::l2_policy_evict_first() returns here: an opaque value, as on the GPU
constexpr uint64_t kL2PolicyEvictFirst = 0x12F0000000000000ull;

struct TensorMapDesc {
  uint32_t magic, rank, elem_bytes, swizzle_bytes;
  uint64_t global;
  uint64_t dims[5];
  uint64_t strides[5];  // bytes; strides[0] = elem_bytes
  uint32_t box[5];
};
static_assert(sizeof(TensorMapDesc) <= sizeof(CUtensorMap), "tensor map descriptor must fit 128 bytes");

// cuTensorMapEncodeTiled's meaning: dims[rank], global_strides_bytes[rank - 1] for
// dimensions 1.., box[rank]; swizzle_bytes 0, 32, 64 or 128.  Returns 0 or an error text.
inline const char* encode_tensor_map(CUtensorMap* out, uint32_t rank, uint32_t elem_bytes, const void* global,
                                     const uint64_t* dims, const uint64_t* global_strides_bytes,
                                     const uint32_t* box, uint32_t swizzle_bytes) {
  if (rank < 1 || rank > 5) return "tensor map rank must be 1..5";
  if (reinterpret_cast<uintptr_t>(global) % 16) return "tensor map global address must be 16-byte aligned";
  if (swizzle_bytes != 0 && swizzle_bytes != 32 && swizzle_bytes != 64 && swizzle_bytes != 128)
    return "swizzle must be 0, 32, 64 or 128 bytes";
  TensorMapDesc d{};
  d.magic = kTensorMapMagic;
  d.rank = rank;
  d.elem_bytes = elem_bytes;
  d.swizzle_bytes = swizzle_bytes;
  d.global = reinterpret_cast<uint64_t>(global);
  d.strides[0] = elem_bytes;
  for (uint32_t i = 0; i < rank; ++i) {
    if (box[i] < 1 || box[i] > 256) return "box extents must be 1..256";
    d.dims[i] = dims[i];
    d.box[i] = box[i];
    if (i > 0) {
      if (global_strides_bytes[i - 1] % 16) return "global strides must be multiples of 16 bytes";
      d.strides[i] = global_strides_bytes[i - 1];
    }
  }
  if ((box[0] * elem_bytes) % 16) return "the inner box extent must be a multiple of 16 bytes";
  if (swizzle_bytes && box[0] * elem_bytes > swizzle_bytes) return "the inner box extent exceeds the swizzle span";
  std::memset(out, 0, sizeof(CUtensorMap));
  std::memcpy(out, &d, sizeof d);
  return nullptr;
}

struct TmaCopy {
  TensorMapDesc d;
  int32_t c[5];
  uint32_t base;
  int64_t count;
};

inline void perform_tma_copy(const unsigned char* payload) {
  TmaCopy t;
  std::memcpy(&t, payload, sizeof t);
  const TensorMapDesc& d = t.d;
  for (int64_t e = 0; e < t.count; ++e) {
    int64_t rem = e, offset = 0;
    bool inside = true;
    for (uint32_t i = 0; i < d.rank; ++i) {
      const int64_t g = int64_t(t.c[i]) + rem % d.box[i];
      rem /= d.box[i];
      inside = inside && g >= 0 && g < int64_t(d.dims[i]);
      offset += g * int64_t(d.strides[i]);
    }
    char* out = smem_base() + swizzle_addr(t.base + uint32_t(e * d.elem_bytes), d.swizzle_bytes);
    if (inside) std::memcpy(out, reinterpret_cast<const char*>(d.global) + offset, d.elem_bytes);
    else std::memset(out, 0, d.elem_bytes);
  }
}

// The checked copy of one TMA load (tma_load attaches it to its barrier; a multicast into a
// peer CTA performs it at once, kf/emu/cluster.h); `bytes` receives the box's size.
inline TmaCopy tma_copy(void* dst, const CUtensorMap* map, const int32_t* coords, int64_t* bytes) {
  TmaCopy t;
  std::memcpy(&t.d, map, sizeof t.d);
  const TensorMapDesc& d = t.d;
  if (d.magic != kTensorMapMagic) fail("cp.async.bulk.tensor: tensor map was not encoded by kf_emu::encode_tensor_map");
  t.base = smem_addr(dst);
  if (t.base % (d.swizzle_bytes ? 1024u : 128u))
    fail("cp.async.bulk.tensor: shared destination must be 128-byte aligned (1024 with a swizzle)");
  t.count = 1;
  for (uint32_t i = 0; i < d.rank; ++i) t.count *= d.box[i];
  *bytes = t.count * d.elem_bytes;
  if (t.base + *bytes > int64_t(smem_size())) fail("cp.async.bulk.tensor: box does not fit in shared memory");
  for (uint32_t i = 0; i < 5; ++i) t.c[i] = i < d.rank ? coords[i] : 0;
  return t;
}

inline void tma_load(void* dst, const CUtensorMap* map, const int32_t* coords, const void* bar) {
  int64_t bytes = 0;
  const TmaCopy t = tma_copy(dst, map, coords, &bytes);
  mbarrier_attach_copy(bar, perform_tma_copy, t, bytes);
}

}  // namespace kf_emu

namespace kf_emu {

// The host entry's form of encode_tensor_map: `packed` is {rank, elem_bytes, address,
// dims[rank] (innermost first), strides_bytes[rank - 1], box[rank], swizzle_bytes}
// (kernforge's cuda_tma.TensorMapArgs.packed()).  Returns false with the reason in launch_error().
inline bool encode_tensor_map_packed(CUtensorMap* out, const int64_t* packed) {
  const int64_t rank = packed[0];
  if (rank < 1 || rank > 5) {
    snprintf(launch_error().message, sizeof launch_error().message, "tensor map: rank %lld out of 1..5",
             (long long)rank);
    return false;
  }
  uint64_t dims[5], strides[4];
  uint32_t box[5];
  for (int64_t i = 0; i < rank; ++i) dims[i] = uint64_t(packed[3 + i]);
  for (int64_t i = 0; i + 1 < rank; ++i) strides[i] = uint64_t(packed[3 + rank + i]);
  for (int64_t i = 0; i < rank; ++i) box[i] = uint32_t(packed[3 + 2 * rank - 1 + i]);
  const char* err = encode_tensor_map(out, uint32_t(rank), uint32_t(packed[1]),
                                      reinterpret_cast<const void*>(packed[2]), dims, strides, box,
                                      uint32_t(packed[3 + 3 * rank - 1]));
  if (err) {
    snprintf(launch_error().message, sizeof launch_error().message, "tensor map: %s", err);
    return false;
  }
  return true;
}

}  // namespace kf_emu
