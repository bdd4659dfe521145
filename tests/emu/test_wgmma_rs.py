"""Register-A wgmma (``kf::wgmma_m64nNk16_f32_bf16_rs``) and the accumulator-to-A packer
(``kf::wgmma_accum_to_a_bf16``) on host emulation: FlashAttention-3's P*V, where P is the
bf16-rounded accumulator of the QK wgmma, fed to the next wgmma from registers.

Two independent checks of the register fragment layout:
 * ``rs_direct`` builds A fragments from global memory with the PTX ISA's A-fragment formula,
   written out in the kernel (not the packer), so an emulator that maps lanes/registers to A
   elements another way computes a different product than float64 numpy;
 * ``rs_chain`` runs S = Q*K^T (shared-memory wgmma), packs S with the library packer and runs
   O = P*V with the register-A form; a packer that does not match the accumulator layout gives a
   different O.
Planted kernel bugs (packer row mapping, swapped halves, B transpose flag) and planted emulator
bugs (A read at the wait instead of at issue, A registers taken in K order) must each fail.
"""
from __future__ import annotations

import shutil

import ml_dtypes
import numpy as np
import pytest

from kernforge.backends.cuda_emu import backend as emu_backend

from .conftest import CudaTestKernel, build_emu_module

BF16 = ml_dtypes.bfloat16
KQ = 32  # Q/K depth: two k16 smem wgmmas for S
NS = 64  # S columns = P*V depth: four register-A k16 steps

SOURCE = r'''
#include "kf/wgmma.cuh"
// Operand tiles in shared memory, no swizzle, 8x8 core-matrix order (kf/wgmma.cuh):
// K-major R x C tile: element (r, c) at ((r/8)*(C/8) + c/8)*64 + (r%8)*8 + c%8; LBO 128, SBO (C/8)*128.
// MN-major K x N tile (TRANS_B = 1): element (k, n) at ((k/8)*(N/8) + n/8)*64 + (k%8)*8 + n%8;
// LBO (N/8)*128, SBO 128.
__device__ void kmajor_to_smem(const kf_bf16* src, kf_bf16* dst, int R, int C) {
  for (int i = threadIdx.x; i < R * C; i += 128) {
    const int r = i / C, c = i % C;
    dst[((r / 8) * (C / 8) + c / 8) * 64 + (r % 8) * 8 + c % 8] = src[i];
  }
}
// B of P*V from V (KV x NV, row-major): TRANS_B = 1 stores it as is (MN-major: the K-major formula
// with rows = K, columns = N), 0 stores V^T (K-major).
template <int NV, int TB>
__device__ void v_to_smem(const kf_bf16* V, kf_bf16* sV) {
  if constexpr (TB) {
    kmajor_to_smem(V, sV, NS_, NV);
  } else {
    for (int i = threadIdx.x; i < NS_ * NV; i += 128) {
      const int k = i / NV, n = i % NV;  // V(k, n) = V^T(n, k)
      sV[((n / 8) * (NS_ / 8) + k / 8) * 64 + (n % 8) * 8 + k % 8] = V[i];
    }
  }
}
// The descriptor of k step kk (rows 16kk .. 16kk+15 of V).
template <int NV, int TB>
__device__ uint64_t v_desc(const kf_bf16* sV, int kk) {
  return TB ? kf::make_smem_desc(sV + kk * 2 * (NV / 8) * 64, (NV / 8) * 128, 128)
            : kf::make_smem_desc(sV + kk * 128, 128, (NS_ / 8) * 128);
}

// The ISA's A fragment of k step kk, read from a row-major 64 x K matrix: a[r] = {A(16w + g + 8(r%2),
// 16kk + 2t + 8(r/2) + h), h = 0 low, 1 high}.
__device__ void a_fragment(const kf_bf16* A, int K, int kk, uint32_t (&a)[4]) {
  const int w = threadIdx.x / 32, g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  for (int r = 0; r < 4; ++r) {
    const int row = 16 * w + g + 8 * (r % 2), col = 16 * kk + 2 * t + 8 * (r / 2);
    const uint32_t lo = __bfloat16_as_ushort(A[row * K + col]), hi = __bfloat16_as_ushort(A[row * K + col + 1]);
    a[r] = lo | hi << 16;
  }
}

template <int N>
__device__ void store_accum(const float (&d)[N / 2], float* D) {
  const int w = threadIdx.x / 32, g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  for (int j = 0; j < N / 8; ++j)
    for (int q = 0; q < 4; ++q) D[(16 * w + g + 8 * (q / 2)) * N + 8 * j + 2 * t + q % 2] = d[4 * j + q];
}

// D(64 x N) = A(64 x NS) * V(NS x N), A in registers straight from global memory.
template <int N, int TB>
__device__ void rs_direct_run(const kf_bf16* A, const kf_bf16* V, float* D) {
  extern __shared__ __align__(128) unsigned char kf_smem[];
  kf_bf16* sV = reinterpret_cast<kf_bf16*>(kf_smem);
  v_to_smem<N, TB>(V, sV);
  kf::fence_proxy_async();
  __syncthreads();
  uint32_t frags[NS_ / 16][4];  // loaded before the wgmmas: no register writes between them (ptxas C7519)
  for (int kk = 0; kk < NS_ / 16; ++kk) a_fragment(A, NS_, kk, frags[kk]);
  float d[N / 2];
  for (int i = 0; i < N / 2; ++i) d[i] = 100.0f;  // dropped by the first step's scale_d = 0
  kf::wgmma_fence_operand(d);
  kf::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < NS_ / 16; ++kk) {
    kf::wgmma_m64nNk16_f32_bf16_rs<N, TB>(d, frags[kk], v_desc<N, TB>(sV, kk), kk > 0);
  }
  kf::wgmma_commit();
  kf::wgmma_wait<0>();
  kf::wgmma_fence_operand(d);
  store_accum<N>(d, D);
}

// Planted packer bugs: 1 rows g and g+8 exchanged (a[r] <-> a[r^1]), 2 the bf16 halves of each
// register exchanged.  0 is the library's kf::wgmma_accum_to_a_bf16.
template <int PLANT>
__device__ void pack(const float (&s)[NS_ / 2], uint32_t (&p)[NS_ / 16][4]) {
  kf::wgmma_accum_to_a_bf16(s, p);
  for (int kk = 0; kk < NS_ / 16; ++kk)
    for (int r = 0; r < 4; ++r) {
      if (PLANT == 1 && r % 2 == 0) { const uint32_t x = p[kk][r]; p[kk][r] = p[kk][r + 1]; p[kk][r + 1] = x; }
      if (PLANT == 2) p[kk][r] = p[kk][r] >> 16 | p[kk][r] << 16;
    }
}

// S = Q * K^T (64 x NS, smem wgmma), P = bf16(S) by the packer, O = P * V (register-A wgmma).
// PLANT 3: V stored for one TRANS_B, the instruction told the other.
template <int NV, int TB, int PLANT>
__device__ void rs_chain_run(const kf_bf16* Q, const kf_bf16* Kt, const kf_bf16* V, float* S, float* O) {
  extern __shared__ __align__(128) unsigned char kf_smem[];
  kf_bf16* sQ = reinterpret_cast<kf_bf16*>(kf_smem);
  kf_bf16* sK = sQ + 64 * KQ_;
  kf_bf16* sV = sK + NS_ * KQ_;
  kmajor_to_smem(Q, sQ, 64, KQ_);
  kmajor_to_smem(Kt, sK, NS_, KQ_);
  v_to_smem<NV, TB>(V, sV);
  kf::fence_proxy_async();
  __syncthreads();
  float s[NS_ / 2];
  kf::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < KQ_ / 16; ++kk)
    kf::wgmma_m64nNk16_f32_bf16<NS_, 0, 0>(s, kf::make_smem_desc(sQ + kk * 128, 128, (KQ_ / 8) * 128),
                                           kf::make_smem_desc(sK + kk * 128, 128, (KQ_ / 8) * 128), kk > 0);
  kf::wgmma_commit();
  kf::wgmma_wait<0>();
  kf::wgmma_fence_operand(s);
  store_accum<NS_>(s, S);
  uint32_t p[NS_ / 16][4];
  pack<PLANT>(s, p);
  float o[NV / 2];
  for (int i = 0; i < NV / 2; ++i) o[i] = 100.0f;
  kf::wgmma_fence_operand(o);
  kf::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < NS_ / 16; ++kk) {
    uint32_t a[4];  // this step's slice of P in a short-lived array: the emulator must read it at issue
    for (int r = 0; r < 4; ++r) a[r] = p[kk][r];
    kf::wgmma_m64nNk16_f32_bf16_rs<NV, (PLANT == 3 ? 1 - TB : TB)>(o, a, v_desc<NV, TB>(sV, kk), kk > 0);
  }
  kf::wgmma_commit();
  kf::wgmma_wait<0>();
  kf::wgmma_fence_operand(o);
  store_accum<NV>(o, O);
}

#define KF_CHAIN(name, NV, TB, PLANT)                                                                   \
  extern "C" __global__ void name(const kf_bf16* Q, const kf_bf16* Kt, const kf_bf16* V, float* S, float* O) { \
    rs_chain_run<NV, TB, PLANT>(Q, Kt, V, S, O);                                                        \
  }
KF_CHAIN(rs_chain, 256, 1, 0)
KF_CHAIN(rs_chain_kmajor_v, 40, 0, 0)
KF_CHAIN(rs_chain_rows_swapped, 256, 1, 1)
KF_CHAIN(rs_chain_halves_swapped, 256, 1, 2)
KF_CHAIN(rs_chain_b_not_transposed, 256, 1, 3)
extern "C" __global__ void rs_direct(const kf_bf16* A, const kf_bf16* V, float* D) { rs_direct_run<24, 1>(A, V, D); }
'''.replace("NS_", str(NS)).replace("KQ_", str(KQ))

CHAIN_ARGS = [("const kf_bf16*", "buffer")] * 3 + [("float*", "buffer")] * 2
DIRECT_ARGS = [("const kf_bf16*", "buffer")] * 2 + [("float*", "buffer")]
CHAIN_NV = {"rs_chain": 256, "rs_chain_kmajor_v": 40, "rs_chain_rows_swapped": 256, "rs_chain_halves_swapped": 256,
            "rs_chain_b_not_transposed": 256}
PLANTED = ("rs_chain_rows_swapped", "rs_chain_halves_swapped", "rs_chain_b_not_transposed")
SMEM = 2 * (64 * KQ + NS * KQ + NS * 256)


def _module(tag: str, names) -> dict:
    kernels = [CudaTestKernel(n, SOURCE if i == 0 else "", DIRECT_ARGS if n == "rs_direct" else CHAIN_ARGS, 128)
               for i, n in enumerate(names)]
    return build_emu_module(tag, kernels, dynamic_smem=SMEM)


@pytest.fixture(scope="module")
def kernels():
    return _module("emu_test_wgmma_rs", ["rs_chain", "rs_direct", "rs_chain_kmajor_v", *PLANTED])


def _bf16(rng, shape):
    return rng.standard_normal(shape).astype(BF16)


def _chain_operands(rng, nv):
    q, kt, v = _bf16(rng, (64, KQ)), _bf16(rng, (NS, KQ)), _bf16(rng, (NS, nv))
    q[0, :3] = np.array([0.0, -0.0, 2.0 ** -130], np.float32).astype(BF16)  # zero, signed zero, subnormal
    return q, kt, v


def _run_chain(kern, q, kt, v):
    s = np.full((64, NS), np.nan, np.float32)
    o = np.full((64, v.shape[1]), np.nan, np.float32)
    kern([q.view(np.uint16), kt.view(np.uint16), v.view(np.uint16), s, o], [], [1])
    return s, o


def _chain_reference(q, kt, v, s=None):
    """float64 S, and O = P * V in float64 with P = bf16(S) rounded to nearest even (the packer);
    P is rounded from the kernel's own S when given (a float32 S one ulp off the float64 one may
    round to the other bf16 neighbour; S itself is checked against float64 separately)."""
    s64 = q.astype(np.float64) @ kt.astype(np.float64).T
    p = (s64.astype(np.float32) if s is None else s).astype(BF16)
    return s64, p.astype(np.float64) @ v.astype(np.float64)


def _check_chain(s, o, q, kt, v):
    s64, o64 = _chain_reference(q, kt, v, s)
    np.testing.assert_allclose(s, s64, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(o, o64, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("name", ["rs_chain", "rs_chain_kmajor_v"])
def test_accum_packed_as_a_feeds_register_a_wgmma(rng, kernels, name):
    """FA3's P*V: N = 256 with V MN-major (TRANS_B = 1, MLA's layout) and N = 40 with V^T K-major."""
    for _ in range(2):
        q, kt, v = _chain_operands(rng, CHAIN_NV[name])
        _check_chain(*_run_chain(kernels[name], q, kt, v), q, kt, v)


def test_packer_rounds_to_nearest_even(kernels):
    """S values exactly halfway between two bf16 numbers (and NaN) go through the packer: ties
    round to even, as cvt.rn.bf16x2.f32 does; truncation or ties-away would change O."""
    q = np.zeros((64, KQ), BF16)
    kt = np.zeros((NS, KQ), BF16)
    # S(m, n) = (1 + (n % 4) / 128) + (1 + m % 3) / 256: in [1, 2) bf16 steps by 1/128, so m % 3 = 0
    # and 2 are ties (half of them round up to the even neighbour, half down), m % 3 = 1 is exact.
    q[:, 0], kt[:, 1] = 1.0, 1.0
    kt[:, 0] = (1.0 + np.arange(NS) % 4 / 128).astype(BF16)
    q[:, 1] = ((1 + np.arange(64) % 3) / 256).astype(BF16)
    q[5, 2] = np.inf  # times K(n, 2) = 0: row 5 of S is NaN
    v = np.eye(NS, 256).astype(BF16)  # O = P, padded
    s, o = _run_chain(kernels["rs_chain"], q, kt, v)
    want = s.astype(BF16).astype(np.float32)  # ml_dtypes: round to nearest even
    assert np.isnan(o[5]).all() and np.isnan(want[5]).all()
    np.testing.assert_array_equal(o[:, :NS], want)
    truncated = (s.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    rounded_up = (want != truncated) & ~np.isnan(want)
    assert rounded_up.any() and (~rounded_up & (want != s) & ~np.isnan(want)).any(), \
        "the ties do not tell RNE from truncation and from ties-away"


def test_register_a_reads_the_isa_fragment_layout(rng, kernels):
    """A fragments written per the PTX ISA formula in the kernel; also one-hot A elements, so
    each (row, k) lands at D(row, n) only: a lane/register/half mapped wrong moves it."""
    def run(a, v):
        d = np.full((64, 24), np.nan, np.float32)
        kernels["rs_direct"]([a.view(np.uint16), v.view(np.uint16), d], [], [1])
        return d

    a, v = _bf16(rng, (64, NS)), _bf16(rng, (NS, 24))
    np.testing.assert_allclose(run(a, v), a.astype(np.float64) @ v.astype(np.float64), rtol=1e-5, atol=1e-5)
    for m, k in [(0, 0), (9, 1), (17, 8), (42, 15), (63, 63), (31, 50)]:
        a1 = np.zeros((64, NS), BF16)
        a1[m, k] = 2.0
        want = np.zeros((64, 24), np.float32)
        want[m] = 2.0 * v[k].astype(np.float32)
        np.testing.assert_array_equal(run(a1, v), want)


@pytest.mark.parametrize("name", PLANTED)
def test_planted_kernel_bug_is_caught(rng, kernels, name):
    q, kt, v = _chain_operands(rng, CHAIN_NV[name])
    s, o = _run_chain(kernels[name], q, kt, v)
    np.testing.assert_allclose(s, _chain_reference(q, kt, v)[0], rtol=1e-5, atol=1e-5)  # the bug is in P*V
    assert not np.allclose(o, _chain_reference(q, kt, v, s)[1], rtol=1e-2, atol=1e-2)


# emulator bug -> (old, new) replacements in kf/emu/wgmma.h (each must apply); the clean rs_chain must fail
EMULATOR_BUGS = {
    # the A fragment read through a pointer at the wait, not copied at issue
    "a_read_at_wait": (
        ("  uint32_t a_regs[4];\n};", "  uint32_t a_regs[4];\n  const uint32_t* a_src;\n};"),
        ("std::memcpy(op.a_regs, a, sizeof op.a_regs);", "op.a_src = a;"),
        ("op.a_regs[", "op.a_src["),  # the lanes post what the pointer holds at the wait
    ),
    # the four registers taken as K-ordered (reg = 2*rr + k/8), not the ISA's rows-first order
    "a_registers_misordered": (
        ("reg = rr + 2 * (k / 8)", "reg = 2 * rr + k / 8"),
    ),
}


@pytest.fixture(scope="module")
def emulator_include(tmp_path_factory):
    root = tmp_path_factory.mktemp("emu_include_wgmma_rs")
    shutil.copytree(emu_backend.TEMPLATES / "include", root / "include")
    return root / "include"


@pytest.mark.parametrize("bug", sorted(EMULATOR_BUGS))
def test_planted_emulator_bug_is_caught(rng, emulator_include, monkeypatch, bug):
    clean = (emu_backend.TEMPLATES / "include" / "kf" / "emu" / "wgmma.h").read_text()
    mutated = clean
    for old, new in EMULATOR_BUGS[bug]:
        assert old in mutated, f"planting {bug}: {old!r} is not in kf/emu/wgmma.h"
        mutated = mutated.replace(old, new)
    (emulator_include / "kf" / "emu" / "wgmma.h").write_text(mutated)
    monkeypatch.setattr(emu_backend, "INCLUDE_DIRS", (emu_backend.INCLUDE_DIRS[0], str(emulator_include)))
    kern = _module(f"emu_wgmma_rs_bug_{bug}", ["rs_chain"])["rs_chain"]
    q, kt, v = _chain_operands(rng, 256)
    s, o = _run_chain(kern, q, kt, v)
    assert not np.allclose(o, _chain_reference(q, kt, v, s)[1], rtol=1e-2, atol=1e-2)
