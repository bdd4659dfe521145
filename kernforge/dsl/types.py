"""Parameter annotations: ``T.Tensor((M, K), "bfloat16")``, strided tensors,
symbolic dimensions and scalar parameter types."""
from __future__ import annotations

from dataclasses import dataclass

from kernforge import dtypes
from kernforge.codegen import ir


@dataclass(frozen=True)
class TensorType:
    """The annotation of a global tensor parameter."""

    shape: tuple
    dtype: dtypes.DType
    strides: tuple = ()

    def make_buffer(self, name: str) -> ir.Buffer:
        shape = tuple(_dim(s, name) for s in self.shape)
        strides = tuple(_dim(s, name) for s in self.strides)
        return ir.Buffer(name, shape, self.dtype, ir.Scope.GLOBAL, strides)


def _dim(s, name):
    if isinstance(s, bool) or not isinstance(s, (int, ir.Expr)) or (
            isinstance(s, ir.Expr) and not s.dtype.is_int):
        raise ir.KernelError(f"parameter {name}: dimensions must be ints, T.symbolic vars or "
                             f"integer expressions of them, got {s!r}")
    if isinstance(s, int) and s < 0:
        raise ir.KernelError(f"parameter {name}: negative dimension {s}")
    return ir.const(s) if isinstance(s, int) else s


def Tensor(shape, dtype="float32") -> TensorType:  # noqa: N802 - TileLang spelling
    """A contiguous (row-major) global tensor of ``shape`` and ``dtype``."""
    shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    return TensorType(shape, dtypes.dtype(dtype))


Buffer = Tensor


def StridedTensor(shape, strides, dtype="float32") -> TensorType:  # noqa: N802
    """A global tensor with explicit (possibly symbolic) element strides."""
    shape = tuple(shape)
    strides = tuple(strides)
    if len(strides) != len(shape):
        raise ir.KernelError(f"StridedTensor: {len(shape)} dims but {len(strides)} strides")
    return TensorType(shape, dtypes.dtype(dtype), strides)


def symbolic(name: str, dtype="int32") -> ir.Var:
    """A dimension known only at launch, bound from the actual tensor's shape."""
    return ir.Var(name, dtypes.dtype(dtype))


dynamic = symbolic
