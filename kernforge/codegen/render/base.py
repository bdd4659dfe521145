"""The renderer base: tables plus one expression printer shared by the C-like backends.

A backend renderer (CPU C++, CUDA C++, Ascend C) subclasses :class:`CRenderer`
and overrides *tables* -- ``type_map``, ``unary_table``, ``binary_table`` --
and its own ``render_kernel``.  Everything that is the same C expression on
every target lives here once, so the backends cannot drift apart on, e.g.,
floor division or bf16 rounding.

Semantics rendered here (they match the interpreter, see ``ir`` docstring):
* integer ``//`` and ``%`` are floor division/modulo, emitted as plain ``/``
  ``%`` only when both operands are provably non-negative;
* arithmetic on low-precision floats is done in float32 (``kf_to_float``),
  and a value is rounded (RNE) when cast or stored (``kf_from_float<T>``).
"""
from __future__ import annotations

import math
from typing import Callable

from kernforge import dtypes
from kernforge.codegen import arith, ir


class CRenderer:
    """Tables and the expression printer for C-family targets."""

    name = "c"
    type_map: dict[dtypes.DType, str] = {
        dtypes.float32: "float", dtypes.float64: "double", dtypes.float16: "kf_half",
        dtypes.bfloat16: "kf_bf16", dtypes.float8_e4m3: "kf_fp8e4m3", dtypes.int8: "int8_t",
        dtypes.int16: "int16_t", dtypes.int32: "int32_t", dtypes.int64: "int64_t",
        dtypes.uint8: "uint8_t", dtypes.uint16: "uint16_t", dtypes.uint32: "uint32_t",
        dtypes.uint64: "uint64_t", dtypes.bool_: "bool",
    }
    # float32 spellings; float64 variants drop the 'f' suffix via ``_libm``
    unary_table: dict[ir.Op, Callable[[str, ir.Unary], str]] = {
        ir.Op.NEG: lambda a, e: f"(-{a})",
        ir.Op.NOT: lambda a, e: f"(!{a})" if e.dtype.is_bool else f"(~{a})",
        ir.Op.EXP: lambda a, e: f"{_libm('exp', e)}({a})",
        ir.Op.EXP2: lambda a, e: f"{_libm('exp2', e)}({a})",
        ir.Op.LOG: lambda a, e: f"{_libm('log', e)}({a})",
        ir.Op.LOG2: lambda a, e: f"{_libm('log2', e)}({a})",
        ir.Op.SQRT: lambda a, e: f"{_libm('sqrt', e)}({a})",
        ir.Op.RSQRT: lambda a, e: f"(1.0f / {_libm('sqrt', e)}({a}))" if e.dtype == dtypes.float32
        else f"(1.0 / sqrt({a}))",
        ir.Op.ABS: lambda a, e: f"{_libm('fabs', e)}({a})" if e.dtype.is_float else f"kf_abs({a})",
        ir.Op.FLOOR: lambda a, e: f"{_libm('floor', e)}({a})",
        ir.Op.CEIL: lambda a, e: f"{_libm('ceil', e)}({a})",
        ir.Op.TANH: lambda a, e: f"{_libm('tanh', e)}({a})",
        ir.Op.ISNAN: lambda a, e: f"kf_isnan({a})",
    }
    binary_table: dict[ir.Op, Callable[[str, str, ir.Binary], str]] = {
        ir.Op.ADD: lambda a, b, e: f"({a} + {b})",
        ir.Op.SUB: lambda a, b, e: f"({a} - {b})",
        ir.Op.MUL: lambda a, b, e: f"({a} * {b})",
        ir.Op.DIV: lambda a, b, e: f"({a} / {b})",
        ir.Op.MAX: lambda a, b, e: f"kf_max({a}, {b})",
        ir.Op.MIN: lambda a, b, e: f"kf_min({a}, {b})",
        ir.Op.POW: lambda a, b, e: f"{_libm('pow', e)}({a}, {b})",
        ir.Op.LT: lambda a, b, e: f"({a} < {b})",
        ir.Op.LE: lambda a, b, e: f"({a} <= {b})",
        ir.Op.GT: lambda a, b, e: f"({a} > {b})",
        ir.Op.GE: lambda a, b, e: f"({a} >= {b})",
        ir.Op.EQ: lambda a, b, e: f"({a} == {b})",
        ir.Op.NE: lambda a, b, e: f"({a} != {b})",
        # bool & | stay bitwise: the IR evaluates both operands anyway (no short circuit),
        # and bitwise keeps serial loops branch-free
        ir.Op.AND: lambda a, b, e: f"(bool)({a} & {b})" if e.dtype.is_bool else f"({a} & {b})",
        ir.Op.OR: lambda a, b, e: f"(bool)({a} | {b})" if e.dtype.is_bool else f"({a} | {b})",
        ir.Op.XOR: lambda a, b, e: f"({a} != {b})" if e.dtype.is_bool else f"({a} ^ {b})",
        ir.Op.SHL: lambda a, b, e: f"({a} << {b})",
        ir.Op.SHR: lambda a, b, e: f"({a} >> {b})",
    }

    def __init__(self):
        self.nonneg_vars: set = set()

    # names --------------------------------------------------------------------
    def ctype(self, dt: dtypes.DType) -> str:
        return self.type_map[dt]

    def var_name(self, v: ir.Var) -> str:
        return v.name

    def buffer_name(self, b: ir.Buffer) -> str:
        return b.name

    # loads --------------------------------------------------------------------
    def offset(self, buf: ir.Buffer, indices) -> str:
        """Flat element offset of ``buf[indices]`` (64-bit for global buffers)."""
        terms = []
        wide = buf.scope == ir.Scope.GLOBAL
        for i, s in zip(indices, buf.strides):
            if isinstance(s, ir.Const) and s.value == 0:
                continue
            ie = self.expr(i)
            if wide and not isinstance(i, ir.Const):
                ie = f"(int64_t){ie}"
            if isinstance(s, ir.Const) and s.value == 1:
                terms.append(ie)
            else:
                terms.append(f"{ie} * {self.expr(s)}")
        return " + ".join(terms) or "0"

    def load(self, e: ir.Load) -> str:
        return f"{self.buffer_name(e.buffer)}[{self.offset(e.buffer, e.indices)}]"

    # expressions ---------------------------------------------------------------
    def literal(self, c: ir.Const) -> str:
        dt = c.dtype
        if dt.is_bool:
            return "true" if c.value else "false"
        if dt.is_int:
            v = int(c.value)
            if dt == dtypes.int32 and v == -2**31:
                return "(-2147483647 - 1)"
            if dt == dtypes.int32:
                return str(v)
            if dt == dtypes.int64 and v == -2**63:
                return "((int64_t)(-9223372036854775807LL - 1))"
            # spell the exact type: int64_t is `long` on LP64, and `3LL` (long long) would
            # not deduce the same template argument in helpers like kf_floordiv(a, b)
            return f"(({self.ctype(dt)}){v}{'ULL' if dt == dtypes.uint64 else 'LL' if dt.bits == 64 else ''})"
        v = float(c.value)
        if math.isnan(v):
            s = "kf_nan<float>()"
        elif math.isinf(v):
            s = "kf_inf<float>()" if v > 0 else "(-kf_inf<float>())"
        else:
            s = repr(v) + ("f" if dt != dtypes.float64 else "")
            if "e" not in s and "." not in s:
                s = s.replace("f", ".0f")
        if dt.is_low_precision:
            return f"kf_from_float<{self.ctype(dt)}>({s})"
        if dt == dtypes.float64 and "kf_" in s:
            s = s.replace("<float>", "<double>")
        return s

    def as_compute(self, e: ir.Expr) -> str:
        """``e`` in its compute type: low-precision floats widen to float."""
        s = self.expr(e)
        return f"kf_to_float({s})" if e.dtype.is_low_precision else s

    def expr(self, e: ir.Expr) -> str:
        if isinstance(e, ir.Const):
            return self.literal(e)
        if isinstance(e, ir.Var):
            return self.var_name(e)
        if isinstance(e, ir.Load):
            return self.load(e)
        if isinstance(e, ir.Cast):
            return self.cast(e.a, e.dtype)
        if isinstance(e, ir.Bitcast):
            # the operand is cast to its own type first: C promotes narrow integer
            # arithmetic (uint16 ^ uint16) to int, which has the wrong width
            return f"kf_bitcast<{self.ctype(e.dtype)}>(static_cast<{self.ctype(e.a.dtype)}>({self.expr(e.a)}))"
        if isinstance(e, ir.Select):
            return f"({self.expr(e.cond)} ? {self.cast_to(e.a, e.dtype)} : {self.cast_to(e.b, e.dtype)})"
        if isinstance(e, ir.Unary):
            return self.unary_table[e.op](self.cast_to(e.a, e.dtype) if e.op != ir.Op.ISNAN
                                          else self.as_compute(e.a), e)
        if isinstance(e, ir.Binary):
            return self.binary(e)
        raise NotImplementedError(f"{self.name} renderer: expression {type(e).__name__}")

    def binary(self, e: ir.Binary) -> str:
        operand_dt = e.dtype if e.op not in ir.COMPARISONS else dtypes.promote(e.a.dtype, e.b.dtype)
        if e.dtype.is_bool and e.op in ir.BITWISE:
            operand_dt = dtypes.bool_
        a, b = self.cast_to(e.a, operand_dt), self.cast_to(e.b, operand_dt)
        if e.op in (ir.Op.FLOORDIV, ir.Op.MOD):
            if operand_dt.is_int:
                if arith.nonnegative(e.a, self.nonneg_vars) and arith.nonnegative(e.b, self.nonneg_vars):
                    return f"({a} {'/' if e.op == ir.Op.FLOORDIV else '%'} {b})"
                return f"kf_{'floordiv' if e.op == ir.Op.FLOORDIV else 'floormod'}({a}, {b})"
            if e.op == ir.Op.FLOORDIV:
                return f"{_libm('floor', e)}({a} / {b})"
            return f"kf_fmod_floor({a}, {b})"
        return self.binary_table[e.op](a, b, e)

    def cast_to(self, e: ir.Expr, dt: dtypes.DType) -> str:
        """``e`` converted to compute type ``dt`` (no-op when already there)."""
        if e.dtype == dt:
            return self.expr(e)
        if dt.is_low_precision:
            return self.cast(e, dt)
        if e.dtype.is_low_precision:
            s = f"kf_to_float({self.expr(e)})"
            return s if dt == dtypes.float32 else f"(({self.ctype(dt)}){s})"
        if isinstance(e, ir.Const) and (dt.is_float or e.dtype.is_int):
            return self.literal(ir.const(e.value, dt))
        return f"(({self.ctype(dt)}){self.expr(e)})"

    def cast(self, e: ir.Expr, dt: dtypes.DType) -> str:
        """An explicit conversion with kernforge's semantics (RNE into low precision,
        truncation toward zero into integers)."""
        src = e.dtype
        if src == dt:
            return self.expr(e)
        if dt.is_low_precision:
            return f"kf_from_float<{self.ctype(dt)}>({self.as_compute(e) if src.is_float else f'(float){self.expr(e)}'})"
        if src.is_low_precision:
            return f"(({self.ctype(dt)})kf_to_float({self.expr(e)}))"
        return f"(({self.ctype(dt)}){self.expr(e)})"

    def store_value(self, value: ir.Expr, dt: dtypes.DType) -> str:
        """The C expression stored into a ``dt`` element (values arrive already typed)."""
        return self.expr(value) if value.dtype == dt else self.cast(value, dt)


def _libm(fn: str, e: ir.Expr) -> str:
    return fn if e.dtype == dtypes.float64 else fn + "f"

