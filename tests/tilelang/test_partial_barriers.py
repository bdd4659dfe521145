"""Named partial barriers, ``T.sync_threads(barrier_id, arrive_count)``, under ``if``\\ s on the
thread index, as DeepSeek V3.2's top-k selector writes its cumsum: the branch is distributed over
the barrier's split (kernforge.dsl.thread_branches).  Results on interp, cpu and cuda-emu against
numpy; a wrong ``arrive_count`` and a block barrier under a branch are typed errors."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import kernforge.tilelang as tilelang
import kernforge.tilelang.language as T
from kernforge.dsl.compat import DivergentBarrierError

BACKENDS = ["interp", "cpu", "cuda-emu"]


@pytest.fixture(autouse=True)
def _tune_db(monkeypatch, tmp_path):
    monkeypatch.setenv("KERNFORGE_TUNE_DB", str(tmp_path / "tune.sqlite"))


def scan(N: int, threads: int, steps: int):
    """The first ``N`` threads run a Hillis-Steele suffix sum of ``X`` in shared memory with named
    barriers (the selector's histogram cumsum); the others, in the ``else``, store ``2 * tx``."""
    @T.prim_func
    def main(X: T.Tensor((N,), "int32"), Y: T.Tensor((threads,), "int32"), Z: T.Tensor((threads,), "int32")):
        with T.Kernel(1, threads=threads):
            tx = T.get_thread_binding()
            s = T.alloc_shared((N,), "int32")
            v = T.alloc_var("int32")
            if tx < N:
                s[tx] = X[tx]
                for i in T.serial(steps):
                    offset = 1 << i
                    T.sync_threads(3, N)
                    if tx < N - offset:
                        v = s[tx] + s[tx + offset]
                    T.sync_threads(3, N)
                    if tx < N - offset:
                        s[tx] = v
                T.sync_threads(3, N)
                Y[tx] = s[tx]
                Z[tx] = -1
            else:
                Z[tx] = tx * 2
    return main


@pytest.mark.parametrize("backend", BACKENDS)
def test_suffix_sum_of_a_thread_subset(backend):
    N, threads = 64, 128
    x = torch.randint(-50, 50, (N,), dtype=torch.int32)
    y = torch.full((threads,), 12345, dtype=torch.int32)  # past N: untouched (no thread there takes the branch)
    z = torch.full((threads,), 12345, dtype=torch.int32)
    tilelang.compile(scan(N, threads, 6), target=backend)(x, y, z)
    want = np.cumsum(x.numpy()[::-1])[::-1]
    np.testing.assert_array_equal(y.numpy()[:N], want)
    assert (y.numpy()[N:] == 12345).all()
    np.testing.assert_array_equal(z.numpy(), np.where(np.arange(threads) < N, -1, 2 * np.arange(threads)))


def test_arrive_count_must_match_the_threads_that_reach_it():
    def main(X: T.Tensor((64,), "int32")):
        with T.Kernel(1, threads=128):
            tx = T.get_thread_binding()
            if tx < 32:
                T.sync_threads(1, 64)
                X[tx] = 1
    with pytest.raises(DivergentBarrierError, match=r"test_partial_barriers.py:.*32 of the block's 128 threads.*arrive_count=64"):
        T.prim_func(main)


def test_block_barrier_under_a_branch_is_an_error():
    def main(X: T.Tensor((64,), "int32")):
        with T.Kernel(1, threads=128):
            tx = T.get_thread_binding()
            if tx < 64:
                T.sync_threads(1, 64)
                X[tx] = 1
                T.sync_threads()
    with pytest.raises(DivergentBarrierError, match=r"test_partial_barriers.py:.*T.sync_threads\(\) under a branch"):
        T.prim_func(main)


def test_partial_barrier_under_a_data_dependent_branch_is_an_error():
    def main(X: T.Tensor((64,), "int32")):
        with T.Kernel(1, threads=128):
            tx = T.get_thread_binding()
            if X[tx % 64] > 0:
                T.sync_threads(1, 64)
                X[tx % 64] = 1
    with pytest.raises(DivergentBarrierError, match=r"test_partial_barriers.py:.*under a branch"):
        T.prim_func(main)


def test_shuffle_under_a_distributed_branch_is_an_error():
    """A warp shuffle needs every lane: inside a branch split by a partial barrier it is refused."""
    def main(X: T.Tensor((64,), "float32")):
        with T.Kernel(1, threads=128):
            tx = T.get_thread_binding()
            v = T.alloc_var("float32")
            if tx < 64:
                v = X[tx]
                T.sync_threads(1, 64)
                v = T.shfl_xor(v, 1)
                X[tx] = v
    with pytest.raises(DivergentBarrierError, match=r"test_partial_barriers.py:.*T.shfl_xor\(\) under a branch"):
        T.prim_func(main)
