"""Numpy evaluation of IR expressions, with kernforge's numeric semantics.

Values are numpy scalars (outside parallel loops) or arrays broadcast over a
``Parallel`` loop's iteration space.  Every node's result is materialised in the
node's dtype, so rounding happens exactly where the IR says it does: low
precision operands are widened to float32 before arithmetic, and ``Cast`` to
bfloat16/float16/fp8 rounds to nearest even through ml-dtypes.
"""
from __future__ import annotations

import numpy as np

from kernforge import dtypes
from kernforge.codegen import ir

_BINARY = {
    ir.Op.ADD: np.add, ir.Op.SUB: np.subtract, ir.Op.MUL: np.multiply, ir.Op.DIV: np.divide,
    ir.Op.MAX: np.maximum, ir.Op.MIN: np.minimum, ir.Op.POW: np.power,
    ir.Op.LT: np.less, ir.Op.LE: np.less_equal, ir.Op.GT: np.greater, ir.Op.GE: np.greater_equal,
    ir.Op.EQ: np.equal, ir.Op.NE: np.not_equal,
    ir.Op.XOR: np.bitwise_xor, ir.Op.SHL: np.left_shift, ir.Op.SHR: np.right_shift,
    ir.Op.AND: np.bitwise_and, ir.Op.OR: np.bitwise_or,
}
_UNARY = {
    ir.Op.EXP: np.exp, ir.Op.EXP2: np.exp2, ir.Op.LOG: np.log, ir.Op.LOG2: np.log2,
    ir.Op.SQRT: np.sqrt, ir.Op.RSQRT: lambda x: np.reciprocal(np.sqrt(x)), ir.Op.RCP: np.reciprocal, ir.Op.ABS: np.abs,
    ir.Op.FLOOR: np.floor, ir.Op.CEIL: np.ceil, ir.Op.TANH: np.tanh, ir.Op.NEG: np.negative,
}


def convert(x, dt: dtypes.DType):
    """Convert a value to ``dt`` with kernforge's cast semantics (those of C on the
    backends): narrow floats are reached through float32 and rounded to nearest
    even; floats become integers by truncation toward zero."""
    x = np.asarray(x)
    if x.dtype == dt.np_dtype:
        return x
    if dt.is_low_precision and x.dtype != np.float32:
        x = x.astype(np.float32)
    elif dt.is_int and x.dtype.kind not in "iub":
        x = np.trunc(x.astype(np.float64))
    with np.errstate(invalid="ignore", over="ignore"):
        return x.astype(dt.np_dtype)


class Evaluator:
    """Evaluates expressions in an environment of variable values and buffer storage."""

    def __init__(self, interp):
        self.interp = interp

    def __call__(self, e: ir.Expr, mask=None):
        if isinstance(e, ir.Const):
            return np.asarray(e.value, dtype=e.dtype.np_dtype)
        if isinstance(e, ir.Var):
            return self.interp.env[e]
        if isinstance(e, ir.Load):
            return self.interp.load(e, mask)
        if isinstance(e, ir.Cast):
            return convert(self(e.a, mask), e.dtype)
        if isinstance(e, ir.Bitcast):
            v = convert(self(e.a, mask), e.a.dtype)
            return np.ascontiguousarray(v).view(e.dtype.np_dtype).reshape(np.shape(v))
        if isinstance(e, ir.Select):
            c = self(e.cond, mask)
            return convert(np.where(c, convert(self(e.a, mask), e.dtype),
                                    convert(self(e.b, mask), e.dtype)), e.dtype)
        if isinstance(e, ir.Unary):
            return self.unary(e, mask)
        if isinstance(e, ir.Binary):
            return self.binary(e, mask)
        if isinstance(e, ir.Shuffle):
            return self.shuffle(e, mask)
        raise NotImplementedError(f"interp: {type(e).__name__}")

    def unary(self, e: ir.Unary, mask):
        a = self(e.a, mask)
        if e.op == ir.Op.ISNAN:
            return np.isnan(a.astype(np.float32)) if a.dtype.kind not in "f" else np.isnan(a)
        if e.op == ir.Op.NOT:
            return np.logical_not(a) if e.dtype.is_bool else np.invert(a)
        a = convert(a, e.dtype)
        with np.errstate(all="ignore"):
            return convert(_UNARY[e.op](a), e.dtype)

    def shuffle(self, e: ir.Shuffle, mask):
        """A warp shuffle: the thread map runs in lockstep here (one statement over every
        iteration at a time), so every thread's ``value`` exists and the source thread's is
        picked out directly, by PTX ``shfl.sync``'s lane rule (``passes.warps``)."""
        t = np.asarray(self.interp.env[e.thread]).astype(np.int64)
        if t.ndim != 1 or (mask is not None and not np.all(mask)):
            raise ir.KernelError("a warp shuffle must be reached by every thread of its thread region")
        v = np.broadcast_to(self(e.value, mask), t.shape)
        b = np.broadcast_to(np.asarray(self(e.arg, mask)).astype(np.int64), t.shape) & 31
        lane, w = t & 31, e.width
        base = lane & (32 - w) & 31
        j = {"xor": lane ^ b, "down": lane + b, "up": lane - b, "idx": base | (b & (w - 1))}[e.kind]
        ok = {"xor": j < base + w, "down": j < base + w, "up": j >= base, "idx": np.ones_like(j, bool)}[e.kind]
        src = t - lane + np.where(ok, j, lane)
        if src.max() >= len(t):
            raise ir.KernelError(f"warp shuffle reads thread {int(src.max())} of a block of {len(t)} threads")
        return v[src]

    def binary(self, e: ir.Binary, mask):
        if e.op in ir.COMPARISONS:
            operand = dtypes.promote(e.a.dtype, e.b.dtype)
        elif e.dtype.is_bool:
            operand = dtypes.bool_
        else:
            operand = e.dtype
        a = convert(self(e.a, mask), operand)
        b = convert(self(e.b, mask), operand)
        with np.errstate(all="ignore"):
            if e.op in (ir.Op.FLOORDIV, ir.Op.MOD):
                if operand.is_int:
                    if np.any(b == 0):
                        raise ir.KernelError(f"integer division by zero in {e}")
                    r = np.floor_divide(a, b) if e.op == ir.Op.FLOORDIV else np.mod(a, b)
                else:
                    r = np.floor(a / b) if e.op == ir.Op.FLOORDIV else np.mod(a, b)
            elif operand.is_bool and e.op in (ir.Op.AND, ir.Op.OR):
                r = (np.logical_and if e.op == ir.Op.AND else np.logical_or)(a, b)
            else:
                r = _BINARY[e.op](a, b)
        return convert(r, e.dtype)
