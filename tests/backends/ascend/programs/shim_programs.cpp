// Hand-written Ascend C programs against the ascend-emu shim (tests/backends/ascend/test_shim_rules.py).
//
//   shim_programs CASE PLANT
//
// CASE add:    z = x + y through double-buffered VECIN/VECOUT TQues (asc-devkit's add_tpipe_tque shape)
// CASE scale:  y = 2 x through one TBuf and explicit SetFlag/WaitFlag (the form kernforge generates)
// CASE matmul: C = A B on the cube core: Nd2Nz DataCopy, LoadData to L0A (Zz) / L0B (Zn, transposed),
//              Mmad into L0C, Fixpipe to GM (spec section 6)
// PLANT "none" runs the correct program; any other value plants that one bug.  The program prints
// OK, WRONG <what> (results differ from the host reference), or ERROR <the shim's rule: message>.
#include "kernel_operator.h"
using namespace AscendC;

#include <cstdio>
#include <string>
#include <vector>

static std::string g_plant = "none";
static bool plant(const char* p) { return g_plant == p; }

constexpr int32_t TILE = 64;  // floats per tile (256 bytes)
constexpr int32_t BUFFER_NUM = 2;

class KernelAdd {
 public:
  __aicore__ inline void Init(GM_ADDR x, GM_ADDR y, GM_ADDR z, int32_t tiles) {
    tiles_ = tiles;
    const int64_t base = GetBlockIdx() * tiles * TILE;
    xGm.SetGlobalBuffer((__gm__ float*)x + base, tiles * TILE);
    yGm.SetGlobalBuffer((__gm__ float*)y + base, tiles * TILE);
    zGm.SetGlobalBuffer((__gm__ float*)z + base, tiles * TILE);
    // over_capacity: 2 x 100 KiB of VECIN, more than dav-c220's 192 KiB UB
    pipe.InitBuffer(inQueueX, BUFFER_NUM, plant("over_capacity") ? 100 * 1024 : TILE * sizeof(float));
    pipe.InitBuffer(inQueueY, BUFFER_NUM, TILE * sizeof(float));
    pipe.InitBuffer(outQueueZ, BUFFER_NUM, TILE * sizeof(float));
  }
  __aicore__ inline void Process() {
    for (int32_t i = 0; i < tiles_; ++i) {
      CopyIn(i);
      Compute();
      CopyOut(i);
    }
  }

 private:
  __aicore__ inline void CopyIn(int32_t i) {
    LocalTensor<float> x = inQueueX.AllocTensor<float>();
    LocalTensor<float> y = inQueueY.AllocTensor<float>();
    DataCopy(x, xGm[i * TILE], plant("misaligned") ? TILE - 1 : TILE);  // 252 bytes: not a multiple of 32
    DataCopy(y, yGm[i * TILE], TILE);
    inQueueX.EnQue(x);
    inQueueY.EnQue(y);
    if (plant("enque_over_depth")) inQueueY.EnQue(inQueueY.AllocTensor<float>());  // depth 1 already holds y
  }
  __aicore__ inline void Compute() {
    LocalTensor<float> x = inQueueX.DeQue<float>();
    if (plant("deque_twice")) x = inQueueX.DeQue<float>();
    LocalTensor<float> y = inQueueY.DeQue<float>();
    LocalTensor<float> z = outQueueZ.AllocTensor<float>();
    Add(z, x, y, TILE);
    outQueueZ.EnQue<float>(z);
    inQueueX.FreeTensor(x);
    inQueueY.FreeTensor(y);
    if (plant("free_twice")) inQueueY.FreeTensor(y);
    if (plant("use_after_free")) (void)x.GetValue(0);
  }
  __aicore__ inline void CopyOut(int32_t i) {
    LocalTensor<float> z = outQueueZ.DeQue<float>();
    DataCopy(zGm[i * TILE], z, TILE);
    outQueueZ.FreeTensor(z);
  }

  TPipe pipe;
  TQue<QuePosition::VECIN, 1> inQueueX, inQueueY;
  TQue<QuePosition::VECOUT, 1> outQueueZ;
  GlobalTensor<float> xGm, yGm, zGm;
  int32_t tiles_ = 0;
};

extern "C" __global__ __aicore__ void add_custom(GM_ADDR x, GM_ADDR y, GM_ADDR z, int32_t tiles) {
  KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
  KernelAdd op;
  op.Init(x, y, z, tiles);
  op.Process();
}

extern "C" __global__ __aicore__ void scale_flags(GM_ADDR x, GM_ADDR y) {
  KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
  TPipe pipe;
  TBuf<TPosition::VECCALC> ub;
  pipe.InitBuffer(ub, TILE * sizeof(float));
  GlobalTensor<float> xGm, yGm;
  xGm.SetGlobalBuffer((__gm__ float*)x + GetBlockIdx() * TILE);
  yGm.SetGlobalBuffer((__gm__ float*)y + GetBlockIdx() * TILE);
  LocalTensor<float> t = ub.GetWithOffset<float>(TILE, 0);
  DataCopy(t, plant("gm_out_of_bounds") ? xGm[TILE / 2] : xGm, TILE);  // the last block reads past x
  SetFlag<HardEvent::MTE2_S>(0);
  if (!plant("missing_wait")) WaitFlag<HardEvent::MTE2_S>(0);
  for (int32_t i = 0; i < TILE; ++i) t.SetValue(i, t.GetValue(i) * 2.0f);
  SetFlag<HardEvent::S_MTE3>(0);
  if (plant("set_twice")) SetFlag<HardEvent::S_MTE3>(0);
  WaitFlag<HardEvent::S_MTE3>(0);
  DataCopy(yGm, t, TILE);
  if (plant("unwaited_set")) SetFlag<HardEvent::MTE3_S>(1);
}

constexpr int32_t MM = 32, NN = 48, KK = 32;

extern "C" __global__ __aicore__ void matmul_cube(GM_ADDR a, GM_ADDR b, GM_ADDR c) {
  KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIC_ONLY);
  TPipe pipe;
  TBuf<TPosition::A1> a1;
  TBuf<TPosition::B1> b1;
  TBuf<TPosition::A2> a2;
  TBuf<TPosition::B2> b2;
  TBuf<TPosition::CO1> c1;
  pipe.InitBuffer(a1, MM * KK * sizeof(half));
  pipe.InitBuffer(b1, KK * NN * sizeof(half));
  pipe.InitBuffer(a2, MM * KK * sizeof(half));
  pipe.InitBuffer(b2, KK * NN * sizeof(half));
  pipe.InitBuffer(c1, MM * NN * sizeof(float));
  GlobalTensor<half> aGm, bGm;
  GlobalTensor<float> cGm;
  aGm.SetGlobalBuffer((__gm__ half*)a);
  bGm.SetGlobalBuffer((__gm__ half*)b);
  cGm.SetGlobalBuffer((__gm__ float*)c);
  LocalTensor<half> la1 = a1.Get<half>(), lb1 = b1.Get<half>(), la2 = a2.Get<half>(), lb2 = b2.Get<half>();
  LocalTensor<float> lc = c1.Get<float>();
  DataCopy(la1, aGm, Nd2NzParams(1, MM, KK, 0, KK, MM, 1, 0));
  DataCopy(lb1, bGm, Nd2NzParams(1, KK, NN, 0, NN, KK, 1, 0));
  SetFlag<HardEvent::MTE2_MTE1>(0);
  WaitFlag<HardEvent::MTE2_MTE1>(0);
  for (int32_t i = 0; i < MM / 16; ++i)
    LoadData(la2[i * KK * 16], la1[i * 256], LoadData2DParams(0, KK / 16, MM / 16, 0, 0, false, 0));
  // wrong_fractal: B left in its L1 Nz order (no transpose), not the Zn order Mmad reads from L0B
  for (int32_t i = 0; i < KK / 16; ++i)
    LoadData(lb2[i * NN * 16], lb1[i * 256], LoadData2DParams(0, NN / 16, KK / 16, 0, 0, !plant("wrong_fractal"), 0));
  SetFlag<HardEvent::MTE1_M>(0);
  WaitFlag<HardEvent::MTE1_M>(0);
  MmadParams mm(MM, NN, KK);
  mm.cmatrixInitVal = true;
  if (plant("mmad_operand_position")) Mmad(lc, lb2, la2, mm);
  else Mmad(lc, la2, lb2, mm);
  SetFlag<HardEvent::M_FIX>(0);
  WaitFlag<HardEvent::M_FIX>(0);
  FixpipeParamsV220 fp;
  fp.nSize = NN;
  fp.mSize = MM;
  fp.srcStride = MM;
  fp.dstStride = NN;
  Fixpipe(cGm, lc, fp);
}

int main(int argc, char** argv) {
  const std::string which = argc > 1 ? argv[1] : "add";
  if (argc > 2) g_plant = argv[2];
  int rc = 0;
  const int blocks = 3, tiles = 4;
  if (which == "add") {
    std::vector<float> x(blocks * tiles * TILE), y(x.size()), z(x.size(), -1.0f);
    for (size_t i = 0; i < x.size(); ++i) x[i] = float(i % 97) * 0.5f, y[i] = float(i % 13) - 6.0f;
    kf_emu::GmScope gm({{(uint8_t*)x.data(), x.size() * 4, "x"}, {(uint8_t*)y.data(), y.size() * 4, "y"},
                        {(uint8_t*)z.data(), z.size() * 4, "z"}});
    rc = kf_emu::launch(kf_emu::Core::AIV, blocks, [&] { add_custom((GM_ADDR)x.data(), (GM_ADDR)y.data(), (GM_ADDR)z.data(), tiles); });
    if (!rc)
      for (size_t i = 0; i < x.size(); ++i)
        if (z[i] != x[i] + y[i]) { std::printf("WRONG add at %zu\n", i); return 0; }
  } else if (which == "scale") {
    std::vector<float> x(blocks * TILE), y(x.size(), -1.0f);
    for (size_t i = 0; i < x.size(); ++i) x[i] = float(i) - 50.0f;
    kf_emu::GmScope gm({{(uint8_t*)x.data(), x.size() * 4, "x"}, {(uint8_t*)y.data(), y.size() * 4, "y"}});
    rc = kf_emu::launch(kf_emu::Core::AIV, blocks, [&] { scale_flags((GM_ADDR)x.data(), (GM_ADDR)y.data()); });
    if (!rc)
      for (size_t i = 0; i < x.size(); ++i)
        if (y[i] != x[i] * 2.0f) { std::printf("WRONG scale at %zu\n", i); return 0; }
  } else {
    std::vector<half> a(MM * KK), b(KK * NN);
    std::vector<float> c(MM * NN, -1.0f);
    for (int i = 0; i < MM * KK; ++i) a[i] = half(float((i * 7) % 11) - 5.0f);
    for (int i = 0; i < KK * NN; ++i) b[i] = half(float((i * 5) % 9) - 4.0f);
    kf_emu::GmScope gm({{(uint8_t*)a.data(), a.size() * 2, "a"}, {(uint8_t*)b.data(), b.size() * 2, "b"},
                        {(uint8_t*)c.data(), c.size() * 4, "c"}});
    rc = kf_emu::launch(kf_emu::Core::AIC, 1, [&] { matmul_cube((GM_ADDR)a.data(), (GM_ADDR)b.data(), (GM_ADDR)c.data()); });
    if (!rc)
      for (int m = 0; m < MM; ++m)
        for (int n = 0; n < NN; ++n) {
          float want = 0.0f;
          for (int k = 0; k < KK; ++k) want += float(a[m * KK + k]) * float(b[k * NN + n]);
          if (c[m * NN + n] != want) { std::printf("WRONG matmul at (%d, %d): %g, want %g\n", m, n, c[m * NN + n], want); return 0; }
        }
  }
  if (rc) {
    std::string e = kf_emu::last_error();
    const size_t us = e.find('\x1f');
    std::printf("ERROR %s\n", (us == std::string::npos ? e : e.substr(us + 1)).c_str());
    return 0;
  }
  std::printf("OK\n");
  return 0;
}
