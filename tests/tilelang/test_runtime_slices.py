"""Slices whose bounds re-read a runtime variable, ``X[off + r * BM : off + (r + 1) * BM]``, as
TileLang's group FP8 cast writes them (``off`` a ``T.alloc_var`` summed from a tensor): the two
reads of ``off`` are one value at the slice, so the length folds to ``BM``
(kernforge.dsl.slices).  Results on interp, cpu and cuda-emu against numpy."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import kernforge.tilelang as tilelang
import kernforge.tilelang.language as T
from kernforge.codegen import ir
from kernforge.dsl import slices

BACKENDS = ["interp", "cpu", "cuda-emu"]


@pytest.fixture(autouse=True)
def _tune_db(monkeypatch, tmp_path):
    monkeypatch.setenv("KERNFORGE_TUNE_DB", str(tmp_path / "tune.sqlite"))


def gather_group(M: int, N: int, G: int, BM: int):
    """Block (r, g) copies rows ``off_g + r*BM ...`` of X, ``off_g`` the sum of ``sizes[:g]``,
    into ``Y[g, r*BM ...]`` (plus one, so that a skipped copy shows)."""
    @T.prim_func
    def main(X: T.Tensor((M, N), "float32"), sizes: T.Tensor((G,), "int32"), Y: T.Tensor((G, BM * 2, N), "float32")):
        with T.Kernel(2, G, threads=32) as (r, g):
            off = T.alloc_var(dtype="int32")
            off = 0
            for i in T.serial(g):
                off += sizes[i]
            t = T.alloc_fragment((BM, N), "float32")
            T.copy(X[off + r * BM: off + (r + 1) * BM, 0:N], t)
            for i, j in T.Parallel(BM, N):
                t[i, j] = t[i, j] + 1
            T.copy(t, Y[g, r * BM:(r + 1) * BM, :])
    return main


@pytest.mark.parametrize("backend", BACKENDS)
def test_slice_at_a_runtime_offset(backend):
    BM, N, sizes = 4, 16, [3, 8, 5]
    M = sum(sizes) + 2 * BM  # every block's rows lie inside X
    x = torch.randn(M, N)
    y = torch.full((len(sizes), 2 * BM, N), float("nan"))
    tilelang.compile(gather_group(M, N, len(sizes), BM), target=backend)(x, torch.tensor(sizes, dtype=torch.int32), y)
    offs = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    want = np.stack([x.numpy()[o:o + 2 * BM] + 1 for o in offs])
    np.testing.assert_array_equal(y.numpy(), want)


def test_length_unifies_equal_reads_only():
    buf = ir.Buffer("off", (ir.const(1),), ir.dtypes.int32, ir.Scope.LOCAL)
    other = ir.Buffer("o2", (ir.const(1),), ir.dtypes.int32, ir.Scope.LOCAL)
    r = ir.Var("r")

    def load(b, i=0):
        return ir.Load(b, (ir.const(i),))

    assert slices.length(load(buf) + (r + 1) * 8, load(buf) + r * 8) == 8
    assert slices.length(ir.cast(load(buf), ir.dtypes.int64) + 3, ir.cast(load(buf), ir.dtypes.int64)) == 3
    assert slices.length(load(other) + 8, load(buf)) is None      # different variables
    assert slices.length(load(buf, 0) + 8, load(buf, 1)) is None  # different elements


def test_runtime_length_is_a_typed_error():
    """A slice whose length is truly runtime still fails at the author's line, naming the tensor."""
    def body(X: T.Tensor((16, 4), "float32"), sizes: T.Tensor((2,), "int32"), Y: T.Tensor((8, 4), "float32")):
        with T.Kernel(1, threads=32):
            t = T.alloc_fragment((8, 4), "float32")
            T.copy(X[sizes[0]: sizes[1], :], t)
            T.copy(t, Y)
    with pytest.raises(ir.KernelError, match="test_runtime_slices.py:.*slice 0 of X must have a positive compile-time length"):
        T.prim_func(body)
