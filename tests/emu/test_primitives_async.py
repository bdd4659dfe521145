"""mbarrier phases and transaction counts, bulk copies and TMA tile loads of the
host emulation (kf/emu/mbarrier.h, kf/emu/tma.h), against PTX ISA semantics."""
import numpy as np
import pytest

from kernforge.backends.cuda_emu.backend import EmulationError

from .conftest import CudaTestKernel, build_emu_module

MBAR_TX = r'''
#include "kf/emu/tma.h"
// flags: the results of test_wait at each step; out: the 256 bytes the two bulk copies brought in.
extern "C" __global__ void mbar_tx(const unsigned char* src, int* flags, unsigned char* out) {
  extern __shared__ __align__(128) unsigned char kf_smem[];
  uint64_t* bar = reinterpret_cast<uint64_t*>(kf_smem);
  unsigned char* buf = kf_smem + 128;
  if (threadIdx.x == 0) kf_emu::mbarrier_init(bar, 2);
  __syncthreads();
  if (threadIdx.x == 0) {
    flags[0] = kf_emu::mbarrier_test_wait_parity(bar, 0);    // nothing arrived
    kf_emu::mbarrier_arrive(bar, 1, 256);                     // arrive.expect_tx 256
    kf_emu::bulk_copy_g2s(buf, src, 128, bar);
    flags[1] = kf_emu::mbarrier_test_wait_parity(bar, 0);    // one arrival still pending
  }
  __syncthreads();
  if (threadIdx.x == 1) {
    kf_emu::mbarrier_arrive(bar);                              // arrivals complete, 128 tx bytes missing
    flags[2] = kf_emu::mbarrier_test_wait_parity(bar, 0);
    kf_emu::bulk_copy_g2s(buf + 128, src + 128, 128, bar);
  }
  kf_emu::mbarrier_wait_parity(bar, 0);
  for (int i = threadIdx.x; i < 256; i += blockDim.x) out[i] = buf[i];
  __syncthreads();
  if (threadIdx.x == 0) {
    flags[3] = kf_emu::mbarrier_test_wait_parity(bar, 0);    // phase 0 done
    flags[4] = kf_emu::mbarrier_test_wait_parity(bar, 1);    // phase 1 re-armed, not done
    kf_emu::mbarrier_arrive(bar, 2);
    flags[5] = kf_emu::mbarrier_test_wait_parity(bar, 1);    // phase 1 done without tx
  }
}
'''

MBAR_SHORT_TX = r'''
#include "kf/emu/tma.h"
// expect_tx 256 but only 128 bytes are ever copied: the phase can never complete.
extern "C" __global__ void mbar_short_tx(const unsigned char* src) {
  extern __shared__ __align__(128) unsigned char kf_smem[];
  uint64_t* bar = reinterpret_cast<uint64_t*>(kf_smem);
  if (threadIdx.x == 0) {
    kf_emu::mbarrier_init(bar, 1);
    kf_emu::mbarrier_arrive(bar, 1, 256);
    kf_emu::bulk_copy_g2s(kf_smem + 128, src, 128, bar);
  }
  __syncthreads();
  kf_emu::mbarrier_wait_parity(bar, 0);
}
'''

MBAR_NO_WAIT = r'''
#include "kf/emu/tma.h"
// Reads the bulk copy's destination without waiting on the barrier.
extern "C" __global__ void mbar_no_wait(const unsigned char* src, unsigned char* out) {
  extern __shared__ __align__(128) unsigned char kf_smem[];
  uint64_t* bar = reinterpret_cast<uint64_t*>(kf_smem);
  if (threadIdx.x == 0) {
    kf_emu::mbarrier_init(bar, 1);
    kf_emu::mbarrier_arrive(bar, 1, 64);
    kf_emu::bulk_copy_g2s(kf_smem + 128, src, 64, bar);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < 64; i += blockDim.x) out[i] = kf_smem[128 + i];
}
'''

TMA_2D = r'''
#include "kf/emu/tma.h"
// A 16-row x `inner`-column bf16 box at (col0, row0) of a rows x cols tensor with the given
// swizzle; the raw shared bytes of the box are dumped to `out`.
extern "C" __global__ void tma_2d(const unsigned short* g, unsigned char* out, int rows, int cols, int col0,
                                  int row0, int swizzle, int inner) {
  extern __shared__ __align__(128) unsigned char kf_smem[];
  uint64_t* bar = reinterpret_cast<uint64_t*>(kf_smem);
  unsigned char* box = kf_smem + 1024;
  if (threadIdx.x == 0) {
    CUtensorMap map;
    const uint64_t dims[2] = {(uint64_t)cols, (uint64_t)rows};
    const uint64_t strides[1] = {(uint64_t)cols * 2};
    const uint32_t boxdim[2] = {(uint32_t)inner, 16};
    const char* err = kf_emu::encode_tensor_map(&map, 2, 2, g, dims, strides, boxdim, swizzle);
    if (err) kf_emu::fail(err);
    kf_emu::mbarrier_init(bar, 1);
    kf_emu::mbarrier_arrive(bar, 1, inner * 16 * 2);
    const int32_t coords[2] = {col0, row0};
    kf_emu::tma_load(box, &map, coords, bar);
  }
  __syncthreads();
  kf_emu::mbarrier_wait_parity(bar, 0);
  for (int i = threadIdx.x; i < inner * 16 * 2; i += blockDim.x) out[i] = box[i];
}
'''


@pytest.fixture(scope="module")
def kernels():
    u8 = ("const unsigned char*", "buffer")
    i32 = ("int", "scalar")
    return build_emu_module("emu_test_async", [
        CudaTestKernel("mbar_tx", MBAR_TX, [u8, ("int*", "buffer"), ("unsigned char*", "buffer")], 64),
        CudaTestKernel("mbar_short_tx", MBAR_SHORT_TX, [u8], 32),
        CudaTestKernel("mbar_no_wait", MBAR_NO_WAIT, [u8, ("unsigned char*", "buffer")], 32),
        CudaTestKernel("tma_2d", TMA_2D, [("const unsigned short*", "buffer"), ("unsigned char*", "buffer")] + [i32] * 6,
                       64),
    ], dynamic_smem=4096)


def test_mbarrier_phase_needs_arrivals_and_tx_bytes(kernels, rng):
    src = rng.integers(0, 255, size=256, dtype=np.uint8)
    flags = np.full(6, -1, np.int32)
    out = np.zeros(256, np.uint8)
    kernels["mbar_tx"]([src, flags, out], [], [1])
    np.testing.assert_array_equal(flags, [0, 0, 0, 1, 0, 1])
    np.testing.assert_array_equal(out, src)


def test_mbarrier_short_tx_times_out_with_counts(kernels):
    k = kernels["mbar_short_tx"]
    k.timeout_ms = 300
    with pytest.raises(EmulationError, match="0 of 1 arrivals and 128 tx bytes outstanding"):
        k([np.ones(128, np.uint8)], [], [1])


def test_bulk_copy_is_invisible_before_the_wait(kernels):
    out = np.zeros(64, np.uint8)
    kernels["mbar_no_wait"]([np.arange(64, dtype=np.uint8), out], [], [1])
    np.testing.assert_array_equal(out, np.full(64, 0xFF, np.uint8))  # still the block's poison


def _tma_model(g, row0, col0, swizzle, inner):
    """Box bytes as the hardware writes them: row-major box, zeros outside the tensor, 16-byte
    chunks XOR-swizzled by address bits 7.. (the box starts 1024-byte aligned)."""
    rows, cols = g.shape
    box = np.zeros((16, inner), np.uint16)
    for r in range(16):
        for c in range(inner):
            if 0 <= row0 + r < rows and 0 <= col0 + c < cols:
                box[r, c] = g[row0 + r, col0 + c]
    linear = box.view(np.uint8).ravel()
    out = np.zeros_like(linear)
    bits = {0: 0, 32: 1, 64: 3, 128: 7}[swizzle]
    for a in range(linear.size):
        out[a ^ (((a >> 7) & bits) << 4)] = linear[a]
    return out


@pytest.mark.parametrize("swizzle,inner,row0,col0", [(0, 64, 0, 0), (128, 64, 12, 16), (64, 32, -3, 8),
                                                     (32, 16, 5, -8)])
def test_tma_tile_load_with_oob_fill_and_swizzle(kernels, rng, swizzle, inner, row0, col0):
    rows, cols = 20, 40
    g = rng.integers(1, 60000, size=(rows, cols)).astype(np.uint16)
    out = np.zeros(inner * 16 * 2, np.uint8)
    scalars = (rows, cols, col0, row0, swizzle, inner)
    kernels["tma_2d"]([g, out, *(np.array(v, np.int32) for v in scalars)], [], [1])
    np.testing.assert_array_equal(out, _tma_model(g, row0, col0, swizzle, inner))
