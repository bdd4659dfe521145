// T.gemm on the cube core, for MIX kernels (KERNEL_TYPE_MIX_AIC_1_2: one AIC + two AIV per
// group).  The tiles live in UB on the AIVs; on dav-c220 the AIC has no UB and the AIV no
// L1/L0, so each gemm is a request through the GM workspace (spec section 2):
//
//   AIV: A, B tiles UB -> GM (DataCopy, MTE3); its op id into the slot's control word;
//        CrossCoreSetFlag<2, MTE3>(kCubeReq) ... CrossCoreWaitFlag(kCubeAck);
//        the fp32 product GM -> UB scratch (MTE2); C = product (clear) or C += product (V).
//   AIC: CrossCoreWaitFlag(kCubeReq) (mode 2: both AIVs of the group have asked); per AIV:
//        GM -> L1 Nz (DataCopy Nd2Nz, MTE2), L1 -> L0A Zz / L0B Zn (LoadData, MTE1), Mmad into
//        L0C (M), L0C -> GM ND fp32 (Fixpipe, FIX); then CrossCoreSetFlag<2, FIX>(kCubeAck).
//
// Mode 2 pairs the AIC with both AIVs at every step, so the two AIVs request in rounds: an AIV
// whose grid blocks are done answers every round with op 0 (cube_release) until the AIC sees
// both idle and writes the group's "done" word.  T is half, bfloat16_t, float or (dav-3510)
// fp8_e4m3fn_t.  K is a multiple of 16 and of C0 (the renderer checks); M and N are padded to
// MP, NP = 16 * ceil(/ 16) on chip: the pad rows of A only reach C rows >= M, which Fixpipe
// (mSize = M) never writes, the pad rows of B only columns >= N of the M x NP product in the
// workspace, which the AIV does not read.
//
// Workspace layout, per group: [32 B: done word][slot AIV 0][slot AIV 1]; a slot is
// [32 B: op word][A][B][C fp32] at the offsets the renderer passes.
//
// dav-3510 (950) has the direct paths (spec section 2: UB -> L1 and L0C -> UB), and there the
// data skips GM (gemm_direct / cube_gemm_direct below): the AIV copies A and B from its UB into
// its half of the AIC's L1 (DataCopy Nd2Nz, UB -> L1), the AIC's Fixpipe writes the fp32 product
// into the requesting AIV's UB work area (subBlockId), and the workspace keeps only the control
// words ([32 B done][32 B op AIV 0][32 B op AIV 1]): the AIC's scalar unit reads GM but not L1
// or UB, and mode-2 flags carry no value, so which gemm an AIV asks for (its own data-dependent
// control flow) still travels as a GM word.
#pragma once

namespace kf {

constexpr uint16_t kCubeReq = 0;  // AIV -> AIC: the slots hold requests
constexpr uint16_t kCubeAck = 1;  // AIC -> AIVs: the products are in GM

template <class T>
__aicore__ inline AscendC::GlobalTensor<T> gm_at(GM_ADDR base, uint32_t byte_off, uint32_t count) {
  AscendC::GlobalTensor<T> g;
  g.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(base + byte_off), count);
  return g;
}

__aicore__ inline void gm_store_word(GM_ADDR at, int32_t v) {
  AscendC::GlobalTensor<int32_t> g = gm_at<int32_t>(at, 0, 8);
  g.SetValue(0, v);
  AscendC::DataCacheCleanAndInvalid<int32_t, AscendC::CacheLine::SINGLE_CACHE_LINE, AscendC::DcciDst::CACHELINE_OUT>(g);
}

__aicore__ inline int32_t gm_load_word(GM_ADDR at) {
  AscendC::GlobalTensor<int32_t> g = gm_at<int32_t>(at, 0, 8);
  AscendC::DataCacheCleanAndInvalid<int32_t, AscendC::CacheLine::SINGLE_CACHE_LINE, AscendC::DcciDst::CACHELINE_OUT>(g);
  return g.GetValue(0);
}

// ---------------------------------------------------------------- AIV side

// C (M x N fp32, UB) = / += op(A) @ op(B), A: M x K (K x M when TA), B: K x N (N x K when TB).
template <class T, int M, int N, int K, bool TA, bool TB, bool CLEAR>
__aicore__ inline void gemm(GM_ADDR slot, uint32_t a_off, uint32_t b_off, uint32_t c_off, int32_t op,
                            const AscendC::LocalTensor<T>& a, const AscendC::LocalTensor<T>& b,
                            const AscendC::LocalTensor<float>& c, const AscendC::LocalTensor<float>& product) {
  sync<AscendC::HardEvent::S_MTE3>();
  sync<AscendC::HardEvent::V_MTE3>();
  AscendC::DataCopy(gm_at<T>(slot, a_off, M * K), a, M * K);
  AscendC::DataCopy(gm_at<T>(slot, b_off, K * N), b, K * N);
  sync<AscendC::HardEvent::MTE3_S>();
  sync<AscendC::HardEvent::MTE3_V>();
  sync<AscendC::HardEvent::MTE3_MTE2>();
  gm_store_word(slot, op);
  AscendC::CrossCoreSetFlag<2, PIPE_MTE3>(kCubeReq);
  AscendC::CrossCoreWaitFlag(kCubeAck);
  sync<AscendC::HardEvent::S_MTE2>();
  sync<AscendC::HardEvent::V_MTE2>();
  // the product is M x NP in GM; its first N columns land in UB rows of PP (32-byte) elements
  constexpr uint32_t NP = (N + 15) / 16 * 16, PP = (N * 4 + 31) / 32 * 8;
  if constexpr (NP == N) {
    AscendC::DataCopy(product, gm_at<float>(slot, c_off, M * N), M * N);
  } else {
    AscendC::DataCopyExtParams rows(static_cast<uint16_t>(M), N * 4, (NP - N) * 4, 0, 0);
    AscendC::DataCopyPadExtParams<float> pad(true, 0, uint8_t(PP - N), 0.0f);
    AscendC::DataCopyPad(product, gm_at<float>(slot, c_off, M * NP), rows, pad);
  }
  if constexpr (PP == N) {  // dense rows: one vector instruction
    sync<AscendC::HardEvent::MTE2_V>();
    sync<AscendC::HardEvent::S_V>();
    if constexpr (CLEAR) AscendC::Muls(c, product, 1.0f, M * N);
    else AscendC::Add(c, c, product, M * N);
    sync<AscendC::HardEvent::V_S>();
  } else {  // rows shorter than 32 bytes: the scalar unit adds them
    sync<AscendC::HardEvent::MTE2_S>();
    for (uint32_t i = 0; i < M; ++i)
      for (uint32_t j = 0; j < N; ++j) {
        const float v = product.GetValue(i * PP + j);
        c.SetValue(i * N + j, CLEAR ? v : c.GetValue(i * N + j) + v);
      }
  }
}

// An AIV whose work is done answers the AIC's rounds with op 0 until the group is done.
__aicore__ inline void cube_release(GM_ADDR group, GM_ADDR slot) {
  while (true) {
    gm_store_word(slot, 0);
    AscendC::CrossCoreSetFlag<2, PIPE_S>(kCubeReq);
    AscendC::CrossCoreWaitFlag(kCubeAck);
    if (gm_load_word(group) != 0) break;
  }
}

// ---------------------------------------------------------------- AIC side

// The L1 / L0 tensors of the AIC: A at the start of L1, B after it (512-byte aligned).
struct CubeBuffers {
  AscendC::TBuf<AscendC::TPosition::A1> l1a;
  AscendC::TBuf<AscendC::TPosition::B1> l1b;
  AscendC::TBuf<AscendC::TPosition::A2> l0a;
  AscendC::TBuf<AscendC::TPosition::B2> l0b;
  AscendC::TBuf<AscendC::TPosition::CO1> l0c;
};

// L1 Nz (a1, b1) -> L0A Zz / L0B Zn (LoadData, MTE1) -> Mmad into L0C (M), fenced up to the
// Fixpipe that reads L0C (M_FIX); FROM_GM: L1 was filled by MTE2, which the next request's copy
// must not start before MTE1 has read it (MTE1_MTE2).
template <class T, int M, int N, int K, bool TA, bool TB, bool FROM_GM>
__aicore__ inline AscendC::LocalTensor<float> mmad_from_l1(const AscendC::LocalTensor<T>& a1,
                                                           const AscendC::LocalTensor<T>& b1, CubeBuffers& cb) {
  constexpr int C0 = 32 / sizeof(T), F = 512 / sizeof(T);  // elements per fractal row / fractal
  constexpr int MP = (M + 15) / 16 * 16, NP = (N + 15) / 16 * 16;
  static_assert(K % 16 == 0 && K % C0 == 0, "K is whole fractals");
  static_assert(sizeof(T) == 2 || (!TA && TB), "LoadData transposes 16-bit fractals only");
  AscendC::LocalTensor<T> a2 = cb.l0a.template Get<T>(MP * K), b2 = cb.l0b.template Get<T>(K * NP);
  AscendC::LocalTensor<float> c0 = cb.l0c.template Get<float>(MP * NP);
  // L1 Nz -> L0A Zz, one 16-row strip of A at a time
  for (int i = 0; i < MP / 16; ++i) {
    if constexpr (TA)  // Nz(K, M) holds the strip's fractals consecutively, each transposed
      AscendC::LoadData(a2[i * 16 * K], a1[i * (K / 16) * F], AscendC::LoadData2DParams(0, K / 16, 1, 0, 0, true, 0));
    else  // Nz(M, K): the strip's fractals are M / 16 apart
      AscendC::LoadData(a2[i * 16 * K], a1[i * F], AscendC::LoadData2DParams(0, K / C0, MP / 16, 0, 0, false, 0));
  }
  // L1 Nz -> L0B Zn, one C0-deep strip of B at a time
  for (int j = 0; j < K / C0; ++j) {
    if constexpr (TB)  // Nz(N, K) is already Zn fractal by fractal
      AscendC::LoadData(b2[j * NP * C0], b1[j * (NP / 16) * F], AscendC::LoadData2DParams(0, NP / 16, 1, 0, 0, false, 0));
    else  // Nz(K, N): the strip's fractals are K / 16 apart, each transposed
      AscendC::LoadData(b2[j * NP * C0], b1[j * F], AscendC::LoadData2DParams(0, NP / 16, K / 16, 0, 0, true, 0));
  }
  if constexpr (FROM_GM) sync<AscendC::HardEvent::MTE1_MTE2>();
  sync<AscendC::HardEvent::MTE1_M>();
  AscendC::Mmad(c0, a2, b2, AscendC::MmadParams(M, N, K));
  sync<AscendC::HardEvent::M_MTE1>();
  sync<AscendC::HardEvent::M_FIX>();
  return c0;
}

// One request: the product of the slot's A and B into its C region (fp32, M x N row-major).
template <class T, int M, int N, int K, bool TA, bool TB>
__aicore__ inline void cube_gemm(GM_ADDR slot, uint32_t a_off, uint32_t b_off, uint32_t c_off, CubeBuffers& cb) {
  constexpr int MP = (M + 15) / 16 * 16, NP = (N + 15) / 16 * 16;
  AscendC::LocalTensor<T> a1 = cb.l1a.template Get<T>(MP * K), b1 = cb.l1b.template Get<T>(K * NP);
  // GM ND -> L1 Nz: A as M x K (K x M when TA), B as N x K (K x N unless TB)
  if constexpr (TA) AscendC::DataCopy(a1, gm_at<T>(slot, a_off, M * K), AscendC::Nd2NzParams(1, K, M, 0, M, K, 1, 0));
  else AscendC::DataCopy(a1, gm_at<T>(slot, a_off, M * K), AscendC::Nd2NzParams(1, M, K, 0, K, MP, 1, 0));
  if constexpr (TB) AscendC::DataCopy(b1, gm_at<T>(slot, b_off, K * N), AscendC::Nd2NzParams(1, N, K, 0, K, NP, 1, 0));
  else AscendC::DataCopy(b1, gm_at<T>(slot, b_off, K * N), AscendC::Nd2NzParams(1, K, N, 0, N, K, 1, 0));
  sync<AscendC::HardEvent::MTE2_MTE1>();
  AscendC::LocalTensor<float> c0 = mmad_from_l1<T, M, N, K, TA, TB, true>(a1, b1, cb);
  AscendC::FixpipeParamsV220 fp;
  fp.nSize = NP;
  fp.mSize = M;
  fp.srcStride = MP;
  fp.dstStride = NP;
  AscendC::Fixpipe(gm_at<float>(slot, c_off, M * NP), c0, fp);
  sync<AscendC::HardEvent::FIX_M>();
}

#if __NPU_ARCH__ == 3510
// ---------------------------------------------------------------- dav-3510: the direct paths

// C (M x N fp32, UB) = / += op(A) @ op(B) through the direct paths: A and B UB -> this AIV's
// half of the AIC's L1 (l1a / l1b hold both halves, a_half / b_half bytes each), the product
// Fixpipe'd by the AIC into `product` (M rows of NP floats) before it answers.
template <class T, int M, int N, int K, bool TA, bool TB, bool CLEAR>
__aicore__ inline void gemm_direct(GM_ADDR slot, int32_t op, AscendC::TBuf<AscendC::TPosition::A1>& l1a,
                                   AscendC::TBuf<AscendC::TPosition::B1>& l1b, uint32_t a_half, uint32_t b_half,
                                   const AscendC::LocalTensor<T>& a, const AscendC::LocalTensor<T>& b,
                                   const AscendC::LocalTensor<float>& c, const AscendC::LocalTensor<float>& product) {
  constexpr int MP = (M + 15) / 16 * 16, NP = (N + 15) / 16 * 16;
  const uint32_t sub = static_cast<uint32_t>(AscendC::GetSubBlockIdx());
  AscendC::LocalTensor<T> a1 = l1a.template GetWithOffset<T>(MP * K, sub * a_half);
  AscendC::LocalTensor<T> b1 = l1b.template GetWithOffset<T>(K * NP, sub * b_half);
  sync<AscendC::HardEvent::S_MTE3>();
  sync<AscendC::HardEvent::V_MTE3>();
  // UB ND -> L1 Nz: A as M x K (K x M when TA), B as N x K (K x N unless TB), as cube_gemm lays them
  if constexpr (TA) AscendC::DataCopy(a1, a, AscendC::Nd2NzParams(1, K, M, 0, M, K, 1, 0));
  else AscendC::DataCopy(a1, a, AscendC::Nd2NzParams(1, M, K, 0, K, MP, 1, 0));
  if constexpr (TB) AscendC::DataCopy(b1, b, AscendC::Nd2NzParams(1, N, K, 0, K, NP, 1, 0));
  else AscendC::DataCopy(b1, b, AscendC::Nd2NzParams(1, K, N, 0, N, K, 1, 0));
  sync<AscendC::HardEvent::MTE3_S>();
  sync<AscendC::HardEvent::MTE3_V>();
  gm_store_word(slot, op);
  AscendC::CrossCoreSetFlag<2, PIPE_MTE3>(kCubeReq);
  AscendC::CrossCoreWaitFlag(kCubeAck);  // the product is in `product`
  if constexpr (NP == N) {  // dense rows: one vector instruction
    sync<AscendC::HardEvent::S_V>();
    if constexpr (CLEAR) AscendC::Muls(c, product, 1.0f, M * N);
    else AscendC::Add(c, c, product, M * N);
    sync<AscendC::HardEvent::V_S>();
  } else {  // rows of NP floats, N of them wanted: the scalar unit adds them
    for (uint32_t i = 0; i < M; ++i)
      for (uint32_t j = 0; j < N; ++j) {
        const float v = product.GetValue(i * NP + j);
        c.SetValue(i * N + j, CLEAR ? v : c.GetValue(i * N + j) + v);
      }
  }
}

// One request of AIV `sub`, served from its half of L1 (UB -> L1 by the AIV) into its UB work
// area (Fixpipe L0C -> UB, subBlockId = sub); the cross-core flags order both hand-offs.
template <class T, int M, int N, int K, bool TA, bool TB>
__aicore__ inline void cube_gemm_direct(int sub, uint32_t a_half, uint32_t b_half, CubeBuffers& cb,
                                        const AscendC::LocalTensor<float>& product) {
  constexpr int MP = (M + 15) / 16 * 16, NP = (N + 15) / 16 * 16;
  AscendC::LocalTensor<T> a1 = cb.l1a.template GetWithOffset<T>(MP * K, sub * a_half);
  AscendC::LocalTensor<T> b1 = cb.l1b.template GetWithOffset<T>(K * NP, sub * b_half);
  AscendC::LocalTensor<float> c0 = mmad_from_l1<T, M, N, K, TA, TB, false>(a1, b1, cb);
  AscendC::FixpipeParamsC310<AscendC::CO2Layout::ROW_MAJOR> fp(NP, M, MP, NP);
  fp.subBlockId = sub != 0;
  AscendC::Fixpipe<float, float, AscendC::CFG_ROW_MAJOR>(product, c0, fp);
  sync<AscendC::HardEvent::FIX_M>();
}
#endif

}  // namespace kf
