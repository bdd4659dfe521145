"""fp8 gemm operands -> bf16 shadow tiles, so fp8 gemms run on the bf16 tensor-core path.

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

FP8 = (dtypes.float8_e4m3,)


def _whole(r: ir.Region) -> bool:
    return r.buffer.is_static and r.extents == r.buffer.static_shape() and \
        all(isinstance(s, ir.Const) and s.value == 0 for s in r.starts)


class _Widen(ir.Mutator):
    def __init__(self):
        self.shadow: dict[ir.Buffer, ir.Buffer] = {}

    def widen(self, r: ir.Region) -> ir.Region:
        b = r.buffer
        if b not in self.shadow:
            self.shadow[b] = ir.Buffer(b.name + "_bf16", b.shape, dtypes.bfloat16, ir.Scope.SHARED)
        return ir.whole(self.shadow[b])

    def visit_Gemm(self, g: ir.Gemm):
        ops = (g.a, g.b)
        if not all(r.buffer.dtype in FP8 and r.buffer.scope in (ir.Scope.SHARED, ir.Scope.FRAGMENT) and _whole(r)
                   for r in ops):
            return g
        a16, b16 = self.widen(g.a), self.widen(g.b)
        return ir.Seq((ir.Copy(g.a, a16, g.loc), ir.Copy(g.b, b16, g.loc), replace(g, a=a16, b=b16)), g.loc)


def cuda_fp8_operands(kernel: ir.Kernel) -> ir.Kernel:
    """Run fp8 x fp8 gemms on bf16 shadow tiles (exact; see module docstring)."""
    m = _Widen()
    body = m.visit(kernel.body)
    if not m.shadow:
        return kernel
    allocs = tuple(ir.Allocate(b) for b in m.shadow.values())
    top = body.body if isinstance(body, ir.Seq) else (body,)
    return kernel.with_body(ir.Seq(allocs + tuple(top), getattr(body, "loc", None)))
