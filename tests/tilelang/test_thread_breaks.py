"""A runtime ``break`` of a ``T.serial`` loop in thread-level code (kernforge.dsl.thread_breaks),
as DeepSeek V3.2's top-k selector ends its rounds: a per-thread flag that guards the rest of the
loop.  Per-thread breaks in a loop without barriers, and a block-uniform break in a loop with
barriers (before and after the first barrier of the body), checked against numpy on interp, cpu
and cuda-emu; the breaks that cannot be lowered stay typed errors at the author's line."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import kernforge.tilelang as tilelang
import kernforge.tilelang.language as T
from kernforge.dsl.compat import UnsupportedError

BACKENDS = ["interp", "cpu", "cuda-emu"]


@pytest.fixture(autouse=True)
def _tune_db(monkeypatch, tmp_path):
    monkeypatch.setenv("KERNFORGE_TUNE_DB", str(tmp_path / "tune.sqlite"))


def running_sum(threads: int, n: int):
    """Each thread sums ``X`` until its own sum reaches ``L[tx]`` (a per-thread break); a dead
    statement after the break in its ``if`` must not run."""
    @T.prim_func
    def main(X: T.Tensor((n,), "int32"), L: T.Tensor((threads,), "int32"), A: T.Tensor((threads,), "int32"),
             C: T.Tensor((threads,), "int32")):
        with T.Kernel(1, threads=threads):
            tx = T.get_thread_binding()
            acc = T.alloc_var("int32")
            cnt = T.alloc_var("int32")
            acc = 0
            cnt = 0
            for i in T.serial(n):
                if acc >= L[tx]:
                    break
                    cnt = cnt + 1000  # noqa - unreachable in Python, so it must not run here
                acc = acc + X[i]
                cnt = cnt + 1
            A[tx] = acc
            C[tx] = cnt
    return main


@pytest.mark.parametrize("backend", BACKENDS)
def test_per_thread_break_stops_each_thread_on_its_own(backend):
    threads, n = 64, 20
    g = torch.Generator().manual_seed(7)
    x = torch.randint(0, 10, (n,), generator=g, dtype=torch.int32)
    lim = torch.randint(-5, 120, (threads,), generator=g, dtype=torch.int32)
    a, c = torch.full((threads,), -1, dtype=torch.int32), torch.full((threads,), -1, dtype=torch.int32)
    tilelang.compile(running_sum(threads, n), target=backend)(x, lim, a, c)
    csum = np.concatenate([[0], np.cumsum(x.numpy())])
    # the first i with csum[i] >= lim breaks before adding X[i]; none: all n added
    stop = np.array([next((i for i in range(n) if csum[i] >= lv), n) for lv in lim.numpy()])
    np.testing.assert_array_equal(c.numpy(), stop)
    np.testing.assert_array_equal(a.numpy(), csum[stop])
    assert len(set(stop.tolist())) > 3  # the threads really break in different iterations


def doubling(threads: int, rounds: int, late: bool):
    """Rounds of a shared-memory exchange (``s[tx] = 2 * s[tx + 1]``) with barriers, a ``T.fill`` and
    shared atomics, until the shared total reaches ``LIM[0]``: a break every thread takes alike.
    ``late``: a barrier stands before the break (the loop is lifted out of the thread region
    before the break is traced)."""
    @T.prim_func
    def main(X: T.Tensor((threads,), "int32"), LIM: T.Tensor((1,), "int32"), Y: T.Tensor((threads,), "int32"),
             R: T.Tensor((threads,), "int32")):
        with T.Kernel(1, threads=threads):
            tx = T.get_thread_binding()
            s = T.alloc_shared((threads,), "int32")
            tot = T.alloc_shared((1,), "int32")
            v = T.alloc_var("int32")
            n = T.alloc_var("int32")
            n = 0
            s[tx] = X[tx]
            T.fill(tot, 0)
            T.sync_threads()
            T.atomic_add(tot[0], s[tx])
            T.sync_threads()
            for r in T.serial(rounds):
                if late:
                    T.sync_threads()
                if tot[0] >= LIM[0]:
                    break
                v = s[(tx + 1) % threads] * 2
                T.sync_threads()
                T.fill(tot, 0)
                s[tx] = v
                T.sync_threads()
                T.atomic_add(tot[0], s[tx])
                n = n + 1
                T.sync_threads()
            Y[tx] = s[tx]
            R[tx] = n
    return main


@pytest.mark.parametrize("late", [False, True])
@pytest.mark.parametrize("backend", BACKENDS)
def test_uniform_break_in_a_loop_with_barriers(backend, late):
    threads, rounds = 64, 6
    x = torch.randint(0, 5, (threads,), generator=torch.Generator().manual_seed(8), dtype=torch.int32)
    lim = torch.tensor([int(x.sum()) * 5], dtype=torch.int32)
    y, r = torch.full((threads,), -1, dtype=torch.int32), torch.full((threads,), -1, dtype=torch.int32)
    tilelang.compile(doubling(threads, rounds, late), target=backend)(x, lim, y, r)
    s, n = x.numpy().astype(np.int64), 0
    for _ in range(rounds):
        if s.sum() >= lim[0]:
            break
        s, n = np.roll(s, -1) * 2, n + 1
    assert 0 < n < rounds  # the break is taken, before the last round
    np.testing.assert_array_equal(y.numpy(), s)
    np.testing.assert_array_equal(r.numpy(), n)


def test_break_of_an_unrolled_range_loop_stays_an_error():
    """A Python ``range`` loop unrolls while tracing: a runtime break cannot end it."""
    with pytest.raises(UnsupportedError, match="`break` under a runtime `if`") as e:
        @T.prim_func
        def main(X: T.Tensor((4,), "int32"), Y: T.Tensor((32,), "int32")):
            with T.Kernel(1, threads=32):
                tx = T.get_thread_binding()
                for i in range(4):
                    if X[i] > tx:
                        break
                Y[tx] = 1
    assert "test_thread_breaks.py" in e.value.loc.file


def test_break_in_tile_code_stays_an_error():
    with pytest.raises(UnsupportedError, match="`break` under a runtime `if`"):
        @T.prim_func
        def main(X: T.Tensor((4,), "int32"), Y: T.Tensor((4,), "int32")):
            with T.Kernel(1, threads=32):
                for i in T.serial(4):
                    if X[i] > 0:
                        break
                    Y[i] = 1


def test_skipping_continue_stays_an_error():
    with pytest.raises(UnsupportedError, match="`continue` under a runtime `if`"):
        @T.prim_func
        def main(X: T.Tensor((4,), "int32"), Y: T.Tensor((32,), "int32")):
            with T.Kernel(1, threads=32):
                tx = T.get_thread_binding()
                for i in T.serial(4):
                    if X[i] > tx:
                        continue
                    Y[tx] = i


def own_trips(threads: int):
    """Loops whose trip count is each thread's own (``C[tx]``, read into a ``T.alloc_var``): one
    with barriers (lifted: it runs the block's largest count, each thread only its own
    iterations) and one without (a per-thread loop inside the thread map)."""
    @T.prim_func
    def main(C: T.Tensor((threads,), "int32"), S: T.Tensor((threads,), "int32"), A: T.Tensor((threads,), "int32"),
             B: T.Tensor((threads,), "int32")):
        with T.Kernel(1, threads=threads):
            tx = T.get_thread_binding()
            s = T.alloc_shared((threads,), "int32")
            cnt = T.alloc_var("int32")
            acc = T.alloc_var("int32")
            tri = T.alloc_var("int32")
            cnt = C[tx]
            acc = 0
            tri = 0
            s[tx] = 0
            T.sync_threads()
            for k in T.serial(cnt):
                s[tx] = s[tx] + k + 1
                T.sync_threads()
                acc = acc + s[(tx + 1) % threads]
                T.sync_threads()
            for k in T.serial(cnt + 1):
                tri = tri + k
            S[tx] = s[tx]
            A[tx] = acc
            B[tx] = tri
    return main


@pytest.mark.parametrize("backend", BACKENDS)
def test_barriers_in_a_loop_over_each_threads_own_trip_count(backend):
    threads = 64
    c = torch.randint(0, 6, (threads,), generator=torch.Generator().manual_seed(9), dtype=torch.int32)
    out = [torch.full((threads,), -1, dtype=torch.int32) for _ in range(3)]
    tilelang.compile(own_trips(threads), target=backend)(c, *out)
    cn = c.numpy()
    s, acc = np.zeros(threads, np.int64), np.zeros(threads, np.int64)
    for k in range(int(cn.max())):  # numpy: the rounds of the block, each thread in its own ones
        active = k < cn
        s = np.where(active, s + k + 1, s)
        acc = np.where(active, acc + np.roll(s, -1), acc)
    np.testing.assert_array_equal(out[0].numpy(), s)
    np.testing.assert_array_equal(out[1].numpy(), acc)
    np.testing.assert_array_equal(out[2].numpy(), cn * (cn + 1) // 2)
