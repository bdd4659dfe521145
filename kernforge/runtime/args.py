"""Argument kinds of a declared kernel signature and their checked conversion.

A signature is a tuple of kind names:

====== ====================== =================================================
kind   C type                 accepted Python values
====== ====================== =================================================
ptr    ``void*``              int (an address), ctypes pointer/array/c_void_p,
                              C-contiguous numpy array, contiguous torch tensor
                              (its data pointer; the device must match)
i32    ``int32_t``            int (range-checked), numpy integer
i64    ``int64_t``            int (range-checked), numpy integer
u32    ``uint32_t``           int (range-checked), numpy integer
u64    ``uint64_t``           int (range-checked), numpy integer
f32    ``float``              int or float, numpy floating
f64    ``double``             int or float, numpy floating
====== ====================== =================================================

``void`` is allowed only as a return kind.  Every value is checked before the
call, so a wrong argument raises :class:`LaunchError` instead of crashing.
"""

from __future__ import annotations

import ctypes
import numbers
import sys

from .errors import ConfigError, LaunchError

CTYPES = {
    "ptr": ctypes.c_void_p,
    "i32": ctypes.c_int32,
    "i64": ctypes.c_int64,
    "u32": ctypes.c_uint32,
    "u64": ctypes.c_uint64,
    "f32": ctypes.c_float,
    "f64": ctypes.c_double,
}
_INT_RANGES = {"i32": (-(1 << 31), (1 << 31) - 1), "i64": (-(1 << 63), (1 << 63) - 1),
               "u32": (0, (1 << 32) - 1), "u64": (0, (1 << 64) - 1)}


def check_signature(argtypes, restype) -> tuple[tuple[str, ...], str]:
    if isinstance(argtypes, str):
        raise ConfigError("argtypes must be a sequence of kinds, e.g. ('ptr', 'i64'), not a string")
    argtypes = tuple(argtypes)
    for kind in argtypes:
        if kind not in CTYPES:
            raise ConfigError(f"unknown argument kind {kind!r}; expected one of {sorted(CTYPES)}")
    if restype != "void" and restype not in CTYPES:
        raise ConfigError(f"unknown return kind {restype!r}; expected 'void' or one of {sorted(CTYPES)}")
    return argtypes, restype


def pointer_value(arg, index: int, device: str) -> int:
    """The address an argument stands for, after checking it is a usable buffer."""
    if isinstance(arg, bool):
        raise LaunchError(f"argument {index}: expected a pointer, got bool")
    if isinstance(arg, int):
        if not 0 <= arg < (1 << 64):
            raise LaunchError(f"argument {index}: address {arg} is out of range")
        return arg
    if isinstance(arg, ctypes.c_void_p):
        return arg.value or 0
    if isinstance(arg, (ctypes.Array, ctypes._Pointer)):
        return ctypes.cast(arg, ctypes.c_void_p).value or 0
    np = sys.modules.get("numpy")
    if np is not None and isinstance(arg, np.ndarray):
        if device != "cpu":
            raise LaunchError(f"argument {index}: a numpy array is host memory; this {device} kernel needs device memory")
        if not arg.flags.c_contiguous:
            raise LaunchError(f"argument {index}: numpy array is not C-contiguous (call numpy.ascontiguousarray)")
        return arg.ctypes.data
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(arg, torch.Tensor):
        if arg.device.type != device:
            raise LaunchError(f"argument {index}: tensor is on {arg.device}, this kernel runs on {device}")
        if not arg.is_contiguous():
            raise LaunchError(f"argument {index}: tensor is not contiguous (call .contiguous())")
        return arg.data_ptr()
    raise LaunchError(f"argument {index}: expected a pointer (int, ctypes, numpy array, torch tensor), got {type(arg).__name__}")


def scalar_value(arg, kind: str, index: int):
    if isinstance(arg, bool):
        raise LaunchError(f"argument {index}: expected {kind}, got bool")
    if kind in _INT_RANGES:
        if not isinstance(arg, numbers.Integral):
            raise LaunchError(f"argument {index}: expected integer {kind}, got {type(arg).__name__}")
        low, high = _INT_RANGES[kind]
        value = int(arg)
        if not low <= value <= high:
            raise LaunchError(f"argument {index}: {value} does not fit {kind}")
        return value
    if not isinstance(arg, numbers.Real):
        raise LaunchError(f"argument {index}: expected float {kind}, got {type(arg).__name__}")
    return float(arg)


def convert(argtypes: tuple[str, ...], args: tuple, device: str, name: str) -> list:
    """ctypes values for ``args``; raises LaunchError before any work."""
    if len(args) != len(argtypes):
        raise LaunchError(f"{name} takes {len(argtypes)} arguments {argtypes}, got {len(args)}")
    out = []
    for index, (kind, arg) in enumerate(zip(argtypes, args)):
        if kind == "ptr":
            out.append(ctypes.c_void_p(pointer_value(arg, index, device)))
        else:
            out.append(CTYPES[kind](scalar_value(arg, kind, index)))
    return out


def pack_pointers(values, device: str = "cpu") -> ctypes.Array:
    """A ``void*[]`` of checked pointers, e.g. the ``args`` of a CPU kernel."""
    values = list(values)
    return (ctypes.c_void_p * max(len(values), 1))(*[pointer_value(v, i, device) for i, v in enumerate(values)])


def pack_dims(values) -> ctypes.Array:
    """An ``int64_t[]`` of checked integers, e.g. the ``dims`` of a CPU kernel."""
    values = [scalar_value(v, "i64", i) for i, v in enumerate(values)]
    return (ctypes.c_int64 * max(len(values), 1))(*values)
