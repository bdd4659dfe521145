#!/usr/bin/env python3
"""Regenerate ``kf/wgmma.cuh``, the sm_90a warpgroup-MMA device header.

The header's bulk is one ``Wgmma_<type>_<N>`` struct per accumulator width N
(8, 16, ..., 256) and operand type (bf16, f16 at k16; e4m3 at k32; bf16 with A from registers,
``Wgmma_bf16_rs_<N>``): the PTX operand list of
``wgmma.mma_async ... m64nNk16`` names N/2 float registers, so every N needs its
own ``asm`` statement.  The hand-written parts (the descriptor layout notes,
``make_smem_desc``, fence/commit/wait, the dispatch functions) are kept verbatim
below as PROLOGUE / EPILOGUE; the per-N structs and the N -> struct
specialisations are generated.

    python tools/gen_wgmma.py                 # rewrite the shipped header
    python tools/gen_wgmma.py --output X.cuh  # write elsewhere
    python tools/gen_wgmma.py --check         # exit 1 if the shipped header differs

Edit this script, not the header; the output is byte-identical to the shipped
header (``tests/codegen/test_generated_headers.py`` checks that).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

DEFAULT_OUTPUT = Path(__file__).resolve().parents[1] / "kernforge/backends/cuda/templates/include/kf/wgmma.cuh"

#: accumulator widths of wgmma's m64nNk16 shape for 16-bit operands: multiples of 8 up to 256
WIDTHS = tuple(range(8, 257, 8))
#: (struct infix, dispatch template, PTX operand type)
TYPES = (("bf16", "WgmmaBf16", "bf16"), ("f16", "WgmmaF16", "f16"))

PROLOGUE = r"""// Warpgroup tensor-core primitives (sm_90a only): wgmma with shared-memory
// operands described by 64-bit matrix descriptors.
//
// A warpgroup is 4 consecutive warps whose first warp index is a multiple of 4;
// every wgmma_* call below is executed by all 128 threads of the warpgroup.
//
// make_smem_desc(ptr, lbo_bytes, sbo_bytes, layout = 0): descriptor of a canonical layout.
//   Bits 0-13: (shared address of ptr) >> 4; 16-29: LBO >> 4; 32-45: SBO >> 4; 49-51 base
//   offset 0; 62-63 layout type: 0 no swizzle ("interleave", below), 1 128-byte swizzle.
//   128-byte swizzle (kernforge/backends/cuda/smem_layouts.py): rows of 128 bytes whose
//   16-byte pieces are stored at piece index ^ (row % 8), i.e. shared address bits [4:6] ^= [7:9];
//   every 8-row, 1024-byte atom starts on a 1024-byte boundary (base offset 0).  ptr is the
//   *unswizzled* address of the instruction's first element (a K step inside a row adds
//   its byte offset to ptr).  K-major: 8 rows 128 bytes apart, SBO = 1024 (next 8 rows), LBO
//   unused.  MN-major: 128-byte rows along M/N, 8 K-rows 128 bytes apart, SBO = 1024 (next
//   8 K-rows), LBO = byte distance to the next 128 bytes of M/N (the next column chunk).
//   kernforge stores every gemm operand tile in "core-matrix" order: a tile of
//   R x C 16-bit elements (R, C multiples of 8) is cut into 8x8 core matrices;
//   element (r, c) sits at element offset ((r/8) * (C/8) + c/8) * 64 + (r%8) * 8 + c%8
//   (each core matrix is 128 contiguous bytes, its rows 16 bytes apart).
//   LBO = byte distance between core matrices adjacent along K,
//   SBO = byte distance between core matrices adjacent along M (for A) or N (for B).
//   K-major operand (A as M x K, B as N x K): LBO = 128, SBO = (K/8) * 128.
//   MN-major operand (A as K x M, B as K x N; transposed flag 1): core matrix rows run along K,
//   LBO = (MN/8) * 128 (next 8 K-rows), SBO = 128 (next 8 M/N columns).
//
// wgmma_m64nNk16_f32_{bf16,f16}<N, TRANS_A, TRANS_B>(d, desc_a, desc_b, scale_d):
//   `wgmma.mma_async.sync.aligned.m64nNk16.f32.T.T d, desc_a, desc_b, p, 1, 1, TRANS_A, TRANS_B;`
//   with p = (scale_d != 0): D(64xN) = A(64x16) * B(16xN) + (p ? D : 0).
//   A is 64 rows x 16 K from desc_a (K-major unless TRANS_A), B is 16 K x N from desc_b
//   (K-major, i.e. stored N x K, unless TRANS_B, stored K x N).
//   d has N/2 floats per thread.  With w = warp index within the warpgroup,
//   g = lane/4, t = lane%4: d[4*j + q] holds D(16*w + g + 8*(q/2), 8*j + 2*t + q%2)
//   (the mma.sync m16n8 accumulator layout of kf/mma.cuh repeated along N).
//   Asynchronous: d may be read or written only after wgmma_wait<0>() (or an N covering it).
// wgmma_m64nNk32_f32_e4m3<N>(d, desc_a, desc_b, scale_d): native fp8 (sm_90a `QGMMA`),
//   `wgmma.mma_async.sync.aligned.m64nNk32.f32.e4m3.e4m3 d, desc_a, desc_b, p, 1, 1;`:
//   D(64xN) = A(64x32) * B(32xN) + (p ? D : 0), products and sums in fp32 (the DeepGEMM recipe
//   promotes D into a float32 total after each 128-K block).  8-bit operands are K-major only
//   (PTX has no transpose for them): A stored M x K, B stored N x K.  Their core matrices are
//   8 rows of 16 bytes = 8 x 16 elements: element (r, c) of an R x C tile at byte offset
//   ((r/8) * (C/16) + c/16) * 128 + (r%8) * 16 + c%16; LBO = 128 (next 16 K), SBO = (C/16) * 128.
//   d: the same accumulator layout as the 16-bit shapes.
// wgmma_m64nNk16_f32_bf16_rs<N, TRANS_B>(d, a, desc_b, scale_d): A from registers (the "RS" form,
//   FlashAttention-3's P*V), `wgmma.mma_async.sync.aligned.m64nNk16.f32.bf16.bf16 d, {a0, a1, a2, a3},
//   desc_b, p, 1, 1, TRANS_B;` (no transpose immediate for A: registers have no major-ness).
//   D(64xN) = A(64x16) * B(16xN) + (p ? D : 0), B from desc_b as above.  a: 4 registers of two bf16
//   each (PTX ISA "wgmma .m64nNk16 register fragment layout for matrix A"; the mma.sync m16n8k16 A
//   layout, warp w of the warpgroup holding rows 16w..16w+15): a[r] packs A(16*w + g + 8*(r%2),
//   2*t + 8*(r/2) + h), element h = 0 in the low 16 bits, h = 1 in the high 16 bits.  Like d, a is
//   read asynchronously: the wgmma uses the values at issue, and ptxas keeps those registers until
//   the covering wait; a register written between wgmma_fence and the wgmmas reading it makes ptxas
//   inject a warpgroup.arrive (advisory C7519), so build every fragment before the fence.
// wgmma_accum_to_a_bf16(s, a): s, the N/2-float accumulator of an m64nN wgmma, rounded (RNE) to bf16 and
//   packed as the A fragments of the N/16 k16 steps over its columns: a[kk][r] = {s[8*kk + 2*r] low,
//   s[8*kk + 2*r + 1] high}.  No data moves between threads: by the layout of d above, s[8*kk + 2*r + h]
//   holds D(16*w + g + 8*(r%2), 16*kk + 8*(r/2) + 2*t + h), exactly the element a[kk][r] half h
//   holds for A columns 16*kk .. 16*kk + 15.  So S = Q*K^T from one wgmma feeds P*V's A operand.
// wgmma_fence(): `wgmma.fence.sync.aligned;` orders prior register/shared accesses before the next wgmma.
// wgmma_commit(): `wgmma.commit_group.sync.aligned;` closes the current group of wgmma ops.
// wgmma_wait<N>(): `wgmma.wait_group.sync.aligned N;` waits until at most N groups are pending.
// wgmma_fence_operand(d): an empty asm that reads and writes every accumulator register.  The
//   fences above clobber only memory, so the compiler may move plain arithmetic on d (a softmax
//   rescale of the output accumulator) past wgmma_fence, next to the wgmma; ptxas then injects a
//   warpgroup.arrive there (advisory C7519).  Called on d before wgmma_fence and after the
//   wait, it pins those register accesses outside the asynchronous region.
// fence_proxy_async() (kf/fence.cuh): `fence.proxy.async.shared::cta;` makes this thread's earlier generic-proxy
//   shared-memory writes (plain stores, cp.async) visible to the async proxy (wgmma operand reads);
//   call it in every writing thread before the __syncthreads() that precedes the wgmma.
#pragma once
#include "kf/common.cuh"
#include "kf/fence.cuh"

#ifndef KF_HOST_EMULATION
namespace kf {

KF_DEVICE uint64_t make_smem_desc(const void* ptr, uint32_t lbo_bytes, uint32_t sbo_bytes, uint32_t layout = 0) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
  uint64_t desc = 0;
  desc |= static_cast<uint64_t>((addr >> 4) & 0x3FFF);
  desc |= static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFF) << 16;
  desc |= static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFF) << 32;
  desc |= static_cast<uint64_t>(layout & 3) << 62;
  return desc;
}

KF_DEVICE void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
KF_DEVICE void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> KF_DEVICE void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
template <int R> KF_DEVICE void wgmma_fence_operand(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

template <int N, int TRANS_A, int TRANS_B>
KF_DEVICE void wgmma_m64nNk16_f32_bf16(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int scale_d);
template <int N, int TRANS_A, int TRANS_B>
KF_DEVICE void wgmma_m64nNk16_f32_f16(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int scale_d);
template <int N>
KF_DEVICE void wgmma_m64nNk32_f32_e4m3(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int scale_d);
template <int N, int TRANS_B>
KF_DEVICE void wgmma_m64nNk16_f32_bf16_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b, int scale_d);

// One definition per N (the PTX operand list has N/2 registers); all multiples of 8 up to 256.
"""

EPILOGUE = r"""
template <int N, int TRANS_A, int TRANS_B>
KF_DEVICE void wgmma_m64nNk16_f32_bf16(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  WgmmaBf16<N, TRANS_A, TRANS_B>::run(d, desc_a, desc_b, scale_d);
}
template <int N, int TRANS_A, int TRANS_B>
KF_DEVICE void wgmma_m64nNk16_f32_f16(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  WgmmaF16<N, TRANS_A, TRANS_B>::run(d, desc_a, desc_b, scale_d);
}
template <int N>
KF_DEVICE void wgmma_m64nNk32_f32_e4m3(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  WgmmaE4m3<N>::run(d, desc_a, desc_b, scale_d);
}
template <int N, int TRANS_B>
KF_DEVICE void wgmma_m64nNk16_f32_bf16_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {
  WgmmaBf16Rs<N, TRANS_B>::run(d, a, desc_b, scale_d);
}

}  // namespace kf
#else
#include "kf/emu/wgmma.h"
#endif

// Plain C++ (one cvt.rn.bf16x2.f32 per register on the GPU), shared with host emulation.
namespace kf {
template <int R>
KF_DEVICE void wgmma_accum_to_a_bf16(const float (&s)[R], uint32_t (&a)[R / 8][4]) {
  static_assert(R % 8 == 0, "wgmma_accum_to_a_bf16: the accumulator of an m64nN wgmma with N a multiple of 16");
#pragma unroll
  for (int i = 0; i < R / 2; ++i) {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(s[2 * i], s[2 * i + 1]);  // .x: low half
    memcpy(&a[i / 4][i % 4], &pair, 4);
  }
}
}  // namespace kf
"""

# One struct; {{ }} are literal braces, \\n is the two characters backslash-n of the C string.
STRUCT = r"""template <int TA, int TB> struct Wgmma_{infix}_{n} {{
  static KF_DEVICE void run(float (&d)[{regs}], uint64_t a, uint64_t b, int scale_d) {{
    asm volatile(
        "{{\n.reg .pred p;\nsetp.ne.b32 p, %{scale}, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ptx}.{ptx} {{{acc}}}, %{a}, %{b}, p, 1, 1, %{ta}, %{tb};\n}}\n"
        : {outputs}
        : "l"(a), "l"(b), "r"(scale_d), "n"(TA), "n"(TB));
  }}
}};
"""

# A from registers (bf16): the four A registers, then desc_b, scale_d, TRANS_B (no TRANS_A).
STRUCT_RS = r"""template <int TB> struct Wgmma_bf16_rs_{n} {{
  static KF_DEVICE void run(float (&d)[{regs}], const uint32_t (&a)[4], uint64_t b, int scale_d) {{
    asm volatile(
        "{{\n.reg .pred p;\nsetp.ne.b32 p, %{scale}, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16 {{{acc}}}, {{{areg}}}, %{b}, p, 1, 1, %{tb};\n}}\n"
        : {outputs}
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d), "n"(TB));
  }}
}};
"""

# The fp8 shape: K = 32, no transpose immediates (8-bit operands are K-major only).
STRUCT_FP8 = r"""struct Wgmma_e4m3_{n} {{
  static KF_DEVICE void run(float (&d)[{regs}], uint64_t a, uint64_t b, int scale_d) {{
    asm volatile(
        "{{\n.reg .pred p;\nsetp.ne.b32 p, %{scale}, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n{n}k32.f32.e4m3.e4m3 {{{acc}}}, %{a}, %{b}, p, 1, 1;\n}}\n"
        : {outputs}
        : "l"(a), "l"(b), "r"(scale_d));
  }}
}};
"""


def struct_fp8(n: int) -> str:
    """``Wgmma_e4m3_<n>``: one fp8 ``wgmma.mma_async ... m64nNk32`` (operands as in :func:`struct`,
    without TRANS_A / TRANS_B)."""
    regs = n // 2
    a, b, scale = range(regs, regs + 3)
    return STRUCT_FP8.format(n=n, regs=regs, scale=scale, a=a, b=b, acc=", ".join(f"%{i}" for i in range(regs)),
                             outputs=", ".join(f'"+f"(d[{i}])' for i in range(regs)))


def struct_rs(n: int) -> str:
    """``Wgmma_bf16_rs_<n>``: one bf16 ``wgmma.mma_async ... m64nNk16`` with A in registers: the n/2
    accumulator registers, A's four registers, desc_b, scale_d (predicate p) and TRANS_B."""
    regs = n // 2
    b, scale, tb = range(regs + 4, regs + 7)
    return STRUCT_RS.format(n=n, regs=regs, scale=scale, b=b, tb=tb,
                            acc=", ".join(f"%{i}" for i in range(regs)),
                            areg=", ".join(f"%{i}" for i in range(regs, regs + 4)),
                            outputs=", ".join(f'"+f"(d[{i}])' for i in range(regs)))


def struct(infix: str, ptx: str, n: int) -> str:
    """``Wgmma_<infix>_<n>``: one ``wgmma.mma_async`` whose operands are the n/2 accumulator
    registers (%0 .. %(n/2 - 1)), then desc_a, desc_b, scale_d (turned into predicate p),
    TRANS_A and TRANS_B."""
    regs = n // 2
    a, b, scale, ta, tb = range(regs, regs + 5)
    return STRUCT.format(infix=infix, n=n, regs=regs, ptx=ptx, scale=scale, a=a, b=b, ta=ta, tb=tb,
                         acc=", ".join(f"%{i}" for i in range(regs)),
                         outputs=", ".join(f'"+f"(d[{i}])' for i in range(regs)))


def render() -> str:
    """The whole header."""
    out = [PROLOGUE]
    out += [struct(infix, ptx, n) for infix, _, ptx in TYPES for n in WIDTHS]
    out += [struct_fp8(n) for n in WIDTHS]
    out.append("\n")
    out += [f"template <int N, int TA, int TB> struct {dispatch};\n" for _, dispatch, _ in TYPES]
    out += [f"template <int TA, int TB> struct {dispatch}<{n}, TA, TB> : Wgmma_{infix}_{n}<TA, TB> {{}};\n"
            for infix, dispatch, _ in TYPES for n in WIDTHS]
    out.append("template <int N> struct WgmmaE4m3;\n")
    out += [f"template <> struct WgmmaE4m3<{n}> : Wgmma_e4m3_{n} {{}};\n" for n in WIDTHS]
    out += [struct_rs(n) for n in WIDTHS]
    out.append("template <int N, int TB> struct WgmmaBf16Rs;\n")
    out += [f"template <int TB> struct WgmmaBf16Rs<{n}, TB> : Wgmma_bf16_rs_{n}<TB> {{}};\n" for n in WIDTHS]
    out.append(EPILOGUE)
    return "".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Regenerate kf/wgmma.cuh.")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT,
                        help=f"where to write the header (default: {DEFAULT_OUTPUT})")
    parser.add_argument("--check", action="store_true",
                        help="compare with --output instead of writing it; exit 1 if they differ")
    args = parser.parse_args(argv)
    text = render().encode()
    if args.check:
        if not (args.output.is_file() and args.output.read_bytes() == text):
            print(f"{args.output} is not what tools/gen_wgmma.py generates", file=sys.stderr)
            return 1
        return 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_bytes(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
