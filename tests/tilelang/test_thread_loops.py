"""Thread-level code as TileLang writes it (the Hadamard example's constructs): warp shuffles and
barriers inside loops whose trip count every thread shares, ``T.alloc_local`` made before
``T.get_thread_binding()`` (per thread, as TileLang's locals always are), and TVM's
``T.tvm_warp_shuffle``.  Results on interp, cpu and cuda-emu against numpy."""
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


def _run(func, backend, *args):
    return tilelang.compile(func, out_idx=[-1], target=backend)(*args)


def butterfly_in_loop(threads: int, rounds: int):
    """Each lane adds or subtracts its partner's values across ``rounds`` xor rounds (a Hadamard
    transform over the lanes, as the Hadamard example's warp stage), two values per lane."""
    @T.prim_func
    def main(X: T.Tensor((threads, 2), "float32"), Y: T.Tensor((threads, 2), "float32")):
        with T.Kernel(1, threads=threads):
            local = T.alloc_local((2,), "float32")  # before the thread binding: still per thread
            other = T.alloc_local((2,), "float32")
            tx = T.get_thread_binding(0)
            for j in T.vectorized(2):
                local[j] = X[tx, j]
            for i in T.serial(rounds):
                for j in T.serial(2):
                    other[j] = T.tvm_warp_shuffle(0xFFFFFFFF, local[j], (tx ^ (1 << i)) % 32, 32, 32)
                    local[j] = T.if_then_else((tx >> i) & 1 == 0, local[j] + other[j], other[j] - local[j])
            for j in T.vectorized(2):
                Y[tx, j] = local[j]
    return main


def ref_butterfly(x: np.ndarray, rounds: int) -> np.ndarray:
    x = x.astype(np.float64).copy()
    for i in range(rounds):
        src = np.arange(len(x)) ^ (1 << i)
        bit = (np.arange(len(x)) >> i) & 1
        x = np.where(bit[:, None] == 0, x + x[src], x[src] - x)
    return x


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("threads,rounds", [(32, 5), (64, 3)])
def test_shuffles_inside_uniform_loops(backend, threads, rounds):
    x = torch.randn(threads, 2)
    y = _run(butterfly_in_loop(threads, rounds), backend, x)
    np.testing.assert_allclose(y.numpy(), ref_butterfly(x.numpy(), rounds), rtol=1e-5, atol=1e-5)


def rotate(threads: int, steps: int):
    """Per round, every thread writes its value to shared memory and reads its neighbour's: the
    barriers sit in a ``T.serial`` loop (a rotation by ``steps``)."""
    @T.prim_func
    def main(X: T.Tensor((threads,), "float32"), Y: T.Tensor((threads,), "float32")):
        with T.Kernel(1, threads=threads):
            s = T.alloc_shared((threads,), "float32")
            tx = T.get_thread_binding()
            v = T.alloc_local((1,), "float32")
            v[0] = X[tx]
            for r in T.serial(1, steps + 1):
                s[tx] = v[0] * r
                T.sync_threads()
                v[0] = s[(tx + 1) % threads]
                T.sync_threads()
            Y[tx] = v[0]
    return main


@pytest.mark.parametrize("backend", BACKENDS)
def test_barriers_inside_uniform_loops(backend):
    x = torch.randn(16)
    y = _run(rotate(16, 3), backend, x)
    np.testing.assert_allclose(y.numpy(), np.roll(x.numpy(), -3) * 6, rtol=1e-6)


def test_the_loop_is_lifted_out_of_the_thread_map():
    """``for tx: ...; for r: (.. barrier .. barrier)`` becomes ``for tx`` then ``for r: (for tx; for tx)``
    (the empty map after the last barrier is dropped)."""
    f = rotate(16, 3)
    body = [n for n in ir.nodes(f.ir) if isinstance(n, ir.For)]
    assert len(body) == 1 and sum(isinstance(n, ir.Parallel) for n in ir.nodes(body[0].body)) == 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_local_before_the_binding_is_per_thread(backend):
    @T.prim_func
    def k(X: T.Tensor((64,), "float32"), Y: T.Tensor((64,), "float32")):
        with T.Kernel(2, threads=32) as bx:
            acc = T.alloc_local((1,), "float32")
            tx = T.get_thread_binding()
            acc[0] = 0
            for i in T.serial(3):
                acc[0] += X[bx * 32 + tx] * (i + 1)
            Y[bx * 32 + tx] = acc[0]
    x = torch.randn(64)
    np.testing.assert_allclose(_run(k, backend, x).numpy(), x.numpy() * 6, rtol=1e-6)


def test_a_local_used_before_the_binding_stays_block_uniform():
    @T.prim_func
    def k(X: T.Tensor((32,), "float32"), Y: T.Tensor((32,), "float32")):
        with T.Kernel(1, threads=32):
            c = T.alloc_local((1,), "float32")
            c[0] = X[0]
            tx = T.get_thread_binding()
            Y[tx] = X[tx] + c[0]
    c = [n.buffer for n in ir.nodes(k.ir) if isinstance(n, ir.Allocate) and n.buffer.name == "c"]
    assert c and c[0].scope == ir.Scope.LOCAL and len(c[0].shape) == 1
    x = torch.randn(32)
    np.testing.assert_allclose(_run(k, "interp", x).numpy(), x.numpy() + x.numpy()[0], rtol=1e-6)


def test_a_thread_dependent_loop_still_refuses_barriers():
    with pytest.raises(T.DivergentBarrierError, match="trip count depends on the thread"):
        @T.prim_func
        def k(A: T.Tensor((32,), "float32")):
            with T.Kernel(1, threads=32):
                tx = T.get_thread_binding()
                for i in T.serial(tx):
                    T.sync_threads()
                A[tx] = 0
    with pytest.raises(T.DivergentBarrierError):
        @T.prim_func
        def k2(A: T.Tensor((32,), "float32")):
            with T.Kernel(1, threads=32):
                tx = T.get_thread_binding()
                for i in T.serial(2):
                    if tx < 16:
                        T.sync_threads()
                A[tx] = 0


def test_tvm_warp_shuffle_needs_32_lane_warps():
    with pytest.raises(T.UnsupportedError, match="warp_size=16"):
        @T.prim_func
        def k(A: T.Tensor((32,), "float32")):
            with T.Kernel(1, threads=32):
                tx = T.get_thread_binding()
                A[tx] = T.tvm_warp_shuffle(0xFFFFFFFF, A[tx], 0, 16, 16)


# ---------------------------------------------------------------- TileLang's automatic barriers


def exchange_without_barriers(threads: int, rounds: int):
    """Each round every thread writes its value to shared memory and reads the mirrored thread's,
    with no T.sync_threads(): TileLang inserts the barriers, and so does kernforge
    (kernforge.dsl.thread_sync).  Then thread 0 alone zeroes a shared counter that every thread
    then adds to atomically, and each thread reads the total (GEMV's pattern)."""
    @T.prim_func
    def main(X: T.Tensor((threads,), "float32"), Y: T.Tensor((threads,), "float32"),
             S: T.Tensor((threads,), "float32")):
        with T.Kernel(1, threads=threads):
            s = T.alloc_shared((threads,), "float32")
            total = T.alloc_shared((1,), "float32")
            v = T.alloc_local((1,), "float32")
            tx = T.get_thread_binding()
            v[0] = X[tx]
            for r in T.serial(rounds):
                s[tx] = v[0] + r
                v[0] = s[threads - 1 - tx]
            Y[tx] = v[0]
            if tx == 0:
                total[0] = 0
            T.atomic_add(total[0], v[0])
            S[tx] = total[0]
    return main


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rounds", [1, 3])
def test_shared_exchange_gets_tilelangs_barriers(backend, rounds):
    x = torch.randn(64)
    ref = x.numpy().astype(np.float64)
    for r in range(rounds):
        ref = (ref + r)[::-1]
    y, s = tilelang.compile(exchange_without_barriers(64, rounds), out_idx=[-2, -1], target=backend)(x)
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s.numpy(), np.full(64, ref.sum()), rtol=1e-4, atol=1e-4)


def test_a_map_that_touches_no_shared_memory_is_not_split():
    @T.prim_func
    def k(X: T.Tensor((32,), "float32"), Y: T.Tensor((32,), "float32")):
        with T.Kernel(1, threads=32):
            tx = T.get_thread_binding()
            v = T.alloc_local((1,), "float32")
            for i in T.serial(4):
                v[0] = X[tx] * i
                Y[tx] = v[0]
    assert sum(isinstance(n, ir.Parallel) for n in ir.nodes(k.ir)) == 1

