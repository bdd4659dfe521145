"""The interpreter as an oracle: it must catch kernel bugs, not just run kernels."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import kernforge
import kernforge.dsl as T
from kernforge.codegen import ir


def test_out_of_bounds_read_is_reported_at_the_kernel_line():
    @T.prim_func
    def k(A: T.Tensor((8,), "float32"), B: T.Tensor((8,), "float32")):
        with T.Kernel(1) as bx:
            for i in T.Parallel(8):
                B[i] = A[i + 1]  # off by one
    with pytest.raises(ir.KernelError, match=r"out-of-bounds read A\[8\]") as e:
        kernforge.compile(k)(np.ones(8, np.float32), np.zeros(8, np.float32))
    assert e.value.loc.file == __file__


def test_negative_index_is_not_wrapped():
    @T.prim_func
    def k(A: T.Tensor((8,), "float32"), B: T.Tensor((8,), "float32")):
        with T.Kernel(1) as bx:
            for i in T.Parallel(8):
                B[i] = A[i - 1]
    with pytest.raises(ir.KernelError, match=r"out-of-bounds read A\[-1\]"):
        kernforge.compile(k)(np.ones(8, np.float32), np.zeros(8, np.float32))


def test_masked_lanes_never_touch_memory():
    @T.prim_func
    def k(A: T.Tensor((8,), "float32"), B: T.Tensor((8,), "float32")):
        with T.Kernel(1) as bx:
            for i in T.Parallel(16):
                if i < 8:
                    B[i] = A[i] * 2.0
    a = np.arange(1, 9, dtype=np.float32)
    b = np.full(8, np.nan, np.float32)
    kernforge.compile(k)(a, b)
    np.testing.assert_array_equal(b, a * 2)


def test_parallel_write_race_is_reported():
    @T.prim_func
    def k(A: T.Tensor((4, 4), "float32"), B: T.Tensor((4,), "float32")):
        with T.Kernel(1) as bx:
            for i, j in T.Parallel(4, 4):
                B[i] = A[i, j]  # 4 iterations write each B[i]
    with pytest.raises(ir.KernelError, match="race"):
        kernforge.compile(k)(np.ones((4, 4), np.float32), np.zeros(4, np.float32))


def test_uninitialised_fragment_reads_poison():
    @T.prim_func
    def k(B: T.Tensor((4,), "float32")):
        with T.Kernel(1) as bx:
            f = T.alloc_fragment((4,), "float32")
            f[0] = 1.0
            T.copy(f, B)
    b = np.zeros(4, np.float32)
    kernforge.compile(k)(b)
    assert b[0] == 1.0 and np.isnan(b[1:]).all()


def test_bf16_store_rounds_to_nearest_even():
    @T.prim_func
    def k(A: T.Tensor((5,), "float32"), B: T.Tensor((5,), "bfloat16")):
        with T.Kernel(1) as bx:
            for i in T.Parallel(5):
                B[i] = A[i] * 1.0
    # 1 + 2^-8 is a tie between 1 and 1 + 2^-7: RNE picks the even mantissa (1.0)
    a = np.array([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 3.0e38, 1e-40], np.float32)
    b = np.zeros(5, ml_dtypes.bfloat16)
    kernforge.compile(k)(a, b)
    np.testing.assert_array_equal(b.astype(np.float32), a.astype(ml_dtypes.bfloat16).astype(np.float32))
    assert b[0] == 1.0 and b[1] == 1 + 2**-6


def test_copy_out_of_bounds_reads_zero_and_skips_writes():
    @T.prim_func
    def k(A: T.Tensor((5, 3), "float32"), B: T.Tensor((5, 3), "float32")):
        with T.Kernel(1) as bx:
            t = T.alloc_fragment((8, 4), "float32")
            T.copy(A[0, 0], t)
            for i, j in T.Parallel(8, 4):
                t[i, j] = t[i, j] + 1.0
            T.copy(t, B[0, 0])
    a = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    b = np.full((5, 3), np.nan, np.float32)
    kernforge.compile(k)(a, b)
    np.testing.assert_array_equal(b, a + 1)


def test_runtime_if_on_block_uniform_value():
    @T.prim_func
    def k(A: T.Tensor((6,), "int32"), n: T.int32):
        with T.Kernel(6) as bx:
            if bx < n:
                A[bx] = bx * 10
            else:
                A[bx] = -1
    a = np.zeros(6, np.int32)
    kernforge.compile(k)(a, 4)
    np.testing.assert_array_equal(a, [0, 10, 20, 30, -1, -1])


def test_repeated_calls_reuse_the_checks_but_never_skip_them():
    """The argument checks are memoised by signature: a repeat call with the same shapes
    skips them, but any change of dtype, shape or stride is checked again."""
    import torch

    n = T.symbolic("n")

    @T.prim_func
    def k(A: T.Tensor((n,), "float32"), B: T.Tensor((n,), "float32")):
        with T.Kernel(1) as bx:
            for i in T.Parallel(4):
                if i < A.shape[0]:
                    B[i] = A[i] + 1.0
    kern = kernforge.compile(k)
    a, b = torch.arange(4.0), torch.full((4,), float("nan"))
    kern(a, b)
    kern(a, b)
    assert len(kern._plans) == 1 and torch.equal(b, a + 1)
    with pytest.raises(kernforge.ShapeError):
        kern(a, torch.empty(3))
    with pytest.raises(kernforge.ArgumentError):
        kern(a.double(), b.double())
    with pytest.raises(kernforge.ShapeError):
        kern(torch.arange(8.0)[::2], b)
