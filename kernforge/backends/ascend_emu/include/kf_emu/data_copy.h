// ascend-emu: DataCopy / DataCopyPad (spec section 4).  GM->UB/L1 runs on MTE2, UB->GM on
// MTE3, UB->UB on V.  Sizes that the NPU would silently round down are errors here.
#pragma once

namespace AscendC {

struct DataCopyParams {
  uint16_t blockCount = 1, blockLen = 0, srcStride = 0, dstStride = 0;
  DataCopyParams() = default;
  DataCopyParams(uint16_t count, uint16_t len, uint16_t srcGap, uint16_t dstGap)
      : blockCount(count), blockLen(len), srcStride(srcGap), dstStride(dstGap) {}
};

struct DataCopyExtParams {
  uint16_t blockCount = 1;
  uint32_t blockLen = 0, srcStride = 0, dstStride = 0, rsv = 0;
  DataCopyExtParams() = default;
  DataCopyExtParams(uint16_t count, uint32_t len, uint32_t srcGap, uint32_t dstGap, uint32_t r)
      : blockCount(count), blockLen(len), srcStride(srcGap), dstStride(dstGap), rsv(r) {}
};

template <typename T>
struct DataCopyPadExtParams {
  bool isPad = false;
  uint8_t leftPadding = 0, rightPadding = 0;
  T paddingValue = T(0);
  DataCopyPadExtParams() = default;
  DataCopyPadExtParams(bool pad, uint8_t left, uint8_t right, T value)
      : isPad(pad), leftPadding(left), rightPadding(right), paddingValue(value) {}
};

namespace kf_copy {

inline void rule32(uint64_t bytes, const char* what) {
  if (bytes % 32)
    fail("DataCopy 32-byte rule", "%s moves %llu bytes, not a multiple of 32 (the NPU silently rounds down to %llu)",
         what, (unsigned long long)bytes, (unsigned long long)(bytes / 32 * 32));
}

template <typename T>
void in_place(const LocalTensor<T>& t, uint64_t last_byte, const char* what) {
  t.check_operand(0, what);
  const uint64_t cap = uint64_t(t.GetSize()) * sizeof(T);
  if (last_byte > cap)
    fail("LocalTensor out of bounds", "%s writes/reads %llu bytes of a %s tensor of %llu bytes", what,
         (unsigned long long)last_byte, position_name(t.pos()), (unsigned long long)cap);
}

template <typename T>
void gm_to_local(const LocalTensor<T>& dst, const GlobalTensor<T>& src) {
  const TPosition p = dst.pos();
  if (!(p == TPosition::VECIN || p == TPosition::VECCALC || p == TPosition::VECOUT || p == TPosition::A1 ||
        p == TPosition::B1 || p == TPosition::C1))
    fail("position", "DataCopy from GM into %s (GM->UB/L1 only)", position_name(p));
  (void)src;
}

}  // namespace kf_copy

template <typename T>
void DataCopy(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const uint32_t count) {
  const uint64_t bytes = uint64_t(count) * sizeof(T);
  kf_copy::gm_to_local(dst, src);
  kf_copy::rule32(bytes, "DataCopy(GM->local)");
  kf_copy::in_place(dst, bytes, "DataCopy(GM->local)");
  src.check(0, count, "DataCopy(GM->local)");
  kf_emu::ctx().touch(dst.mem(), dst.byte_offset(), uint32_t(bytes), kf_emu::P_MTE2, true);
  std::memcpy(dst.addr(0), src.GetPhyAddr(), bytes);
}

template <typename T>
void DataCopy(const GlobalTensor<T>& dst, const LocalTensor<T>& src, const uint32_t count) {
  const uint64_t bytes = uint64_t(count) * sizeof(T);
  if (src.mem() != Mem::UB) fail("position", "DataCopy to GM from %s (UB->GM only; L0C leaves by Fixpipe)", position_name(src.pos()));
  kf_copy::rule32(bytes, "DataCopy(local->GM)");
  kf_copy::in_place(src, bytes, "DataCopy(local->GM)");
  dst.check(0, count, "DataCopy(local->GM)");
  kf_emu::ctx().touch(src.mem(), src.byte_offset(), uint32_t(bytes), kf_emu::P_MTE3, false);
  std::memcpy(dst.GetPhyAddr(), src.addr(0), bytes);
}

template <typename T>
void DataCopy(const LocalTensor<T>& dst, const LocalTensor<T>& src, const uint32_t count) {
  const uint64_t bytes = uint64_t(count) * sizeof(T);
  if (dst.mem() != Mem::UB || src.mem() != Mem::UB)
    fail("position", "DataCopy(local->local) %s -> %s: only UB -> UB here", position_name(src.pos()), position_name(dst.pos()));
  kf_copy::rule32(bytes, "DataCopy(local->local)");
  kf_copy::in_place(src, bytes, "DataCopy(local->local)");
  kf_copy::in_place(dst, bytes, "DataCopy(local->local)");
  kf_emu::ctx().touch(src.mem(), src.byte_offset(), uint32_t(bytes), kf_emu::P_V, false);
  kf_emu::ctx().touch(dst.mem(), dst.byte_offset(), uint32_t(bytes), kf_emu::P_V, true);
  std::memmove(dst.addr(0), src.addr(0), bytes);
}

// blockCount blocks of blockLen 32-byte units, gaps (end of one block to start of the next) in 32-byte units
template <typename T>
void DataCopy(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const DataCopyParams& p) {
  kf_copy::gm_to_local(dst, src);
  if (p.blockCount == 0 || p.blockCount > 4095) fail("DataCopyParams", "blockCount %u is outside 1..4095", p.blockCount);
  const uint64_t len = uint64_t(p.blockLen) * 32;
  const uint64_t src_pitch = len + uint64_t(p.srcStride) * 32, dst_pitch = len + uint64_t(p.dstStride) * 32;
  kf_copy::in_place(dst, dst_pitch * (p.blockCount - 1) + len, "DataCopy(GM->local, params)");
  for (uint32_t b = 0; b < p.blockCount; ++b) {
    const uint8_t* s = reinterpret_cast<const uint8_t*>(src.GetPhyAddr()) + b * src_pitch;
    kf_emu::gm_check(s, len, "DataCopy(GM->local, params)");
    kf_emu::ctx().touch(dst.mem(), uint32_t(dst.byte_offset() + b * dst_pitch), uint32_t(len), kf_emu::P_MTE2, true);
    std::memcpy(dst.addr(0) + b * dst_pitch, s, len);
  }
}

template <typename T>
void DataCopy(const GlobalTensor<T>& dst, const LocalTensor<T>& src, const DataCopyParams& p) {
  if (src.mem() != Mem::UB) fail("position", "DataCopy to GM from %s (UB->GM only)", position_name(src.pos()));
  if (p.blockCount == 0 || p.blockCount > 4095) fail("DataCopyParams", "blockCount %u is outside 1..4095", p.blockCount);
  const uint64_t len = uint64_t(p.blockLen) * 32;
  const uint64_t src_pitch = len + uint64_t(p.srcStride) * 32, dst_pitch = len + uint64_t(p.dstStride) * 32;
  kf_copy::in_place(src, src_pitch * (p.blockCount - 1) + len, "DataCopy(local->GM, params)");
  for (uint32_t b = 0; b < p.blockCount; ++b) {
    uint8_t* d = reinterpret_cast<uint8_t*>(dst.GetPhyAddr()) + b * dst_pitch;
    kf_emu::gm_check(d, len, "DataCopy(local->GM, params)");
    kf_emu::ctx().touch(src.mem(), uint32_t(src.byte_offset() + b * src_pitch), uint32_t(len), kf_emu::P_MTE3, false);
    std::memcpy(d, src.addr(0) + b * src_pitch, len);
  }
}

// Rows of blockLen *bytes* from GM (srcStride: GM gap in bytes) into UB rows padded to 32 bytes
// (dstStride: UB gap in 32-byte blocks); the pad holds paddingValue when isPad, else garbage.
template <typename T>
void DataCopyPad(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const DataCopyExtParams& p,
                 const DataCopyPadExtParams<T>& pad) {
  kf_copy::gm_to_local(dst, src);
  if (p.blockCount == 0 || p.blockCount > 4095) fail("DataCopyPad", "blockCount %u is outside 1..4095", p.blockCount);
  if (p.blockLen % sizeof(T)) fail("DataCopyPad", "blockLen %u bytes is not a multiple of the element size %zu", p.blockLen, sizeof(T));
  if (pad.leftPadding + pad.rightPadding > 32 / sizeof(T) || pad.leftPadding * sizeof(T) > 32)
    fail("DataCopyPad", "padding of %u + %u elements exceeds one 32-byte block", pad.leftPadding, pad.rightPadding);
  const uint64_t len = p.blockLen, row = (uint64_t(pad.leftPadding) * sizeof(T) + len + 31) / 32 * 32;
  const uint64_t src_pitch = len + p.srcStride, dst_pitch = row + uint64_t(p.dstStride) * 32;
  kf_copy::in_place(dst, dst_pitch * (p.blockCount - 1) + row, "DataCopyPad(GM->local)");
  for (uint32_t b = 0; b < p.blockCount; ++b) {
    const uint8_t* s = reinterpret_cast<const uint8_t*>(src.GetPhyAddr()) + b * src_pitch;
    kf_emu::gm_check(s, len, "DataCopyPad(GM->local)");
    kf_emu::ctx().touch(dst.mem(), uint32_t(dst.byte_offset() + b * dst_pitch), uint32_t(row), kf_emu::P_MTE2, true);
    uint8_t* d = dst.addr(0) + b * dst_pitch;
    const uint64_t left = uint64_t(pad.leftPadding) * sizeof(T);
    for (uint64_t i = 0; i < row; i += sizeof(T)) {
      if (i >= left && i < left + len) continue;
      if (pad.isPad) std::memcpy(d + i, &pad.paddingValue, sizeof(T));
      else std::memset(d + i, 0xFF, sizeof(T));  // garbage on the NPU: poison here
    }
    std::memcpy(d + left, s, len);
  }
}

template <typename T>
void DataCopyPad(const GlobalTensor<T>& dst, const LocalTensor<T>& src, const DataCopyExtParams& p) {
  if (src.mem() != Mem::UB) fail("position", "DataCopyPad to GM from %s (UB->GM only)", position_name(src.pos()));
  if (p.blockCount == 0 || p.blockCount > 4095) fail("DataCopyPad", "blockCount %u is outside 1..4095", p.blockCount);
  if (p.blockLen % sizeof(T)) fail("DataCopyPad", "blockLen %u bytes is not a multiple of the element size %zu", p.blockLen, sizeof(T));
  const uint64_t len = p.blockLen, row = (len + 31) / 32 * 32;
  const uint64_t src_pitch = row + uint64_t(p.srcStride) * 32, dst_pitch = len + p.dstStride;
  kf_copy::in_place(src, src_pitch * (p.blockCount - 1) + len, "DataCopyPad(local->GM)");
  for (uint32_t b = 0; b < p.blockCount; ++b) {
    uint8_t* d = reinterpret_cast<uint8_t*>(dst.GetPhyAddr()) + b * dst_pitch;
    kf_emu::gm_check(d, len, "DataCopyPad(local->GM)");
    kf_emu::ctx().touch(src.mem(), uint32_t(src.byte_offset() + b * src_pitch), uint32_t(len), kf_emu::P_MTE3, false);
    std::memcpy(d, src.addr(0) + b * src_pitch, len);
  }
}

}  // namespace AscendC
