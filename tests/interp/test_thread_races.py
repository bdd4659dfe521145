"""The interpreter runs thread-level code in lockstep, so a missing barrier would give it the
answer of a barrier that is not there, silently.  As the oracle it reports the race instead
(kernforge.interp.races): two threads touching one shared element between the same two barriers,
one of them writing, is a ``ThreadRaceError`` naming the buffer, the element and the line."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import kernforge.tilelang as tilelang
import kernforge.tilelang.language as T
from kernforge.interp.races import ThreadRaceError

N = 64


def _interp(func, *args):
    return tilelang.compile(func, out_idx=[-1], target="interp")(*args)


def shifted_read(shift: int, in_branch: bool):
    """Each thread writes ``s[tx]`` and reads ``s[(tx + shift) % N]``.  At the top level the two
    statements get TileLang's automatic barrier (kernforge.dsl.thread_sync); inside one branch
    they do not (a missing barrier when ``shift != 0``)."""
    @T.prim_func
    def main(X: T.Tensor((N,), "float32"), Y: T.Tensor((N,), "float32")):
        with T.Kernel(1, threads=N):
            tx = T.get_thread_binding()
            s = T.alloc_shared((N,), "float32")
            if in_branch:
                if tx < N:
                    s[tx] = X[tx] * 2
                    Y[tx] = s[(tx + shift) % N]  # the racing read
            else:
                s[tx] = X[tx] * 2
                Y[tx] = s[(tx + shift) % N]
    return main


@pytest.mark.parametrize("shift", [1, 5, N - 1])
def test_read_after_write_without_barrier_is_reported(shift):
    with pytest.raises(ThreadRaceError, match=r"reads what thread \d+ wrote to shared s\[\d+\]") as e:
        _interp(shifted_read(shift, True), torch.randn(N))
    assert e.value.loc.file == __file__
    assert "the racing read" in open(__file__).read().splitlines()[e.value.loc.line - 1]


@pytest.mark.parametrize("shift", [0, 1, 5])
def test_same_accesses_with_the_barrier_or_own_element_run_clean(shift):
    x = torch.randn(N)
    # shift 0: each thread reads only its own element, no barrier needed even in a branch
    y = _interp(shifted_read(shift, shift == 0), x)
    np.testing.assert_allclose(y.numpy(), np.roll(x.double().numpy() * 2, -shift), rtol=1e-6)


def test_write_after_read_in_one_statement_is_reported():
    @T.prim_func
    def main(X: T.Tensor((N,), "float32"), Y: T.Tensor((N,), "float32")):
        with T.Kernel(1, threads=N):
            tx = T.get_thread_binding()
            s = T.alloc_shared((N,), "float32")
            s[tx] = X[tx]
            T.sync_threads()
            s[tx] = s[(tx + 1) % N]  # reads a neighbour's element that the neighbour overwrites
            T.sync_threads()
            Y[tx] = s[tx]
    with pytest.raises(ThreadRaceError, match="overwrites what thread .* read from shared s"):
        _interp(main, torch.randn(N))


def test_read_of_atomics_in_the_same_stretch_is_reported():
    @T.prim_func
    def main(X: T.Tensor((N,), "float32"), Y: T.Tensor((N,), "float32")):
        with T.Kernel(1, threads=N):
            tx = T.get_thread_binding()
            total = T.alloc_shared((1,), "float32")
            if tx == 0:
                total[0] = 0
            T.sync_threads()
            if tx >= 0:
                T.atomic_add(total[0], X[tx])
                Y[tx] = total[0]  # other threads may not have added yet
    with pytest.raises(ThreadRaceError, match="several threads' atomics"):
        _interp(main, torch.randn(N))


def test_one_value_from_every_thread_then_read_is_clean():
    @T.prim_func
    def main(X: T.Tensor((N,), "float32"), Y: T.Tensor((N,), "float32")):
        with T.Kernel(1, threads=N):
            tx = T.get_thread_binding()
            s = T.alloc_shared((4,), "float32")
            if tx >= 0:
                s[1] = X[3]  # every thread stores the same value, as on a GPU
                Y[tx] = s[1] + tx
    x = torch.randn(N)
    np.testing.assert_allclose(_interp(main, x).numpy(), x[3].item() + np.arange(N), rtol=1e-6)


def test_different_values_to_one_shared_element_in_two_statements_race():
    @T.prim_func
    def main(X: T.Tensor((N,), "float32"), Y: T.Tensor((N,), "float32")):
        with T.Kernel(1, threads=N):
            tx = T.get_thread_binding()
            s = T.alloc_shared((N,), "float32")
            if tx >= 0:
                s[tx] = X[tx]
                s[(tx + 1) % N] = X[tx] + 1  # a neighbour's element, another value
            T.sync_threads()
            Y[tx] = s[tx]
    with pytest.raises(ThreadRaceError, match="writes what thread"):
        _interp(main, torch.randn(N))


def lone_atomics(plain_after: bool):
    """Threads ``2k`` and ``2k + 1`` update bin ``k`` one after the other, in two statements of
    one thread map (a loop over the threads' two turns, as a histogram over several inputs per
    thread does), in one branch: in each turn a bin has one updater.  Several threads' atomics on one
    element are no race; a plain store after another thread's atomic is."""
    @T.prim_func
    def main(X: T.Tensor((N,), "int32"), Y: T.Tensor((N // 2,), "int32")):
        with T.Kernel(1, threads=N):
            tx = T.get_thread_binding()
            h = T.alloc_shared((N // 2,), "int32")
            if tx < N // 2:
                h[tx] = 0
            T.sync_threads()
            if tx < N:  # one statement: TileLang inserts no barrier inside it
                for turn in T.serial(2):
                    if tx % 2 == turn:
                        T.atomic_add(h[tx // 2], X[tx])
                if plain_after and tx % 2 == 0:
                    h[tx // 2] = 7  # the racing store
            T.sync_threads()
            if tx < N // 2:
                Y[tx] = h[tx]
    return main


def test_one_thread_atomic_then_another_is_no_race():
    x = torch.randint(-9, 9, (N,), dtype=torch.int32)
    y = torch.zeros(N // 2, dtype=torch.int32)
    tilelang.compile(lone_atomics(False), target="interp")(x, y)
    np.testing.assert_array_equal(y.numpy(), x.numpy().reshape(-1, 2).sum(1))


def test_plain_store_after_another_threads_atomic_is_reported():
    x = torch.randint(-9, 9, (N,), dtype=torch.int32)
    with pytest.raises(ThreadRaceError, match=r"thread \d+ writes what .* wrote to shared h\["):
        tilelang.compile(lone_atomics(True), target="interp")(x, torch.zeros(N // 2, dtype=torch.int32))
