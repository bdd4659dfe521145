"""Warp collectives, block barriers and cp.async groups of the host emulation,
each against a plain Python statement of the CUDA/PTX semantics."""
import time

import numpy as np
import pytest

from kernforge.backends.cuda_emu.backend import EmulationError

from .conftest import CudaTestKernel, build_emu_module

SHUFFLES = r'''
// out[case][tid]: the value each lane receives for shuffle case `case` (values are lane*10 + warp*1000).
extern "C" __global__ void shuffles(int* out) {
  const int tid = threadIdx.x, lane = tid % 32;
  const int v = lane * 10 + (tid / 32) * 1000;
  const int n = blockDim.x;
  int c = 0;
  out[c++ * n + tid] = __shfl_sync(0xffffffffu, v, 5);
  out[c++ * n + tid] = __shfl_sync(0xffffffffu, v, (lane + 3) % 32);
  out[c++ * n + tid] = __shfl_sync(0xffffffffu, v, 3, 8);
  out[c++ * n + tid] = __shfl_sync(0xffffffffu, v, 37);
  out[c++ * n + tid] = __shfl_up_sync(0xffffffffu, v, 1);
  out[c++ * n + tid] = __shfl_up_sync(0xffffffffu, v, 3, 16);
  out[c++ * n + tid] = __shfl_down_sync(0xffffffffu, v, 2);
  out[c++ * n + tid] = __shfl_down_sync(0xffffffffu, v, 5, 8);
  out[c++ * n + tid] = __shfl_xor_sync(0xffffffffu, v, 1);
  out[c++ * n + tid] = __shfl_xor_sync(0xffffffffu, v, 16);
  out[c++ * n + tid] = __shfl_xor_sync(0xffffffffu, v, 4, 4);
  out[c++ * n + tid] = (int)__ballot_sync(0xffffffffu, lane % 3 == 0);
  out[c++ * n + tid] = __any_sync(0xffffffffu, tid == 40);
  out[c++ * n + tid] = __all_sync(0xffffffffu, lane < 31);
  out[c++ * n + tid] = __all_sync(0xffffffffu, lane < 32);
  out[c++ * n + tid] = __reduce_add_sync(0xffffffffu, v);
  out[c++ * n + tid] = __reduce_max_sync(0xffffffffu, (lane * 7) % 32);
  out[c++ * n + tid] = (int)__shfl_xor_sync(0xffffffffu, (float)v + 0.5f, 2);
  out[c++ * n + tid] = __syncthreads_count(tid % 5 == 0);
  out[c++ * n + tid] = __syncthreads_or(tid == 63);
  out[c++ * n + tid] = __syncthreads_and(tid < 63);
}
'''


def _expected(n_threads):
    """CUDA semantics of each case above, lane by lane."""
    cols = []
    tid = np.arange(n_threads)
    lane, warp = tid % 32, tid // 32
    v = lane * 10 + warp * 1000

    def from_lane(src):
        return src * 10 + warp * 1000

    seg = lambda w: (lane // w) * w  # noqa: E731
    cols.append(from_lane(np.full_like(lane, 5)))
    cols.append(from_lane((lane + 3) % 32))
    cols.append(from_lane(seg(8) + 3))
    cols.append(from_lane(np.full_like(lane, 37 % 32)))
    cols.append(np.where(lane >= 1, from_lane(lane - 1), v))                  # up: lanes below delta keep their own
    cols.append(np.where(lane - seg(16) >= 3, from_lane(lane - 3), v))
    cols.append(np.where(lane + 2 < 32, from_lane(lane + 2), v))              # down: past the segment keeps own
    cols.append(np.where(lane + 5 < seg(8) + 8, from_lane(lane + 5), v))
    cols.append(from_lane(lane ^ 1))
    cols.append(from_lane(lane ^ 16))
    cols.append(np.where((lane ^ 4) < seg(4) + 4, from_lane(lane ^ 4), v))  # xor leaving the segment keeps own
    ballot = sum(1 << l for l in range(32) if l % 3 == 0)
    cols.append(np.full_like(lane, np.int64(ballot).astype(np.uint32).astype(np.int32)))
    cols.append((warp == 1).astype(int))
    cols.append(np.zeros_like(lane))
    cols.append(np.ones_like(lane))
    cols.append(np.array([sum(l * 10 + w * 1000 for l in range(32)) for w in warp]))
    cols.append(np.full_like(lane, 31))
    cols.append(from_lane(lane ^ 2))
    cols.append(np.full_like(lane, (tid % 5 == 0).sum()))
    cols.append(np.ones_like(lane))
    cols.append(np.zeros_like(lane))
    return np.stack(cols).astype(np.int32)


def test_shuffles_votes_and_block_counts(kernels):
    kern = kernels["shuffles"]
    want = _expected(96)
    for _ in range(3):  # repeated launches reuse the emulator's state
        out = np.full(want.shape, -7777, np.int32)
        kern([out], [], [2])
        np.testing.assert_array_equal(out, want)


BARRIER_ROTATE = r'''
// Each round: every thread writes its slot, barrier, reads its neighbour's, barrier.
extern "C" __global__ void KNAME(const int* x, int* out, int rounds) {
  extern __shared__ __align__(128) unsigned char kf_smem[];
  int* slot = reinterpret_cast<int*>(kf_smem);
  const int n = blockDim.x, t = threadIdx.x;
  int v = x[blockIdx.x * n + t];
  for (int r = 0; r < rounds; ++r) {
    slot[t] = v;
    __syncthreads();
    v = slot[(t + 1) % n] + 1;
    __syncthreads();
  }
  out[blockIdx.x * n + t] = v;
}
'''
ROT_PARAMS = [("const int*", "buffer"), ("int*", "buffer"), ("int", "scalar")]


def test_syncthreads_orders_shared_memory(rng, kernels):
    kern = kernels["rotate"]
    x = rng.integers(-1000, 1000, size=(3, 64)).astype(np.int32)
    out = np.full_like(x, -1)
    kern([x, out, np.array(37, np.int32)], [], [3])
    np.testing.assert_array_equal(out, np.roll(x, -37, axis=1) + 37)


def test_missing_barrier_is_visible(rng, kernels):
    """Without the second barrier a fast thread overwrites its slot before its
    neighbour read it; over many rounds the emulation must show the race."""
    kern = kernels["rotate_racy"]
    x = rng.integers(-1000, 1000, size=(3, 64)).astype(np.int32)
    out = np.full_like(x, -1)
    kern([x, out, np.array(200, np.int32)], [], [3])
    assert not np.array_equal(out, np.roll(x, -200, axis=1) + 200)


DIVERGENT_BARRIER = r'''
extern "C" __global__ void divergent_barrier(int* out) {
  if (threadIdx.x < 40) __syncthreads();
  out[threadIdx.x] = 1;
}
'''


def test_barrier_not_reached_by_all_threads_fails_fast(kernels):
    kern = kernels["divergent_barrier"]
    kern.timeout_ms = 60_000
    t0 = time.perf_counter()
    with pytest.raises(EmulationError, match=r"deadlock: __syncthreads\(\) reached by 40 of 64 threads"):
        kern([np.zeros(64, np.int32)], [], [1])
    assert time.perf_counter() - t0 < 10  # reported at once, not after the 60 s timeout


CROSS_DEADLOCK = r'''
extern "C" __global__ void cross_deadlock(int* out) {
  if (threadIdx.x < 16) __syncwarp(); else __syncthreads();
  out[threadIdx.x] = 1;
}
'''


def test_cross_deadlock_times_out_with_message(kernels):
    """Half a warp waits in __syncwarp, the rest in __syncthreads: nobody exits.  The
    timeout (300 ms) is below the emulator's quiet time (400 ms), so the timeout ends it."""
    kern = kernels["cross_deadlock"]
    kern.timeout_ms = 300
    with pytest.raises(EmulationError, match="deadlock: timed out after 300 ms"):
        kern([np.zeros(32, np.int32)], [], [1])
    out = np.zeros(64, np.int32)  # the module stays usable after an aborted launch
    x = np.arange(64, dtype=np.int32).reshape(1, 64)
    kernels["rotate"]([x, out, np.array(1, np.int32)], [], [1])
    np.testing.assert_array_equal(out, np.roll(x, -1, axis=1)[0] + 1)


def test_cross_deadlock_is_reported_once_every_thread_waits(kernels):
    """The same deadlock under a 60 s timeout: every thread waits and none can release another,
    so the emulator says so after its quiet time (0.4 s), not after the timeout."""
    kern = kernels["cross_deadlock"]
    kern.timeout_ms = 60_000
    t0 = time.perf_counter()
    with pytest.raises(EmulationError, match="deadlock: every emulated thread is waiting and none can release "
                                             "another; this one waits at"):
        kern([np.zeros(32, np.int32)], [], [1])
    assert time.perf_counter() - t0 < 10


PARTIAL_MASK = r'''
extern "C" __global__ void partial_mask(int* out) { out[threadIdx.x] = __shfl_sync(0x0000ffffu, (int)threadIdx.x, 0); }
'''


def test_partial_mask_is_rejected(kernels):
    kern = kernels["partial_mask"]
    with pytest.raises(EmulationError, match="member mask 0x0000ffff leaves out live lanes"):
        kern([np.zeros(32, np.int32)], [], [1])


CP_ASYNC = r'''
#include "kf/cp_async.cuh"
// Thread 0 issues three 16-byte copies in three groups (the last one 5 bytes + zero fill),
// and snapshots the destination after each wait.
extern "C" __global__ void cp_async_groups(const unsigned char* src, unsigned char* snap) {
  extern __shared__ __align__(128) unsigned char kf_smem[];
  if (threadIdx.x == 0) {
    for (int i = 0; i < 48; ++i) kf_smem[i] = 0xAB;
    kf::cp_async_cg_16(kf_smem, src, 16);
    kf::cp_async_commit();
    kf::cp_async_cg_16(kf_smem + 16, src + 16, 16);
    kf::cp_async_commit();
    kf::cp_async_cg_16(kf_smem + 32, src + 32, 5);
    kf::cp_async_commit();
    for (int i = 0; i < 48; ++i) snap[i] = kf_smem[i];
    kf::cp_async_wait<2>();
    for (int i = 0; i < 48; ++i) snap[48 + i] = kf_smem[i];
    kf::cp_async_wait<1>();
    for (int i = 0; i < 48; ++i) snap[96 + i] = kf_smem[i];
    kf::cp_async_wait<0>();
    for (int i = 0; i < 48; ++i) snap[144 + i] = kf_smem[i];
  }
}
'''


def test_cp_async_groups_complete_at_their_wait(rng, kernels):
    kern = kernels["cp_async_groups"]
    src = rng.integers(0, 255, size=48, dtype=np.uint8)
    src[src == 0xAB] = 1
    snap = np.zeros((4, 48), np.uint8)
    kern([src, snap], [], [1])
    done = np.full(48, 0xAB, np.uint8)
    np.testing.assert_array_equal(snap[0], done)            # issued, nothing waited: nothing landed
    done[:16] = src[:16]
    np.testing.assert_array_equal(snap[1], done)            # wait_group 2: oldest group only
    done[16:32] = src[16:32]
    np.testing.assert_array_equal(snap[2], done)
    done[32:37] = src[32:37]
    done[37:48] = 0                                          # src-size 5: the rest zero-filled
    np.testing.assert_array_equal(snap[3], done)


CP_ASYNC_MISALIGNED = r'''
#include "kf/cp_async.cuh"
extern "C" __global__ void cp_async_misaligned(const unsigned char* src) {
  extern __shared__ __align__(128) unsigned char kf_smem[];
  kf::cp_async_cg_16(kf_smem + 8, src, 16);
}
'''


def test_cp_async_rejects_misaligned_destination(kernels):
    kern = kernels["cp_async_misaligned"]
    with pytest.raises(EmulationError, match="destination is not aligned"):
        kern([np.zeros(64, np.uint8)], [], [1])


POISON = r'''
extern "C" __global__ void poison(unsigned* out) {
  extern __shared__ __align__(128) unsigned char kf_smem[];
  unsigned* s = reinterpret_cast<unsigned*>(kf_smem);
  if (threadIdx.x == 0) { out[blockIdx.x] = s[1]; s[1] = 12345u; }
}
'''


def test_shared_memory_is_poisoned_between_blocks(kernels):
    kern = kernels["poison"]
    out = np.zeros(3, np.uint32)
    kern([out], [], [3])
    np.testing.assert_array_equal(out, [0xFFFFFFFF] * 3)  # never the previous block's 12345


PARTIAL_WARP = r'''
// 48 threads: warp 1 has 16 live lanes.  out[t] = value from lane ^ m.
extern "C" __global__ void partial_warp(int* out, int m) {
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (int)threadIdx.x * 3, m);
}
'''


def test_partial_last_warp(kernels):
    out = np.full(48, -1, np.int32)
    kernels["partial_warp"]([out, np.array(1, np.int32)], [], [1])
    np.testing.assert_array_equal(out, (np.arange(48) ^ 1) * 3)
    absent = r"lane \d+ reads lane (1[6-9]|2\d|3[01]), which does not exist in a warp of 16 threads"
    with pytest.raises(EmulationError, match=absent):
        kernels["partial_warp"]([out, np.array(16, np.int32)], [], [1])


CONVERT = r'''
// Bit patterns of float -> bf16 / f16 (RNE) and -> e4m3 (RNE; NOSAT and SATFINITE) for each input.
extern "C" __global__ void convert(const float* x, unsigned short* bf, unsigned short* hf, unsigned char* e4,
                                   unsigned char* e4sat, float* back, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    bf[i] = __bfloat16_as_ushort(__float2bfloat16_rn(x[i]));
    hf[i] = __half_as_ushort(__float2half_rn(x[i]));
    e4[i] = __nv_cvt_float_to_fp8(x[i], __NV_NOSAT, __NV_E4M3);
    e4sat[i] = __nv_fp8_e4m3(x[i]).__x;
    back[i] = float(__nv_fp8_e4m3(x[i]));
  }
}
'''


def _conversion_inputs(rng):
    specials = np.array([0.0, -0.0, 1.0, -1.0, 448.0, 464.0, 464.1, 480.0, -500.0, 65504.0, 65520.0, 1e-8, 6e-5,
                         2.0 ** -9, 2.0 ** -10, 1.5 * 2.0 ** -10, np.inf, -np.inf, 3.0e38, 1e-40], np.float32)
    ties = (rng.integers(0, 2 ** 16, 300, dtype=np.uint32) << 16 | 0x8000).view(np.float32)  # bf16 halfway points
    wide = (rng.standard_normal(2000) * np.exp(rng.uniform(-25, 25, 2000))).astype(np.float32)
    x = np.concatenate([specials, ties, wide])
    return x[np.isfinite(x) | np.isinf(x)]


def test_low_precision_conversions_match_ml_dtypes(kernels, rng):
    import ml_dtypes

    x = _conversion_inputs(rng)
    x = x[~np.isnan(x)]
    n = x.size
    bf, hf = np.zeros(n, np.uint16), np.zeros(n, np.uint16)
    e4, e4sat, back = np.zeros(n, np.uint8), np.zeros(n, np.uint8), np.zeros(n, np.float32)
    kernels["convert"]([x, bf, hf, e4, e4sat, back, np.array(n, np.int32)], [], [1])
    with np.errstate(over="ignore", invalid="ignore"):
        want_bf = x.astype(ml_dtypes.bfloat16).view(np.uint16)
        want_hf = x.astype(np.float16).view(np.uint16)
        want_e4 = x.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    np.testing.assert_array_equal(bf, want_bf)
    np.testing.assert_array_equal(hf, want_hf)
    np.testing.assert_array_equal(e4 & 0x7F, want_e4 & 0x7F)  # ml_dtypes drops the sign of NaN
    sat = np.clip(x, -448, 448).astype(ml_dtypes.float8_e4m3fn)
    np.testing.assert_array_equal(e4sat, sat.view(np.uint8))
    np.testing.assert_array_equal(back, sat.astype(np.float32))


def test_nan_converts_to_canonical_nan(kernels):
    x = np.array([np.nan, -np.nan, np.float32(np.nan) * -1], np.float32)
    bf, hf = np.zeros(3, np.uint16), np.zeros(3, np.uint16)
    e4, e4sat, back = np.zeros(3, np.uint8), np.zeros(3, np.uint8), np.zeros(3, np.float32)
    kernels["convert"]([x, bf, hf, e4, e4sat, back, np.array(3, np.int32)], [], [1])
    np.testing.assert_array_equal(bf, [0x7FFF] * 3)  # cvt.rn.bf16.f32 on NaN
    np.testing.assert_array_equal(hf, [0x7FFF] * 3)
    np.testing.assert_array_equal(e4, [0x7F] * 3)
    assert np.isnan(back).all()


INT = ("int*", "buffer")


@pytest.fixture(scope="module")
def kernels():
    racy = BARRIER_ROTATE.replace("v = slot[(t + 1) % n] + 1;\n    __syncthreads();", "v = slot[(t + 1) % n] + 1;")
    assert racy != BARRIER_ROTATE
    u8 = ("const unsigned char*", "buffer")
    return build_emu_module("emu_test_threads", [
        CudaTestKernel("shuffles", SHUFFLES, [INT], 96),
        CudaTestKernel("rotate", BARRIER_ROTATE.replace("KNAME", "rotate"), ROT_PARAMS, 64),
        CudaTestKernel("rotate_racy", racy.replace("KNAME", "rotate_racy"), ROT_PARAMS, 64),
        CudaTestKernel("divergent_barrier", DIVERGENT_BARRIER, [INT], 64),
        CudaTestKernel("cross_deadlock", CROSS_DEADLOCK, [INT], 32),
        CudaTestKernel("partial_mask", PARTIAL_MASK, [INT], 32),
        CudaTestKernel("cp_async_groups", CP_ASYNC, [u8, ("unsigned char*", "buffer")], 32),
        CudaTestKernel("cp_async_misaligned", CP_ASYNC_MISALIGNED, [u8], 32),
        CudaTestKernel("poison", POISON, [("unsigned*", "buffer")], 32),
        CudaTestKernel("partial_warp", PARTIAL_WARP, [INT, ("int", "scalar")], 48),
        CudaTestKernel("convert", CONVERT, [("const float*", "buffer"), ("unsigned short*", "buffer"),
                                            ("unsigned short*", "buffer"), ("unsigned char*", "buffer"),
                                            ("unsigned char*", "buffer"), ("float*", "buffer"), ("int", "scalar")], 64),
    ], dynamic_smem=256)
