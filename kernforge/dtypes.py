"""The one dtype table of kernforge.

Every layer (DSL, IR, interpreter, renderers, runtime launch checks) names
element types through :class:`DType`, so there is exactly one place that knows
how ``"bfloat16"`` maps to numpy (ml-dtypes), torch and byte sizes.  Renderers
keep their own ``type_map`` from :class:`DType` to a C spelling.
"""
from __future__ import annotations

import difflib
from typing import Any

import ml_dtypes
import numpy as np


class DType(str):
    """An element type.  ``kind`` is ``"float"``, ``"int"``, ``"uint"`` or ``"bool"``.

    It is also the string of its name (``T.float16 == "float16"``), as TileLang's dtypes are:
    TileLang programs pass dtypes where a string goes (``getattr(torch, dtype)``, ``for c in
    dtype``, JSON keys).  Equality and hashing are the name's, so a dtype and its name are
    interchangeable as dict keys; an instance is immutable and pickles as its table entry."""

    def __new__(cls, name: str, itemsize: int, kind: str, np_dtype: Any, torch_name: str):
        self = super().__new__(cls, name)
        for k, v in (("name", name), ("itemsize", itemsize), ("kind", kind), ("np_dtype", np_dtype),
                     ("torch_name", torch_name)):
            object.__setattr__(self, k, v)
        return self

    def __init__(self, *args):  # the fields are set in __new__
        super().__init__()

    def __setattr__(self, key, value):
        raise AttributeError(f"dtype {self.name} is immutable")

    def __reduce__(self):
        return dtype, (self.name,)

    __hash__ = str.__hash__
    __eq__ = str.__eq__
    __ne__ = str.__ne__

    @property
    def bits(self) -> int:
        return self.itemsize * 8

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_int(self) -> bool:
        return self.kind in ("int", "uint")

    @property
    def is_bool(self) -> bool:
        return self.kind == "bool"

    @property
    def is_low_precision(self) -> bool:
        """Float types narrower than 32 bits: arithmetic on them happens in float32."""
        return self.is_float and self.itemsize < 4

    @property
    def torch(self):
        import torch

        return getattr(torch, self.torch_name)

    def __call__(self, value):
        """``T.float32(x)``: a cast (or a typed constant), as TileLang spells it."""
        from kernforge.codegen import ir

        return ir.cast(value, self)

    def __repr__(self) -> str:
        return self.name

    def __str__(self) -> str:
        return self.name


float32 = DType("float32", 4, "float", np.dtype(np.float32), "float32")
float64 = DType("float64", 8, "float", np.dtype(np.float64), "float64")
float16 = DType("float16", 2, "float", np.dtype(np.float16), "float16")
bfloat16 = DType("bfloat16", 2, "float", np.dtype(ml_dtypes.bfloat16), "bfloat16")
float8_e4m3 = DType("float8_e4m3", 1, "float", np.dtype(ml_dtypes.float8_e4m3fn), "float8_e4m3fn")
int8 = DType("int8", 1, "int", np.dtype(np.int8), "int8")
int16 = DType("int16", 2, "int", np.dtype(np.int16), "int16")
int32 = DType("int32", 4, "int", np.dtype(np.int32), "int32")
int64 = DType("int64", 8, "int", np.dtype(np.int64), "int64")
uint8 = DType("uint8", 1, "uint", np.dtype(np.uint8), "uint8")
uint16 = DType("uint16", 2, "uint", np.dtype(np.uint16), "uint16")
uint32 = DType("uint32", 4, "uint", np.dtype(np.uint32), "uint32")
uint64 = DType("uint64", 8, "uint", np.dtype(np.uint64), "uint64")
bool_ = DType("bool", 1, "bool", np.dtype(np.bool_), "bool")

ALL = (float32, float64, float16, bfloat16, float8_e4m3, int8, int16, int32, int64,
       uint8, uint16, uint32, uint64, bool_)
BY_NAME = {d.name: d for d in ALL}
_ALIASES = {
    "float": float32, "fp32": float32, "f32": float32, "double": float64,
    "half": float16, "fp16": float16, "bf16": bfloat16,
    "float8_e4m3fn": float8_e4m3, "e4m3": float8_e4m3, "fp8": float8_e4m3,
    "int": int32, "long": int64, "bool_": bool_,
}


def dtype(x) -> DType:
    """Normalise a dtype spelling (str, DType, numpy or torch dtype) to a :class:`DType`."""
    if isinstance(x, DType):
        return x
    if isinstance(x, str):
        d = BY_NAME.get(x) or _ALIASES.get(x)
        if d is None:
            close = difflib.get_close_matches(x, [*BY_NAME, *_ALIASES], n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise TypeError(f"unknown dtype {x!r}{hint}; known: {', '.join(BY_NAME)}")
        return d
    mod = type(x).__module__
    if mod.startswith("torch"):
        name = str(x).removeprefix("torch.")
        return dtype(name)
    try:
        npd = np.dtype(x)
    except TypeError:
        raise TypeError(f"cannot interpret {x!r} as a dtype") from None
    for d in ALL:
        if d.np_dtype == npd:
            return d
    raise TypeError(f"unsupported numpy dtype {npd}")


def promote(a: DType, b: DType) -> DType:
    """Result type of a binary arithmetic op.

    Low-precision floats compute in float32 (the rule every backend implements
    the same way: widen, compute, round only on store or explicit cast).
    """
    if a == b:
        return float32 if a.is_low_precision else a
    if a.is_float or b.is_float:
        if float64 in (a, b):
            return float64
        return float32
    if a.is_bool:
        return b
    if b.is_bool:
        return a
    if a.kind == b.kind:
        return a if a.itemsize >= b.itemsize else b
    # mixed signedness: the signed type one size wider (capped at int64), so that
    # every value of both operands is representable; C's "convert to unsigned" rule
    # is what silently wraps, and renderers emit explicit casts instead.
    width = max(a.itemsize, b.itemsize)
    return {1: int16, 2: int32, 4: int64, 8: int64}[width]


# ---------------------------------------------------------------- torch values


def is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


_TORCH_DTYPES: dict = {}


def torch_dtype(t_dtype) -> DType:
    """``dtype`` for a torch dtype, memoised (it runs for every argument of every call)."""
    d = _TORCH_DTYPES.get(t_dtype)
    if d is None:
        d = _TORCH_DTYPES[t_dtype] = dtype(t_dtype)
    return d


def to_numpy(t):
    """Zero-copy numpy view of a CPU torch tensor (bf16/fp8 through ml-dtypes)."""
    import torch

    dt = torch_dtype(t.dtype)
    if dt in (bfloat16, float16):
        return t.view(torch.int16).numpy().view(dt.np_dtype)
    if dt == float8_e4m3:
        return t.view(torch.uint8).numpy().view(dt.np_dtype)
    return t.numpy()
