"""Tile code run by a subset of a block's threads, as DeepSeek's mHC pre kernel writes it:
``if T.get_thread_binding() < 32:`` (tile ops) ``else:`` (other tile ops).  In TileLang the threads
that take a side run its tile operations together; kernforge runs each side as block-level tile
code when some thread takes it (kernforge.dsl.compat.subset_tile_code).  Results on interp, cpu and
cuda-emu against numpy in float64."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import kernforge.tilelang as tilelang
import kernforge.tilelang.language as T
from kernforge.codegen import ir

BACKENDS = ["interp", "cpu", "cuda-emu"]


@pytest.fixture(autouse=True)
def _tune_db(monkeypatch, tmp_path):
    monkeypatch.setenv("KERNFORGE_TUNE_DB", str(tmp_path / "tune.sqlite"))


def split_roles(M: int, N: int, threads: int, cut: int):
    """Warp 0 stores row maxima; the other threads store row sums of ``2 * x`` through a shared
    tile; after the branch, thread-level code goes on (each thread below M stores its row id)."""
    @T.prim_func
    def main(X: T.Tensor((M, N), "float32"), Mx: T.Tensor((M,), "float32"), Sm: T.Tensor((M,), "float32"),
             Ids: T.Tensor((M,), "int32")):
        with T.Kernel(1, threads=threads):
            if T.get_thread_binding() < cut:
                x = T.alloc_fragment((M, N), "float32")
                T.copy(X, x)
                m = T.alloc_fragment((M,), "float32")
                T.reduce_max(x, m, dim=1)
                T.copy(m, Mx)
            else:
                xs = T.alloc_shared((M, N), "float32")
                T.copy(X, xs)
                y = T.alloc_fragment((M, N), "float32")
                for i, j in T.Parallel(M, N):
                    y[i, j] = xs[i, j] * 2
                s = T.alloc_fragment((M,), "float32")
                T.reduce_sum(y, s, dim=1)
                T.copy(s, Sm)
            tx = T.get_thread_binding()
            if tx < M:
                Ids[tx] = tx
    return main


@pytest.mark.parametrize("backend", BACKENDS)
def test_both_sides_run_as_tile_code(backend):
    M, N = 8, 24
    x = torch.randn(M, N)
    mx, sm, ids = (torch.full((M,), float("nan")), torch.full((M,), float("nan")), torch.full((M,), -1, dtype=torch.int32))
    tilelang.compile(split_roles(M, N, 64, 32), target=backend)(x, mx, sm, ids)
    xd = x.double().numpy()
    np.testing.assert_allclose(mx.double().numpy(), xd.max(1), rtol=1e-6)
    np.testing.assert_allclose(sm.double().numpy(), 2 * xd.sum(1), rtol=1e-5, atol=1e-5)
    assert ids.tolist() == list(range(M))


def test_a_side_no_thread_takes_does_not_run():
    M, N = 8, 24
    x = torch.randn(M, N)
    mx, sm, ids = (torch.full((M,), float("nan")), torch.full((M,), 7.0), torch.full((M,), -1, dtype=torch.int32))
    tilelang.compile(split_roles(M, N, 64, 64), target="interp")(x, mx, sm, ids)  # every thread < 64
    np.testing.assert_allclose(mx.numpy(), x.numpy().max(1))
    assert (sm == 7.0).all()  # the else side never ran


def test_tile_code_after_a_per_thread_statement_is_still_refused():
    with pytest.raises(ir.KernelError, match="allocation inside T.Parallel"):
        @T.prim_func
        def k(X: T.Tensor((32,), "float32"), Y: T.Tensor((32,), "float32")):
            with T.Kernel(1, threads=32):
                tx = T.get_thread_binding()
                if tx < 16:
                    Y[tx] = X[tx]  # per-thread code first: the branch stays per thread
                    s = T.alloc_shared((32,), "float32")
                    T.copy(X, s)


def test_tile_code_under_a_condition_on_memory_is_still_refused():
    with pytest.raises(ir.KernelError, match="allocation inside T.Parallel"):
        @T.prim_func
        def k(X: T.Tensor((32,), "float32"), Y: T.Tensor((32,), "float32")):
            with T.Kernel(1, threads=32):
                tx = T.get_thread_binding()
                if X[tx] > 0:  # differs per thread in a way the trace cannot know
                    s = T.alloc_shared((32,), "float32")
                    T.copy(X, s)
