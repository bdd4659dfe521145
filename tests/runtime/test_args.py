"""Argument conversion: every accepted value converts exactly, every other one is refused."""

import ctypes

import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st

from kernforge.runtime.args import convert, pack_dims, pack_pointers
from kernforge.runtime.errors import LaunchError

RANGES = {"i32": (-(2**31), 2**31 - 1), "i64": (-(2**63), 2**63 - 1), "u32": (0, 2**32 - 1), "u64": (0, 2**64 - 1)}


@given(kind=st.sampled_from(sorted(RANGES)), value=st.integers(-(2**65), 2**65))
def test_integer_kinds_accept_exactly_their_range(kind, value):
    low, high = RANGES[kind]
    if low <= value <= high:
        (converted,) = convert((kind,), (value,), "cpu", "f")
        assert converted.value == value
    else:
        with pytest.raises(LaunchError, match=f"does not fit {kind}"):
            convert((kind,), (value,), "cpu", "f")


@given(values=st.lists(st.integers(-(2**63), 2**63 - 1), max_size=16))
def test_pack_dims_round_trips(values):
    packed = pack_dims(values)
    assert list(packed)[: len(values)] == values


def test_pointer_sources_agree_on_the_address():
    arr = np.arange(8, dtype=np.float32)
    tensor = torch.from_numpy(arr)
    raw = (ctypes.c_float * 8)()
    packed = pack_pointers([arr, tensor, arr.ctypes.data, raw, ctypes.c_void_p(arr.ctypes.data)])
    assert packed[0] == packed[1] == packed[2] == packed[4] == arr.ctypes.data
    assert packed[3] == ctypes.addressof(raw)


def test_device_mismatch_and_unknown_objects_are_refused():
    with pytest.raises(LaunchError, match="host memory"):
        convert(("ptr",), (np.zeros(2),), "cuda", "k")
    with pytest.raises(LaunchError, match="runs on cuda"):
        convert(("ptr",), (torch.zeros(2),), "cuda", "k")
    with pytest.raises(LaunchError, match="expected a pointer"):
        convert(("ptr",), ("0x1234",), "cpu", "k")
    with pytest.raises(LaunchError, match="expected float"):
        convert(("f32",), ("1.0",), "cpu", "k")
