"""fp8 gemm operands -> bf16 shadow tiles, for the fp8 gemms no native fp8 instruction takes.

On sm_90a a gemm of K-major e4m3 shared tiles runs natively (fp8 ``wgmma`` m64nNk32, SASS
``QGMMA``, twice the bf16 rate, reading the TMA'd fp8 tiles in place;
``layout_plan.native_fp8_gemm``) and keeps its operands: :func:`cuda_fp8_operands_wgmma`.
sm_100a does the same with ``tcgen05.mma kind::f8f6f4`` (``UTCQMMA``; :func:`cuda_fp8_operands_tcgen05`).
Everywhere else (sm_80, mma.sync paths, transposed or fragment operands) the shadow below applies.

Every e4m3 value is exactly a bf16 value (3 mantissa bits into 7, exponent range
inside bf16's), and a bf16 x bf16 product is exact in float32, so converting the
operand tiles in shared memory before a bf16 ``wgmma``/``mma.sync`` gives the same
float32 accumulation as an fp8 tensor-core instruction would -- at the bf16 rate,
without fp8 PTX primitives (which host emulation would have to implement).

For each ``Gemm`` whose A and B are fp8 tiles (shared or fragment), the pass
allocates one bf16 tile per operand at the top of the kernel and replaces the gemm
with ``copy A -> A16; copy B -> B16; gemm A16 @ B16``.
"""
from __future__ import annotations

from dataclasses import replace

from kernforge import dtypes
from kernforge.codegen import ir
from kernforge.backends.cuda.layout_plan import native_fp8_gemm

FP8 = (dtypes.float8_e4m3,)


def _whole(r: ir.Region) -> bool:
    return r.buffer.is_static and r.extents == r.buffer.static_shape() and \
        all(isinstance(s, ir.Const) and s.value == 0 for s in r.starts)


class _Widen(ir.Mutator):
    def __init__(self, keep=lambda g: False):
        self.shadow: dict[ir.Buffer, ir.Buffer] = {}
        self.keep = keep  # gemms that stay fp8 (native instruction)

    def widen(self, r: ir.Region) -> ir.Region:
        b = r.buffer
        if b not in self.shadow:
            self.shadow[b] = ir.Buffer(b.name + "_bf16", b.shape, dtypes.bfloat16, ir.Scope.SHARED)
        return ir.whole(self.shadow[b])

    def visit_Gemm(self, g: ir.Gemm):
        ops = (g.a, g.b)
        if not all(r.buffer.dtype in FP8 and r.buffer.scope in (ir.Scope.SHARED, ir.Scope.FRAGMENT) and _whole(r)
                   for r in ops) or self.keep(g):
            return g
        a16, b16 = self.widen(g.a), self.widen(g.b)
        return ir.Seq((ir.Copy(g.a, a16, g.loc), ir.Copy(g.b, b16, g.loc), replace(g, a=a16, b=b16)), g.loc)


def cuda_fp8_operands(kernel: ir.Kernel) -> ir.Kernel:
    """Run fp8 x fp8 gemms on bf16 shadow tiles (exact; see module docstring)."""
    return _shadow(kernel, _Widen())


def cuda_fp8_operands_wgmma(kernel: ir.Kernel) -> ir.Kernel:
    """sm_90a: gemms ``native_fp8_gemm`` admits keep their fp8 tiles; the rest get shadows."""
    return _shadow(kernel, _Widen(keep=lambda g: native_fp8_gemm(g, kernel.threads)))


def cuda_fp8_operands_tcgen05(kernel: ir.Kernel) -> ir.Kernel:
    """sm_100a: gemms ``native_fp8_gemm(tcgen05=True)`` admits keep their fp8 tiles (``kind::f8f6f4``)."""
    return _shadow(kernel, _Widen(keep=lambda g: native_fp8_gemm(g, kernel.threads, tcgen05=True)))


def _shadow(kernel: ir.Kernel, m: _Widen) -> ir.Kernel:
    body = m.visit(kernel.body)
    if not m.shadow:
        return kernel
    allocs = tuple(ir.Allocate(b) for b in m.shadow.values())
    top = body.body if isinstance(body, ir.Seq) else (body,)
    return kernel.with_body(ir.Seq(allocs + tuple(top), getattr(body, "loc", None)))
