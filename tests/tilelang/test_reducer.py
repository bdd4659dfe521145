"""Reductions across iterations and threads, as the GEMV example writes them: ``T.alloc_reducer`` /
``T.finalize_reducer`` (tile level), TVM's ``T.tvm_thread_allreduce`` under ``T.attr(T.comm_reducer)``
(thread level), ``T.clear`` of a thread's own local, and threads storing one value to one element.
Results on interp, cpu and cuda-emu against numpy in float64."""
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


def row_reduce(M: int, N: int, BM: int, BN: int, op: str, start: float):
    """``r[i] (op)= x[i, j]`` over ``T.Pipelined`` tiles of columns, from ``start``."""
    @T.prim_func
    def main(X: T.Tensor((M, N), "float16"), Y: T.Tensor((M,), "float32")):
        with T.Kernel(T.ceildiv(M, BM), threads=64) as bm:
            r = T.alloc_reducer(BM, "float32", op=op, replication="all")
            T.fill(r, start)
            for k in T.Pipelined(T.ceildiv(N, BN), num_stages=2):
                x = T.alloc_fragment((BM, BN), "float16")
                T.copy(X[bm * BM, k * BN], x)
                for i, j in T.Parallel(BM, BN):
                    if op == "sum":
                        r[i] += x[i, j] * 2.0
                    else:
                        r[i] = T.max(r[i], x[i, j]) if op == "max" else T.min(r[i], x[i, j])
            T.finalize_reducer(r)
            T.copy(r, Y[bm * BM])
    return main


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_alloc_reducer_combines_every_iteration(backend, op):
    M, N, BM, BN = 24, 40, 16, 16  # neither divides: edge tiles read 0 past N (T.copy)
    x = torch.randn(M, N).half()
    y = _run(row_reduce(M, N, BM, BN, op, 0.5), backend, x)
    xp = np.zeros((M, 48))  # the padded columns of the last tile read 0, as TileLang's copy does
    xp[:, :N] = x.double().numpy()
    ref = {"sum": 0.5 + 2 * xp.sum(1), "max": np.maximum(0.5, xp.max(1)), "min": np.minimum(0.5, xp.min(1))}[op]
    np.testing.assert_allclose(y.double().numpy(), ref, rtol=1e-5, atol=1e-4)


def test_reducer_update_must_name_the_reducer_element():
    with pytest.raises(T.UnsupportedError, match="updated as `r\\[i\\] \\+= v`") as e:
        @T.prim_func
        def k(X: T.Tensor((8, 8), "float32"), Y: T.Tensor((8,), "float32")):
            with T.Kernel(1, threads=32):
                r = T.alloc_reducer(8, "float32")
                for i, j in T.Parallel(8, 8):
                    r[i] = X[i, j]  # a store, not an update: every j would overwrite it
                T.finalize_reducer(r)
                T.copy(r, Y)
    assert e.value.loc.file == __file__


def test_reducer_over_two_dimensions_is_refused():
    with pytest.raises(T.UnsupportedError, match="exactly one loop dimension"):
        @T.prim_func
        def k(X: T.Tensor((4, 8, 8), "float32"), Y: T.Tensor((4,), "float32")):
            with T.Kernel(1, threads=32):
                r = T.alloc_reducer(4, "float32")
                T.clear(r)
                for i, j, l in T.Parallel(4, 8, 8):
                    r[i] += X[i, j, l]
                T.finalize_reducer(r)
                T.copy(r, Y)


def allreduce(TN: int, TK: int, K: int, combine: str):
    """Threads ``(TN, TK)``: each sums its strided share of a row, then the ``TK`` threads of a
    row combine their partials with TVM's thread allreduce (GEMV's ``splitk_gemv_vectorized_tvm``)."""
    fn = (lambda a, b: a + b) if combine == "sum" else (lambda a, b: T.max(a, b))
    init = 0.0 if combine == "sum" else -T.infinity("float32")

    @T.prim_func
    def main(X: T.Tensor((TN, K), "float32"), Y: T.Tensor((TN, TK), "float32")):
        with T.Kernel(1, threads=(TN, TK)):
            tn = T.get_thread_binding(0)
            tk = T.get_thread_binding(1)
            acc = T.alloc_local((1,), "float32")
            out = T.alloc_local((1,), "float32")
            T.fill(acc, init)
            for k in T.serial(K // TK):
                acc[0] = fn(acc[0], X[tn, k * TK + tk])
            with T.attr(T.comm_reducer(fn, [T.cast(init, "float32")]), "reduce_scope",
                        T.reinterpret(T.uint64(0), dtype="handle")):
                T.evaluate(T.tvm_thread_allreduce(T.uint32(1), acc[0], True, out[0], tk, dtype="handle"))
            Y[tn, tk] = out[0]  # every thread of the row holds the result
    return main


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("combine", ["sum", "max"])
def test_tvm_thread_allreduce(backend, combine):
    TN, TK, K = 4, 8, 64
    x = torch.randn(TN, K)
    y = _run(allreduce(TN, TK, K, combine), backend, x)
    xd = x.double().numpy()
    ref = xd.sum(1) if combine == "sum" else xd.max(1)
    np.testing.assert_allclose(y.double().numpy(), np.repeat(ref[:, None], TK, 1), rtol=1e-5, atol=1e-5)


def test_allreduce_needs_its_reduce_scope():
    with pytest.raises(T.UnsupportedError, match="reduce_scope") as e:
        @T.prim_func
        def k(Y: T.Tensor((32,), "float32")):
            with T.Kernel(1, threads=32):
                tx = T.get_thread_binding()
                out = T.alloc_local((1,), "float32")
                T.evaluate(T.tvm_thread_allreduce(T.uint32(1), T.cast(tx, "float32"), True, out[0], tx))
                Y[tx] = out[0]
    assert e.value.loc.file == __file__


def shared_sum(threads: int, K: int):
    """A per-thread local cleared and accumulated, added into one shared cell by every thread
    (TileLang inserts the barriers), then stored by every thread: one value to one element."""
    @T.prim_func
    def main(X: T.Tensor((threads, K), "float32"), Y: T.Tensor((1,), "float32")):
        with T.Kernel(1, threads=threads):
            tx = T.get_thread_binding()
            acc = T.alloc_local((2,), "float32")
            total = T.alloc_shared((1,), "float32")
            if tx == 0:
                total[0] = 0
            T.clear(acc)  # this thread's own two values only
            for k in T.serial(K):
                acc[k % 2] += X[tx, k]
            T.atomic_add(total[0], acc[0] + acc[1])
            Y[0] = total[0]
    return main


@pytest.mark.parametrize("backend", BACKENDS)
def test_clear_of_a_thread_local_and_one_value_stores(backend):
    x = torch.randn(64, 6)
    y = _run(shared_sum(64, 6), backend, x)
    np.testing.assert_allclose(y.double().numpy(), [x.double().sum().item()], rtol=1e-5, atol=1e-5)


def test_threads_storing_different_values_to_one_element_race():
    @T.prim_func
    def k(X: T.Tensor((32,), "float32"), Y: T.Tensor((1,), "float32")):
        with T.Kernel(1, threads=32):
            tx = T.get_thread_binding()
            Y[0] = X[tx]
    x = torch.arange(32, dtype=torch.float32)
    with pytest.raises(ir.KernelError, match="same element of Y .*same value"):
        tilelang.compile(k, target="interp")(x, torch.zeros(1))
    tilelang.compile(k, target="interp")(torch.ones(32), torch.zeros(1))  # one value: no race


def test_autotuned_compile_with_its_tunables_is_untuned():
    @tilelang.autotune(configs=[{"block": 8}, {"block": 16}])
    @tilelang.jit
    def double(A, block: int = 8):
        n = T.const("n")
        A: T.Tensor((n,), "float32")
        B = T.empty((n,), "float32")
        with T.Kernel(T.ceildiv(n, block), threads=32) as bx:
            for i in T.Parallel(block):
                B[bx * block + i] = A[bx * block + i] * 2
        return B

    k = double.compile(n=32, block=16)
    x = torch.randn(32)
    torch.testing.assert_close(k(x), 2 * x)
    with pytest.raises(T.UnsupportedError, match="gives no tunable parameter"):
        double.compile(n=32)
