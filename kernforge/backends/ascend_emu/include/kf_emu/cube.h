// ascend-emu: the cube path (spec section 6) with the real fractal layouts, so that a wrong
// layout gives wrong numbers here as it would on the NPU.  A fractal is 16 rows of 32 bytes
// (C0 = 32 / sizeof(T) elements: 16 for half/bf16, 8 for float).
//   L1   Nz(rows, cols): element (r, c) at (c / C0) * dstNzC0Stride * C0 + r * C0 + c % C0
//   L0A  Zz(M, K):       fractal (m / 16, k / C0) row-major, element row-major inside
//   L0B  Zn(K, N):       fractal (k / C0, n / 16) row-major, element n-major inside
//   L0C  Nz(M, N) fp32:  fractal (n / 16, m / 16) column-major of 16x16, element row-major inside
//
// dav-3510 (950) adds two direct paths between the cores of a MIX group (spec section 2: "no
// L0C->UB, no UB->L1 (950 has both)"; signatures of the 950 migration guide): an AIV copies a UB
// tile into its AIC's L1 (DataCopy(L1 LocalTensor, UB LocalTensor, Nd2NzParams), here on MTE3),
// and the AIC's Fixpipe writes L0C into an AIV's UB (Fixpipe(UB LocalTensor, L0C LocalTensor,
// FixpipeParamsC310), subBlockId picks the AIV).  Both write another core's memory, so besides
// the usual operand checks the shim checks them against the cross-core flags ("cross-core
// missing wait", cross_core.h); dav-c220 refuses both, naming the rule.
#pragma once

namespace AscendC {

struct Nd2NzParams {
  uint16_t ndNum = 1, nValue = 0, dValue = 0, srcNdMatrixStride = 0, srcDValue = 0, dstNzC0Stride = 0,
           dstNzNStride = 1, dstNzMatrixStride = 0;
  Nd2NzParams() = default;
  Nd2NzParams(uint16_t nd, uint16_t n, uint16_t d, uint16_t srcMat, uint16_t srcD, uint16_t c0Stride, uint16_t nStride,
              uint16_t dstMat)
      : ndNum(nd), nValue(n), dValue(d), srcNdMatrixStride(srcMat), srcDValue(srcD), dstNzC0Stride(c0Stride),
        dstNzNStride(nStride), dstNzMatrixStride(dstMat) {}
};

struct LoadData2DParams {
  uint16_t startIndex = 0;
  uint8_t repeatTimes = 0;
  uint16_t srcStride = 0;
  uint8_t sid = 0;
  uint16_t dstGap = 0;
  bool ifTranspose = false;
  uint8_t addrMode = 0;
  LoadData2DParams() = default;
  LoadData2DParams(uint16_t start, uint8_t repeat, uint16_t srcS, uint8_t s, uint16_t gap, bool trans, uint8_t mode)
      : startIndex(start), repeatTimes(repeat), srcStride(srcS), sid(s), dstGap(gap), ifTranspose(trans), addrMode(mode) {}
};

struct MmadParams {
  uint16_t m = 0, n = 0, k = 0;
  bool isBias = false;
  int32_t fmOffset = 0;
  bool enSsparse = false, enWinogradA = false, enWinogradB = false;
  uint8_t unitFlag = 0;
  bool kDirectionAlign = false, cmatrixSource = false, cmatrixInitVal = true;
  MmadParams() = default;
  MmadParams(uint16_t mIn, uint16_t nIn, uint16_t kIn) : m(mIn), n(nIn), k(kIn) {}
};

enum QuantMode_t : uint8_t { NoQuant, F322F16, F322BF16 };

struct FixpipeParamsV220 {
  uint16_t nSize = 0, mSize = 0, srcStride = 0;
  uint32_t dstStride = 0;
  bool reluEn = false;
  QuantMode_t quantPre = NoQuant;
  int64_t deqScalar = 0;
  uint16_t ndNum = 1, srcNdStride = 0, dstNdStride = 0;
  uint8_t unitFlag = 0;
};

// dav-3510 Fixpipe to UB (kernel_struct_fixpipe.h, __NPU_ARCH__ 3510); ROW_MAJOR (Nz -> ND) only.
enum class CO2Layout : uint8_t { NZ, ROW_MAJOR, COLUMN_MAJOR };

struct FixpipeConfig {
  CO2Layout format;
};
constexpr FixpipeConfig CFG_ROW_MAJOR = {CO2Layout::ROW_MAJOR};

struct Nz2NdParams {
  uint16_t ndNum = 1, srcNdStride = 0, dstNdStride = 0;
};

template <CO2Layout format = CO2Layout::ROW_MAJOR>
struct FixpipeParamsC310 {
  FixpipeParamsC310() = default;
  FixpipeParamsC310(uint16_t nSizeIn, uint16_t mSizeIn, uint16_t srcStrideIn, uint32_t dstStrideIn)
      : nSize(nSizeIn), mSize(mSizeIn), srcStride(srcStrideIn), dstStride(dstStrideIn) {}
  uint16_t nSize = 0, mSize = 0, srcStride = 0;
  uint32_t dstStride = 0;
  QuantMode_t quantPre = NoQuant;
  uint64_t deqScalar = 0;
  bool reluEn = false;
  uint8_t unitFlag = 0;
  uint8_t dualDstCtl = 0;  // 0: one AIV (subBlockId); 1/2: split M/N over both (not modelled)
  bool subBlockId = false;
  Nz2NdParams params;
  bool isChannelSplit = false;
};

namespace kf_cube {

template <typename T>
constexpr uint32_t c0() { return 32 / sizeof(T); }

inline void aic(const char* what) {
  if (kf_emu::ctx().core != kf_emu::Core::AIC) fail("position", "%s runs on the cube core (AIC), called from AIV", what);
}

template <typename T>
void at(const LocalTensor<T>& t, TPosition want, const char* what, const char* role) {
  if (t.pos() != want)
    fail("position", "%s: %s must be at %s, got %s", what, role, position_name(want), position_name(t.pos()));
}

}  // namespace kf_cube

// GM ND (nValue rows x dValue cols, row stride srcDValue) -> L1 Nz, short rows zero-padded.
template <typename T>
void DataCopy(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const Nd2NzParams& p) {
  kf_cube::aic("DataCopy(Nd2Nz)");
  if (dst.mem() != Mem::L1) fail("position", "DataCopy(Nd2Nz) into %s (L1 A1/B1 only)", position_name(dst.pos()));
  if (p.ndNum != 1) fail("Nd2NzParams", "ndNum %u: this shim models one matrix per copy", p.ndNum);
  constexpr uint32_t C0 = kf_cube::c0<T>();
  const uint32_t fcols = (p.dValue + C0 - 1) / C0;
  if (p.dstNzC0Stride < p.nValue) fail("Nd2NzParams", "dstNzC0Stride %u is below nValue %u rows", p.dstNzC0Stride, p.nValue);
  const uint32_t elems = fcols * p.dstNzC0Stride * C0;
  kf_copy::in_place(dst, uint64_t(elems) * sizeof(T), "DataCopy(Nd2Nz)");
  kf_emu::ctx().touch(dst.mem(), dst.byte_offset(), elems * sizeof(T), kf_emu::P_MTE2, true);
  for (uint32_t r = 0; r < p.nValue; ++r) {
    src.check(uint64_t(r) * p.srcDValue, p.dValue, "DataCopy(Nd2Nz)");
    for (uint32_t c = 0; c < fcols * C0; ++c) {
      const T v = c < p.dValue ? src.GetPhyAddr()[uint64_t(r) * p.srcDValue + c] : T(0);
      std::memcpy(dst.addr((c / C0) * p.dstNzC0Stride * C0 + r * C0 + c % C0), &v, sizeof(T));
    }
  }
}

// repeatTimes 512-byte fractals from L1 (start startIndex, step srcStride fractals) into
// consecutive fractals of L0A/L0B (dstGap fractals between), each transposed with ifTranspose.
template <typename T>
void LoadData(const LocalTensor<T>& dst, const LocalTensor<T>& src, const LoadData2DParams& p) {
  kf_cube::aic("LoadData");
  if (src.mem() != Mem::L1) fail("position", "LoadData source at %s (A1/B1 only)", position_name(src.pos()));
  if (dst.mem() != Mem::L0A && dst.mem() != Mem::L0B)
    fail("position", "LoadData destination at %s (A2/B2 only)", position_name(dst.pos()));
  if (p.ifTranspose && sizeof(T) != 2) fail("LoadData", "ifTranspose is for 16-bit types only");
  constexpr uint32_t F = 512 / sizeof(T), C0 = kf_cube::c0<T>();
  const uint32_t last_src = (p.startIndex + (p.repeatTimes ? p.repeatTimes - 1 : 0) * p.srcStride + 1) * F;
  const uint32_t last_dst = (p.repeatTimes * (1 + p.dstGap)) * F;
  kf_copy::in_place(src, uint64_t(last_src) * sizeof(T), "LoadData (source)");
  kf_copy::in_place(dst, uint64_t(last_dst) * sizeof(T), "LoadData (destination)");
  for (uint32_t r = 0; r < p.repeatTimes; ++r) {
    const uint32_t s = (p.startIndex + r * p.srcStride) * F, d = r * (1 + p.dstGap) * F;
    kf_emu::ctx().touch(src.mem(), src.byte_offset() + s * sizeof(T), 512, kf_emu::P_MTE1, false);
    kf_emu::ctx().touch(dst.mem(), dst.byte_offset() + d * sizeof(T), 512, kf_emu::P_MTE1, true);
    for (uint32_t i = 0; i < 16; ++i)
      for (uint32_t j = 0; j < C0; ++j) {
        T v;
        std::memcpy(&v, src.addr(s + i * C0 + j), sizeof(T));
        std::memcpy(dst.addr(d + (p.ifTranspose ? j * 16 + i : i * C0 + j)), &v, sizeof(T));
      }
  }
}

// C (L0C, Nz fp32) = [C +] A (L0A, Zz) x B (L0B, Zn); m, n, k <= 4095.
template <typename Dst, typename Src>
void Mmad(const LocalTensor<Dst>& c, const LocalTensor<Src>& a, const LocalTensor<Src>& b, const MmadParams& p) {
  kf_cube::aic("Mmad");
  kf_cube::at(c, TPosition::CO1, "Mmad", "C");
  kf_cube::at(a, TPosition::A2, "Mmad", "A");
  kf_cube::at(b, TPosition::B2, "Mmad", "B");
  if (!std::is_same_v<Dst, float> && !std::is_same_v<Dst, int32_t>) fail("dtype", "Mmad accumulates into float or int32");
  if (p.m > 4095 || p.n > 4095 || p.k > 4095) fail("MmadParams", "m %u, n %u, k %u: each must be <= 4095", p.m, p.n, p.k);
  constexpr uint32_t C0 = kf_cube::c0<Src>();
  const uint32_t mf = (p.m + 15) / 16, nf = (p.n + 15) / 16, kf = (p.k + C0 - 1) / C0;
  kf_copy::in_place(a, uint64_t(mf) * kf * 16 * C0 * sizeof(Src), "Mmad (A)");
  kf_copy::in_place(b, uint64_t(kf) * nf * 16 * C0 * sizeof(Src), "Mmad (B)");
  kf_copy::in_place(c, uint64_t(mf) * nf * 256 * sizeof(Dst), "Mmad (C)");
  kf_emu::Ctx& x = kf_emu::ctx();
  x.touch(a.mem(), a.byte_offset(), mf * kf * 16 * C0 * sizeof(Src), kf_emu::P_M, false);
  x.touch(b.mem(), b.byte_offset(), kf * nf * 16 * C0 * sizeof(Src), kf_emu::P_M, false);
  x.touch(c.mem(), c.byte_offset(), mf * nf * 256 * sizeof(Dst), kf_emu::P_M, true);
  for (uint32_t m = 0; m < p.m; ++m)
    for (uint32_t n = 0; n < p.n; ++n) {
      float acc = 0.0f;
      for (uint32_t k = 0; k < p.k; ++k) {
        Src av, bv;
        std::memcpy(&av, a.addr(((m / 16) * kf + k / C0) * 16 * C0 + (m % 16) * C0 + k % C0), sizeof(Src));
        std::memcpy(&bv, b.addr(((k / C0) * nf + n / 16) * 16 * C0 + (n % 16) * C0 + k % C0), sizeof(Src));
        acc += float(av) * float(bv);
      }
      const uint32_t ci = ((n / 16) * mf + m / 16) * 256 + (m % 16) * 16 + n % 16;
      Dst old;
      std::memcpy(&old, c.addr(ci), sizeof(Dst));
      const Dst v = p.cmatrixInitVal ? Dst(acc) : Dst(float(old) + acc);
      std::memcpy(c.addr(ci), &v, sizeof(Dst));
    }
}

// L0C Nz (srcStride = padded rows) -> GM ND rows of dstStride elements, converted on the way.
template <typename T, typename U>
void Fixpipe(const GlobalTensor<T>& dst, const LocalTensor<U>& src, const FixpipeParamsV220& p) {
  kf_cube::aic("Fixpipe");
  kf_cube::at(src, TPosition::CO1, "Fixpipe", "source");
  if (p.nSize % 16) fail("FixpipeParams", "nSize %u is not a multiple of 16", p.nSize);
  if (p.srcStride < p.mSize) fail("FixpipeParams", "srcStride %u is below mSize %u", p.srcStride, p.mSize);
  if (std::is_same_v<T, half> != (p.quantPre == F322F16) || std::is_same_v<T, bfloat16_t> != (p.quantPre == F322BF16))
    fail("FixpipeParams", "quantPre does not match the GM element type");
  kf_copy::in_place(src, uint64_t(p.nSize / 16) * p.srcStride * 16 * sizeof(U), "Fixpipe (source)");
  kf_emu::ctx().touch(src.mem(), src.byte_offset(), (p.nSize / 16) * p.srcStride * 16 * sizeof(U), kf_emu::P_FIX, false);
  for (uint32_t m = 0; m < p.mSize; ++m) {
    dst.check(uint64_t(m) * p.dstStride, p.nSize, "Fixpipe");
    for (uint32_t n = 0; n < p.nSize; ++n) {
      U v;
      std::memcpy(&v, src.addr((n / 16) * p.srcStride * 16 + m * 16 + n % 16), sizeof(U));
      float f = float(v);
      if (p.reluEn && f < 0.0f) f = 0.0f;
      const T out = T(f);
      std::memcpy(dst.GetPhyAddr() + uint64_t(m) * p.dstStride + n, &out, sizeof(T));
    }
  }
}

// ---------------------------------------------------------------- dav-3510 direct paths

// UB ND (nValue rows x dValue cols, row stride srcDValue) of this AIV -> the group AIC's L1 Nz,
// short rows zero-padded; the AIV's L1 tensor names the AIC's L1 (one L1 per AI core).
template <typename T>
void DataCopy(const LocalTensor<T>& dst, const LocalTensor<T>& src, const Nd2NzParams& p) {
#if __NPU_ARCH__ == 2201
  (void)dst, (void)src, (void)p;
  fail("UB -> L1 copy", "not available on dav-c220 (2201): the AIV has no path into L1, so a tile reaches the "
       "cube through GM (spec section 2; dav-3510 has it)");
#else
  if (kf_emu::ctx().core != kf_emu::Core::AIV) fail("position", "DataCopy(UB -> L1) runs on the AIV (it reads the AIV's UB)");
  if (src.mem() != Mem::UB) fail("position", "DataCopy(local -> L1, Nd2Nz) from %s (UB only)", position_name(src.pos()));
  if (dst.mem() != Mem::L1) fail("position", "DataCopy(UB -> L1, Nd2Nz) into %s (L1 A1/B1 only)", position_name(dst.pos()));
  if (p.ndNum != 1) fail("Nd2NzParams", "ndNum %u: this shim models one matrix per copy", p.ndNum);
  if (p.dstNzC0Stride < p.nValue) fail("Nd2NzParams", "dstNzC0Stride %u is below nValue %u rows", p.dstNzC0Stride, p.nValue);
  if (p.nValue && p.srcDValue < p.dValue) fail("Nd2NzParams", "srcDValue %u is below dValue %u", p.srcDValue, p.dValue);
  constexpr uint32_t C0 = kf_cube::c0<T>();
  const uint32_t fcols = (p.dValue + C0 - 1) / C0, elems = fcols * p.dstNzC0Stride * C0;
  const uint64_t src_elems = p.nValue ? uint64_t(p.nValue - 1) * p.srcDValue + p.dValue : 0;
  kf_copy::in_place(src, src_elems * sizeof(T), "DataCopy(UB -> L1) (source)");
  kf_copy::in_place(dst, uint64_t(elems) * sizeof(T), "DataCopy(UB -> L1) (destination)");
  kf_emu::ctx().touch(Mem::UB, src.byte_offset(), uint32_t(src_elems * sizeof(T)), kf_emu::P_MTE3, false);
  const uint8_t* from = src.addr(0);
  kf_emu::cross_write(0, Mem::L1, dst.byte_offset(), elems * sizeof(T), "DataCopy(UB -> L1)", [&](uint8_t* l1) {
    uint8_t* to = l1 + dst.byte_offset();
    for (uint32_t r = 0; r < p.nValue; ++r)
      for (uint32_t c = 0; c < fcols * C0; ++c) {
        T v = T(0);
        if (c < p.dValue) std::memcpy(&v, from + (uint64_t(r) * p.srcDValue + c) * sizeof(T), sizeof(T));
        std::memcpy(to + ((c / C0) * p.dstNzC0Stride * C0 + r * C0 + c % C0) * sizeof(T), &v, sizeof(T));
      }
  });
#endif
}

// L0C Nz (srcStride = padded rows) of the AIC -> the UB of AIV subBlockId, ND rows of dstStride
// elements, converted on the way.
template <typename T, typename U, const FixpipeConfig& config = CFG_ROW_MAJOR>
void Fixpipe(const LocalTensor<T>& dst, const LocalTensor<U>& src, const FixpipeParamsC310<config.format>& p) {
#if __NPU_ARCH__ == 2201
  (void)dst, (void)src, (void)p;
  fail("L0C -> UB Fixpipe", "not available on dav-c220 (2201): Fixpipe writes L0C to GM only, so a product reaches "
       "the AIV through GM (spec section 2; dav-3510 has it)");
#else
  kf_cube::aic("Fixpipe");
  static_assert(config.format == CO2Layout::ROW_MAJOR, "ascend-emu models Fixpipe to UB in ROW_MAJOR (Nz -> ND) only");
  kf_cube::at(src, TPosition::CO1, "Fixpipe", "source");
  if (dst.mem() != Mem::UB) fail("position", "Fixpipe(LocalTensor) into %s (L0C -> UB: VECIN/VECOUT/VECCALC)", position_name(dst.pos()));
  if (p.dualDstCtl != 0) fail("FixpipeParams", "dualDstCtl %u (split over both AIVs) is not modelled", p.dualDstCtl);
  if (p.nSize % 16) fail("FixpipeParams", "nSize %u is not a multiple of 16", p.nSize);
  if (p.srcStride < p.mSize) fail("FixpipeParams", "srcStride %u is below mSize %u", p.srcStride, p.mSize);
  if (p.dstStride < p.nSize) fail("FixpipeParams", "dstStride %u is below nSize %u", p.dstStride, p.nSize);
  if (p.dstStride * sizeof(T) % 32) fail("alignment", "Fixpipe to UB: a row of dstStride %u is not whole 32-byte blocks", p.dstStride);
  if (std::is_same_v<T, half> != (p.quantPre == F322F16) || std::is_same_v<T, bfloat16_t> != (p.quantPre == F322BF16))
    fail("FixpipeParams", "quantPre does not match the UB element type");
  const uint64_t dst_elems = p.mSize ? uint64_t(p.mSize - 1) * p.dstStride + p.nSize : 0;
  kf_copy::in_place(src, uint64_t(p.nSize / 16) * p.srcStride * 16 * sizeof(U), "Fixpipe (source)");
  kf_copy::in_place(dst, dst_elems * sizeof(T), "Fixpipe (UB destination)");
  kf_emu::ctx().touch(src.mem(), src.byte_offset(), (p.nSize / 16) * p.srcStride * 16 * sizeof(U), kf_emu::P_FIX, false);
  kf_emu::cross_write(1 + int(p.subBlockId), Mem::UB, dst.byte_offset(), uint32_t(dst_elems * sizeof(T)),
                      "Fixpipe(L0C -> UB)", [&](uint8_t* ub) {
    for (uint32_t m = 0; m < p.mSize; ++m)
      for (uint32_t n = 0; n < p.nSize; ++n) {
        U v;
        std::memcpy(&v, src.addr((n / 16) * p.srcStride * 16 + m * 16 + n % 16), sizeof(U));
        float f = float(v);
        if (p.reluEn && f < 0.0f) f = 0.0f;
        const T out = T(f);
        std::memcpy(ub + dst.byte_offset() + (uint64_t(m) * p.dstStride + n) * sizeof(T), &out, sizeof(T));
      }
  });
#endif
}

}  // namespace AscendC
