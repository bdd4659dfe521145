"""The online-softmax and radix-select helpers of the device library (kf/softmax.cuh,
kf/radix.cuh) on host emulation, each against numpy (float64 where precision matters):
random inputs, ties, fully masked (-inf) rows, NaN keys, sizes that are not a multiple
of the warp, and the __match_any_sync emulation they rely on."""
import numpy as np
import pytest
import torch

from kernforge.kernels.topk import ordered_keys

from .conftest import CudaTestKernel, build_emu_module

LOG2E = float(np.log2(np.e))

SOFTMAX = r'''
#include "kf/softmax.cuh"
// Streams `tiles` (M, N) score tiles through online_softmax_step on an accumulator laid out
// as AccumLayout<MT, NT, WM, WN, WARPS>; writes the probabilities per tile and every thread's
// copy of the row vectors (m, l, rescale) per tile: [tile][thread][s].
template <int MT, int NT, int WM, int WN, int WARPS>
__device__ void softmax_case(const float* x, int tiles, float scale_log2, float* p, float* m_out, float* l_out,
                             float* r_out) {
  using S = kf::AccumShape<MT, NT, WM, WN, WARPS>;
  constexpr int M = S::M, N = NT * 8 * WN;
  extern __shared__ __align__(128) unsigned char kf_smem[];
  float* scratch = reinterpret_cast<float*>(kf_smem);
  const int t = threadIdx.x, lane = t & 31, w = t >> 5;
  float acc[S::REGS], m[S::ROWS], l[S::ROWS], rs[S::ROWS];
  for (int s = 0; s < S::ROWS; ++s) { m[s] = -kf_inf<float>(); l[s] = 0.0f; rs[s] = -1.0f; }
  for (int k = 0; k < tiles; ++k) {
    for (int r = 0; r < S::REGS; ++r) {
      const int mi = r / (NT * 4), ni = (r / 4) % NT, q = r & 3;
      const int row = mi * 16 * WM + (w % WM) * 16 + lane / 4 + 8 * (q >> 1);
      const int col = (w / WM) * (N / WN) + ni * 8 + 2 * (lane & 3) + (q & 1);
      acc[r] = S::owner() ? x[(k * M + row) * N + col] : 12345.0f;  // idle warps hold junk
    }
    kf::online_softmax_step<MT, NT, WM, WN, WARPS>(acc, m, l, rs, scale_log2, scratch);
    for (int r = 0; r < S::REGS && S::owner(); ++r) {
      const int mi = r / (NT * 4), ni = (r / 4) % NT, q = r & 3;
      const int row = mi * 16 * WM + (w % WM) * 16 + lane / 4 + 8 * (q >> 1);
      const int col = (w / WM) * (N / WN) + ni * 8 + 2 * (lane & 3) + (q & 1);
      p[(k * M + row) * N + col] = acc[r];
    }
    for (int s = 0; s < S::ROWS; ++s) {
      const int at = (k * blockDim.x + t) * S::ROWS + s;
      m_out[at] = m[s]; l_out[at] = l[s]; r_out[at] = rs[s];
    }
  }
}
#define CASE(NAME, MT, NT, WM, WN, WARPS)                                                                   \
  extern "C" __global__ void NAME(const float* x, int tiles, float scale_log2, float* p, float* m, float* l, \
                                  float* r) {                                                                \
    softmax_case<MT, NT, WM, WN, WARPS>(x, tiles, scale_log2, p, m, l, r);                                  \
  }
CASE(softmax_cross_idle, 1, 1, 1, 2, 8)
CASE(softmax_mla_demo, 1, 2, 4, 2, 8)
CASE(softmax_registers_only, 2, 1, 2, 1, 2)

// One thread per row of a row-major (rows, n) matrix in global memory; then the final step.
extern "C" __global__ void softmax_rows(float* x, int rows, int n, int tiles, float scale_log2, float sm_scale,
                                        float* m_out, float* l_out, float* r_out, float* lse, float* inv) {
  const int row = threadIdx.x;
  if (row >= rows) return;
  float m = -kf_inf<float>(), l = 0.0f, rs = 0.0f;
  for (int k = 0; k < tiles; ++k) {
    float* tile = x + (size_t)k * rows * n + (size_t)row * n;
    kf::online_softmax_row([&](int j) -> float& { return tile[j]; }, n, m, l, rs, scale_log2);
    m_out[k * rows + row] = m; l_out[k * rows + row] = l; r_out[k * rows + row] = rs;
  }
  lse[row] = kf::softmax_lse(m, l, sm_scale, kf_inf<float>());
  inv[row] = kf::softmax_inv_sum(l);
}
'''

RADIX = r'''
#include "kf/radix.cuh"
extern "C" __global__ void keys(const float* f, const unsigned short* b, const unsigned short* h, int n,
                                unsigned* kf_out, unsigned short* kb_out, unsigned short* kh_out, float* back) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    kf_out[i] = kf::radix_key(f[i]);
    kb_out[i] = kf::radix_key(kf_bitcast<kf_bf16>(b[i]));
    kh_out[i] = kf::radix_key(kf_bitcast<kf_half>(h[i]));
    back[i] = kf_bitcast<float>(kf::radix_key_bits(kf_out[i]));
  }
}

// hist (2^width ints) of digit (shift, width) over keys whose bits from hi_shift equal prefix's.
extern "C" __global__ void histogram(const unsigned* keys, int n, int shift, int width, unsigned prefix,
                                     int hi_shift, int* out) {
  extern __shared__ __align__(128) unsigned char kf_smem[];
  int* hist = reinterpret_cast<int*>(kf_smem);
  kf::radix_histogram<96>(keys, n, shift, width, prefix, hi_shift, hist);
  for (int b = threadIdx.x; b < (1 << width); b += blockDim.x) out[b] = hist[b];
}

// For each block: the bucket of hist[blockIdx.x] holding the need[blockIdx.x]-th largest key.
extern "C" __global__ void find_bucket(const int* hist, int nb, const int* need, int* out) {
  extern __shared__ __align__(128) unsigned char kf_smem[];
  int* h = reinterpret_cast<int*>(kf_smem);
  int* above = h + nb;
  int* scratch = above + nb;
  for (int b = threadIdx.x; b < nb; b += blockDim.x) h[b] = hist[blockIdx.x * nb + b];
  __syncthreads();
  const kf::RadixBucket r = kf::radix_find_bucket<128>(h, above, nb, need[blockIdx.x], scratch);
  out[(blockIdx.x * blockDim.x + threadIdx.x) * 2] = r.digit;      // every thread's answer
  out[(blockIdx.x * blockDim.x + threadIdx.x) * 2 + 1] = r.need;
}

// Lanes with pred add `count` to hist[digit], called directly (not through radix_histogram).
extern "C" __global__ void warp_add(const int* digit, const int* pred, int count, int* out) {
  extern __shared__ __align__(128) unsigned char kf_smem[];
  int* hist = reinterpret_cast<int*>(kf_smem);
  for (int b = threadIdx.x; b < 64; b += blockDim.x) hist[b] = 0;
  __syncthreads();
  kf::hist_add_warp(hist, digit[threadIdx.x], count, pred[threadIdx.x] != 0);
  __syncthreads();
  for (int b = threadIdx.x; b < 64; b += blockDim.x) out[b] = hist[b];
}

// __match_any_sync itself: out[tid] = the mask of lanes with the same value (32- and 64-bit).
extern "C" __global__ void match_any(const int* v, const long long* v64, unsigned* out, unsigned* out64) {
  out[threadIdx.x] = __match_any_sync(0xffffffffu, v[threadIdx.x]);
  out64[threadIdx.x] = __match_any_sync(0xffffffffu, (unsigned long long)v64[threadIdx.x]);
}
'''

F, I = ("float*", "buffer"), ("int*", "buffer")
CF, CI = ("const float*", "buffer"), ("const int*", "buffer")
INT, FLT = ("int", "scalar"), ("float", "scalar")
U16C, U16 = ("const unsigned short*", "buffer"), ("unsigned short*", "buffer")
U32C, U32 = ("const unsigned*", "buffer"), ("unsigned*", "buffer")
# (name, MT, NT, WM, WN, WARPS)
CONFIGS = [("softmax_cross_idle", 1, 1, 1, 2, 8), ("softmax_mla_demo", 1, 2, 4, 2, 8),
           ("softmax_registers_only", 2, 1, 2, 1, 2)]


@pytest.fixture(scope="module")
def kernels():
    sm = [CudaTestKernel(c[0], SOFTMAX if i == 0 else "", [CF, INT, FLT, F, F, F, F], c[5] * 32)
          for i, c in enumerate(CONFIGS)]
    sm.append(CudaTestKernel("softmax_rows", "", [F, INT, INT, INT, FLT, FLT, F, F, F, F, F], 64))
    rx = [CudaTestKernel("keys", RADIX, [CF, U16C, U16C, INT, U32, U16, U16, F], 64),
          CudaTestKernel("histogram", "", [U32C, INT, INT, INT, ("unsigned", "scalar"), INT, I], 96),
          CudaTestKernel("find_bucket", "", [CI, INT, CI, I], 128),
          CudaTestKernel("warp_add", "", [CI, CI, INT, I], 64),
          CudaTestKernel("match_any", "", [CI, ("const long long*", "buffer"), U32, U32], 64)]
    return build_emu_module("emu_test_softmax_radix", sm + rx, dynamic_smem=20480)


# ---------------------------------------------------------------- online softmax


def _reference(x, scale_log2):
    """float64 online softmax over tiles x[k] (M, N): per tile (p, m, l, rescale)."""
    m = np.full(x.shape[1], -np.inf)
    l = np.zeros(x.shape[1])
    out = []
    for tile in x.astype(np.float64):
        m_new = np.maximum(m, tile.max(axis=1))
        shift = np.where(m_new == -np.inf, 0.0, m_new)
        rescale = np.exp2((m - shift) * scale_log2)
        p = np.exp2((tile - shift[:, None]) * scale_log2)
        l = l * rescale + p.sum(axis=1)
        m = m_new
        out.append((p, m.copy(), l.copy(), rescale))
    return out


def _scores(rng, tiles, M, N):
    x = (rng.standard_normal((tiles, M, N)) * 4).astype(np.float32)
    x[rng.random(x.shape) < 0.2] = -np.inf                     # masked keys
    x[0, 1] = -np.inf                                          # a row masked in the first tile only
    x[:, 3] = -np.inf                                          # a row that never sees a key
    x[1, 5, : N // 2] = x[1, 5, 0]                             # ties, including at the row max
    x[2 % tiles, 6] = 7.25                                     # a constant row
    return x


@pytest.mark.parametrize("name,MT,NT,WM,WN,WARPS", CONFIGS)
def test_online_softmax_step_on_accumulator_registers(kernels, rng, name, MT, NT, WM, WN, WARPS):
    M, N, threads, tiles = MT * 16 * WM, NT * 8 * WN, WARPS * 32, 3
    x = _scores(rng, tiles, M, N)
    scale_log2 = np.array(0.125 * LOG2E, np.float32)
    p = np.full((tiles, M, N), np.nan, np.float32)
    m, l, r = (np.full((tiles, threads, MT * 2), np.nan, np.float32) for _ in range(3))
    kernels[name]([x, np.array(tiles, np.int32), scale_log2, p, m, l, r], [], [1])
    tid = np.arange(threads)[:, None]
    s = np.arange(MT * 2)[None, :]
    rows = (s >> 1) * 16 * WM + ((tid >> 5) % WM) * 16 + ((tid & 31) >> 2) + 8 * (s & 1)
    for k, (p_ref, m_ref, l_ref, r_ref) in enumerate(_reference(x, float(scale_log2))):
        np.testing.assert_allclose(p[k], p_ref, rtol=2e-6, atol=0, err_msg=f"probabilities, tile {k}")
        # every thread's replica of every row value, idle warps included
        np.testing.assert_array_equal(m[k], m_ref[rows].astype(np.float32), err_msg=f"running max, tile {k}")
        np.testing.assert_allclose(l[k], l_ref[rows], rtol=1e-5, atol=0, err_msg=f"running sum, tile {k}")
        np.testing.assert_allclose(r[k], r_ref[rows], rtol=2e-6, atol=0, err_msg=f"rescale, tile {k}")
    assert np.all(l[-1][rows == 3] == 0) and np.all(np.isneginf(m[-1][rows == 3])), "masked row must stay empty"
    assert not np.isnan(p).any() and not np.isnan(l).any()


def test_online_softmax_row_and_final_lse(kernels, rng):
    rows, n, tiles = 37, 13, 3                                 # neither a multiple of the warp
    x = _scores(rng, tiles, rows, n)
    scale_log2, sm_scale = np.array(0.3 * LOG2E, np.float32), np.array(0.3, np.float32)
    work = x.copy()
    m, l, r = (np.full((tiles, rows), np.nan, np.float32) for _ in range(3))
    lse, inv = np.full(rows, np.nan, np.float32), np.full(rows, np.nan, np.float32)
    kernels["softmax_rows"]([work, *(np.array(v, np.int32) for v in (rows, n, tiles)), scale_log2, sm_scale,
                             m, l, r, lse, inv], [], [1])
    ref = _reference(x, float(scale_log2))
    for k, (p_ref, m_ref, l_ref, r_ref) in enumerate(ref):
        np.testing.assert_allclose(work[k], p_ref, rtol=2e-6, atol=0)
        np.testing.assert_array_equal(m[k], m_ref.astype(np.float32))
        np.testing.assert_allclose(l[k], l_ref, rtol=1e-5, atol=0)
        np.testing.assert_allclose(r[k], r_ref, rtol=2e-6, atol=0)
    _, m_fin, l_fin, _ = ref[-1]
    with np.errstate(divide="ignore"):
        want_lse = np.where(l_fin > 0, m_fin * float(sm_scale) + np.log(l_fin), np.inf)
        want_inv = np.where(l_fin > 0, 1.0 / l_fin, 0.0)
    # the lse against the softmax of all scores at once (float64), not only the streamed form
    allx = x.transpose(1, 0, 2).reshape(rows, -1).astype(np.float64) * float(sm_scale)
    with np.errstate(divide="ignore", invalid="ignore"):
        direct = np.log(np.exp(allx - allx.max(1, keepdims=True)).sum(1)) + allx.max(1)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-5)
    np.testing.assert_allclose(lse[np.isfinite(direct)], direct[np.isfinite(direct)], rtol=1e-5, atol=1e-5)
    assert lse[3] == np.inf and inv[3] == 0
    np.testing.assert_allclose(inv, want_inv, rtol=1e-6)


# ---------------------------------------------------------------- radix select


def _specials(dtype):
    f = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, -1e-45, 1.0, -1.0, 3.4e38, -3.4e38],
                 np.float32)
    return torch.from_numpy(f).to(dtype)


def test_ordered_keys_match_float_order(kernels, rng):
    n = 1000                                                   # not a multiple of the warp
    f = torch.from_numpy((rng.standard_normal(n) * 10.0 ** rng.integers(-44, 37, n)).astype(np.float32))  # denormals too
    f[:12] = _specials(torch.float32)
    f[20] = torch.tensor(np.uint32(0xFFC12345).view(np.float32))  # negative NaN with a payload
    b = torch.from_numpy(rng.standard_normal(n).astype(np.float32)).bfloat16()
    b[:12] = _specials(torch.bfloat16)
    h = torch.from_numpy(rng.standard_normal(n).astype(np.float32)).half()
    h[:12] = _specials(torch.float16)
    h[30] = torch.tensor(np.uint16(0xFE01).view(np.float16))  # negative NaN with a payload
    kf_, kb, kh = np.zeros(n, np.uint32), np.zeros(n, np.uint16), np.zeros(n, np.uint16)
    back = np.full(n, np.nan, np.float32)
    kernels["keys"]([f.numpy(), b.view(torch.int16).numpy().view(np.uint16), h.view(torch.int16).numpy().view(np.uint16),
                     np.array(n, np.int32), kf_, kb, kh, back], [], [1])
    np.testing.assert_array_equal(kf_.astype(np.int64), ordered_keys(f).numpy())
    np.testing.assert_array_equal(kb.astype(np.int64), ordered_keys(b).numpy())
    # half: the same transform (independent statement: sign flip / inversion, NaN largest)
    raw = h.view(torch.int16).numpy().view(np.uint16).astype(np.int64)
    want_h = np.where(raw >= 0x8000, 0xFFFF - raw, raw + 0x8000)
    want_h = np.where(np.isnan(h.float().numpy()), 0xFFFF, want_h)
    np.testing.assert_array_equal(kh.astype(np.int64), want_h)
    for keys, vals in ((kf_, f.double().numpy()), (kb, b.double().numpy()), (kh, h.double().numpy())):
        ok = ~np.isnan(vals)                                   # unsigned key order == float order
        ranked = vals[ok][np.argsort(keys[ok], kind="stable")]
        assert np.all(ranked[1:] >= ranked[:-1])
        assert np.all(keys[~ok] == keys.max())
    finite = ~np.isnan(f.numpy())
    np.testing.assert_array_equal(back[finite].view(np.uint32), f.numpy()[finite].view(np.uint32))


@pytest.mark.parametrize("n", [1, 95, 1000, 4099])
def test_block_histogram_of_digits(kernels, rng, n):
    # few distinct values: many lanes of a warp share a digit (the aggregated path)
    keys = rng.choice(rng.integers(0, 2**32, 7, dtype=np.uint64), n).astype(np.uint32)
    fresh = rng.random(n) < 0.5
    keys[fresh] = rng.integers(0, 2**32, fresh.sum(), dtype=np.uint64).astype(np.uint32)
    for shift, width, hi_shift in ((21, 11, 32), (13, 8, 21), (0, 5, 5)):
        prefix = np.array(keys[n // 2], np.uint32)
        out = np.full(1 << width, -77, np.int32)
        kernels["histogram"]([keys, np.array(n, np.int32), np.array(shift, np.int32), np.array(width, np.int32),
                              prefix, np.array(hi_shift, np.int32), out], [], [1])
        sel = keys if hi_shift >= 32 else keys[(keys >> np.uint32(hi_shift)) == (prefix >> np.uint32(hi_shift))]
        want = np.bincount((sel >> np.uint32(shift)) & np.uint32((1 << width) - 1), minlength=1 << width)
        np.testing.assert_array_equal(out, want, err_msg=f"n={n} digit ({shift}, {width}) filter {hi_shift}")


def test_find_bucket_of_kth_largest(kernels, rng):
    nb, blocks = 2048, 6
    hist = rng.integers(0, 3, (blocks, nb)).astype(np.int32)
    hist[1] = 0
    hist[1, 17] = 40                                           # every key in one bucket (ties)
    hist[2, :] = 0                                             # empty: no bucket reaches need
    total = hist.sum(1)
    need = np.array([1, 23, 5, total[3], total[4] // 2, 1], np.int32)
    hist[5, -1] = 1                                            # the largest bucket holds the first key
    out = np.full((blocks, 128, 2), -99, np.int32)
    kernels["find_bucket"]([hist, np.array(nb, np.int32), need, out], [], [blocks])
    for blk in range(blocks):
        above = np.cumsum(hist[blk][::-1])[::-1]
        reached = int((above >= need[blk]).sum())
        digit = reached - 1
        rank = need[blk] - (above[reached] if 0 < reached < nb else 0) if reached else need[blk]
        if reached:                                            # an independent statement of the answer
            seen_above = hist[blk][digit + 1:].sum()
            assert seen_above < need[blk] <= seen_above + hist[blk][digit]
            assert rank == need[blk] - seen_above
        assert np.all(out[blk, :, 0] == digit) and np.all(out[blk, :, 1] == rank), f"block {blk}"
    assert out[2, 0, 0] == -1


def test_warp_aggregated_add_and_match_any(kernels, rng):
    digit = rng.integers(0, 6, 64).astype(np.int32)
    digit[32:48] = 9                                           # half a warp on one address
    pred = (rng.random(64) < 0.7).astype(np.int32)
    out = np.full(64, -1, np.int32)
    kernels["warp_add"]([digit, pred, np.array(3, np.int32), out], [], [1])
    np.testing.assert_array_equal(out, 3 * np.bincount(digit[pred != 0], minlength=64))
    v = rng.integers(0, 4, 64).astype(np.int32)
    v64 = (v.astype(np.int64) << 33) | (rng.integers(0, 2, 64) << 32)  # differ only above bit 31
    got, got64 = np.zeros(64, np.uint32), np.zeros(64, np.uint32)
    kernels["match_any"]([v, v64, got, got64], [], [1])
    for vals, res in ((v, got), (v64, got64)):
        for t in range(64):
            warp = slice(t // 32 * 32, t // 32 * 32 + 32)
            want = sum(1 << l for l, x in enumerate(vals[warp]) if x == vals[t])
            assert res[t] == want, t
