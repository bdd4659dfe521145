"""The kernforge tile language, spelled as TileLang spells it: ``import kernforge.dsl as T``.

Every call records one typed IR node; nothing here knows about targets or text.
``docs/tutorial.md`` teaches the language; ``docs/dsl.md`` is the reference of every name
below, generated from these docstrings (``tools/gen_dsl_reference.py``).
"""
from kernforge.codegen.ir import KernelError
from kernforge.dsl.alloc import alloc_fragment, alloc_local, alloc_shared, alloc_var
from kernforge.dsl.atomic import atomic_add, atomic_max
from kernforge.dsl.copy import clear, copy, fill
from kernforge.dsl.eager import JITError, JITFunction, Launch, const, empty, jit
from kernforge.dsl.gemm import gemm
from kernforge.dsl.hints import GemmWarpPolicy, HintError, UnknownHintError
from kernforge.dsl.kernel import Kernel, persistent
from kernforge.dsl.loop import Parallel, Pipelined, serial, unroll
from kernforge.dsl.math import (abs, cast, ceil, ceildiv, exp, exp2, floor, if_then_else, infinity,
                                isnan, log, log2, max, max_value, min, min_value, pow, reinterpret,
                                rcp, rsqrt, sqrt, tanh, where)
from kernforge.dsl.prim_func import KernelFactory, PrimFunc, macro, prim_func, tunable
from kernforge.dsl.radix import radix_find_bucket
from kernforge.dsl.reduce import cumsum, reduce_max, reduce_min, reduce_sum
from kernforge.dsl.softmax import online_softmax
from kernforge.dsl.types import Buffer, DTypeError, StridedTensor, Tensor, dynamic, symbolic
from kernforge.dtypes import (bfloat16, bool_, float8_e4m3, float16, float32, float64, int8, int16,
                              int32, int64, uint8, uint16, uint32, uint64)

__all__ = [
    "Buffer", "DTypeError", "GemmWarpPolicy", "HintError", "JITError", "JITFunction", "Kernel", "KernelError", "KernelFactory", "Parallel", "Pipelined", "PrimFunc", "StridedTensor",
    "Tensor", "abs", "alloc_fragment", "alloc_local", "alloc_shared", "alloc_var", "atomic_add",
    "atomic_max", "bfloat16", "bool_", "cast", "ceil", "ceildiv", "clear", "const", "copy", "cumsum",
    "dynamic", "empty", "exp", "exp2", "fill", "float16", "float32", "float64", "float8_e4m3", "floor",
    "gemm", "if_then_else", "infinity", "int16", "int32", "int64", "int8", "isnan", "jit", "Launch", "log", "log2",
    "macro", "max", "max_value", "min", "min_value", "online_softmax", "persistent", "pow", "prim_func",
    "radix_find_bucket", "reduce_max", "reduce_min", "reduce_sum", "rcp", "reinterpret", "rsqrt", "serial", "sqrt", "symbolic", "tanh", "tunable",
    "uint16", "uint32", "uint64", "uint8", "UnknownHintError", "unroll", "where",
]
