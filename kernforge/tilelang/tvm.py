"""The small part of TVM's expression API that TileLang programs use (``tvm.tir.const``,
``tvm.tir.Cast``, ``tvm.tir.reinterpret`` ... in dequantisation kernels), on kernforge's IR.

``python -m kernforge.tilelang`` aliases ``tvm``, ``tvm.tir`` and ``tvm.tirx`` (and
``tilelang.tvm``) to this module for the script it runs; ``from tvm import tir`` then gives
:data:`tir`.  Anything else of TVM raises :class:`UnsupportedError`.
"""
from __future__ import annotations

import types

from kernforge.codegen import ir
from kernforge.dsl import math as _math
from kernforge.dsl.compat import Cast, UnsupportedError, reinterpret, unsupported  # noqa: F401
from kernforge.dsl.types import dtype_arg


def const(value, dtype="int32"):
    """``tir.const(value, dtype)``: a typed constant."""
    return ir.const(value, dtype_arg(dtype, "tvm.tir.const"))


def DataType(dtype):  # noqa: N802 - TVM's spelling
    """``tvm.DataType("float16")`` / ``tilelang.DataType``: kernforge's dtype, which has what
    TileLang programs read off it (``.bits``, and it is the string of its name)."""
    return dtype_arg(dtype, "tvm.DataType")


def _namespace(name: str) -> types.ModuleType:
    mod = types.ModuleType(name, f"kernforge's stand-in for {name} (kernforge.tilelang.tvm)")
    mod.const = const
    mod.Cast = Cast
    mod.reinterpret = reinterpret
    mod.if_then_else = _math.if_then_else
    mod.Select = lambda cond, a, b: _math.where(cond, a, b)
    mod.max = _math.max
    mod.min = _math.min
    mod.exp = _math.exp
    mod.exp2 = _math.exp2
    mod.log = _math.log
    mod.sqrt = _math.sqrt
    mod.floordiv = lambda a, b: ir.binary(ir.Op.FLOORDIV, a, b)
    mod.floormod = lambda a, b: ir.binary(ir.Op.MOD, a, b)
    mod.PrimExpr = ir.Expr
    mod.IntImm = lambda dtype, value: const(value, dtype)
    mod.FloatImm = lambda dtype, value: const(value, dtype)

    def missing(attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return unsupported(f"{name}.{attr}", "only TVM's expression helpers used by TileLang kernels "
                           "(const, Cast, reinterpret, if_then_else, Select, IntImm, FloatImm, min/max, "
                           "floordiv/floormod) exist on kernforge")
    mod.__getattr__ = missing
    return mod


tir = _namespace("tvm.tir")
tirx = _namespace("tvm.tirx")


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    return unsupported(f"tvm.{name}", "kernforge implements only tvm.tir/tvm.tirx expression helpers")
