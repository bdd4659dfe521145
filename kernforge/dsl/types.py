"""Parameter annotations: ``T.Tensor((M, K), "bfloat16")``, strided tensors,
symbolic dimensions and scalar parameter types."""
from __future__ import annotations

from dataclasses import dataclass

from kernforge import dtypes
from kernforge.codegen import ir


class DTypeError(ir.KernelError, TypeError):
    """A dtype the DSL does not know (``"flaot32"``), reported at the author's line with the
    closest known spelling.  A ``TypeError`` as well, as :func:`kernforge.dtypes.dtype`
    raises outside the DSL."""


def dtype_arg(x, what: str, loc=None) -> dtypes.DType:
    """``x`` as a DType, or a :class:`DTypeError` naming ``what`` took it and where.

    Every DSL entry point that takes a dtype goes through here, so that a typo is
    reported at the line that made it rather than deep in the tracer without a line."""
    if getattr(x, "__kf_unsupported__", False):
        x()  # a TileLang name kernforge lacks (T.float4_e2m1fn): its UnsupportedError names it
    try:
        return dtypes.dtype(x)
    except TypeError as e:
        raise DTypeError(f"{what}: {e}", loc or ir.caller_loc()) from None


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
    """``A: T.Tensor((M, K), "bfloat16")``: a contiguous (row-major) global tensor parameter.

    ``shape`` holds ints, ``T.symbolic`` sizes (bound from the argument at each call) or
    integer expressions of them; ``dtype`` is a dtype or its name (``"float32"``,
    ``"bfloat16"``, ``T.int32``, ...).  A call's argument must match it exactly: the compiled
    kernel checks dtype, rank, shape and contiguity before launching."""
    shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    return TensorType(shape, dtype_arg(dtype, "T.Tensor"))


Buffer = Tensor  # TileLang's older spelling


def StridedTensor(shape, strides, dtype="float32") -> TensorType:  # noqa: N802
    """A global tensor parameter with explicit (possibly symbolic) element strides, for views
    such as a slice of a larger cache: ``T.StridedTensor((B, N), (row_stride, 1), dtype)``.
    A plain ``T.Tensor`` requires contiguous arguments; this accepts any tensor whose
    strides match (symbolic strides are bound at the call, like symbolic sizes)."""
    shape = tuple(shape)
    strides = tuple(strides)
    if len(strides) != len(shape):
        raise ir.KernelError(f"StridedTensor: {len(shape)} dims but {len(strides)} strides")
    return TensorType(shape, dtype_arg(dtype, "T.StridedTensor"), strides)


def symbolic(name: str, dtype="int32") -> ir.Var:
    """``M = T.symbolic("M")``: a size known only at launch, used in ``T.Tensor`` shapes and
    bound from the actual tensor's shape at every call (one compiled kernel serves every
    ``M``).  Each use must agree: two tensors declared ``(M, K)`` and ``(M,)`` with different
    first dimensions are a ``ShapeError`` at the call."""
    return ir.Var(name, dtype_arg(dtype, "T.symbolic"))


dynamic = symbolic  # TileLang's other spelling
