"""``T.atomic_add(..., return_prev=True)`` / ``T.atomic_max(..., return_prev=True)``: TileLang's
fetch-and-op in thread-level code, as DeepSeek V3.2's top-k selector hands out slots with it
(``ir.Atomic`` with a ``result``).  Threads adding 1 to one counter get distinct slots: per
counter, the fetched values are a permutation of ``0 .. count - 1`` on every backend, and on the
interpreter and the CPU (threads in order) exactly each thread's rank among the threads that hit
that counter before it.  Checked against numpy, on shared and on global counters."""
from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kernforge.tilelang as tilelang
import kernforge.tilelang.language as T
from kernforge.codegen import ir
from kernforge.codegen.printer import format_kernel
from kernforge.dsl.compat import UnsupportedError
from kernforge.interp.executor import _previous

BACKENDS = ["interp", "cpu", "cuda-emu"]
ORDERED = ("interp", "cpu")  # threads run in thread order: the numbering is exact


@pytest.fixture(autouse=True)
def _tune_db(monkeypatch, tmp_path):
    monkeypatch.setenv("KERNFORGE_TUNE_DB", str(tmp_path / "tune.sqlite"))


def slots(threads: int, nb: int):
    """Each thread with a key >= 0 takes a slot in its key's shared counter (``pos``) and one in
    its global counter; it stores ``pos + 1000 * global slot``.  Keys < 0 take nothing."""
    @T.prim_func
    def main(K: T.Tensor((threads,), "int32"), P: T.Tensor((threads,), "int32"),
             G: T.Tensor((nb,), "int32"), C: T.Tensor((nb,), "int32")):
        with T.Kernel(1, threads=threads):
            tx = T.get_thread_binding()
            s = T.alloc_shared((nb,), "int32")
            pos = T.alloc_var("int32")
            if tx < nb:
                s[tx] = 0
            T.sync_threads()
            if K[tx] >= 0:
                pos = T.atomic_add(s[K[tx]], 1, return_prev=True)
                P[tx] = pos + 1000 * T.atomic_add(G[K[tx]], 1, return_prev=True)
            T.sync_threads()
            if tx < nb:
                C[tx] = s[tx]
    return main


def _rank_in_key(keys: np.ndarray) -> np.ndarray:
    """Each element's number of earlier elements with the same key (numpy reference)."""
    return np.array([int(np.sum(keys[:i] == k)) for i, k in enumerate(keys)], dtype=np.int64)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fetched_slots_are_a_permutation_per_counter(backend):
    threads, nb = 128, 7
    g = torch.Generator().manual_seed(3)
    key = torch.randint(-1, nb, (threads,), generator=g, dtype=torch.int32)
    p = torch.full((threads,), -7, dtype=torch.int32)
    g0 = torch.randint(0, 5, (nb,), generator=g, dtype=torch.int32)  # global counters start anywhere
    gc, c = g0.clone(), torch.full((nb,), -9, dtype=torch.int32)
    tilelang.compile(slots(threads, nb), target=backend)(key, p, gc, c)
    k, pv = key.numpy(), p.numpy()
    count = np.bincount(k[k >= 0], minlength=nb)
    np.testing.assert_array_equal(c.numpy(), count)
    np.testing.assert_array_equal(gc.numpy(), g0.numpy() + count)
    assert (pv[k < 0] == -7).all()  # threads that take no slot leave P alone
    for b in range(nb):
        got = pv[k == b]
        np.testing.assert_array_equal(np.sort(got % 1000), np.arange(count[b]))
        np.testing.assert_array_equal(np.sort(got // 1000), g0.numpy()[b] + np.arange(count[b]))
    if backend in ORDERED:
        rank = _rank_in_key(k)[k >= 0]
        np.testing.assert_array_equal(pv[k >= 0], rank + 1000 * (g0.numpy()[k[k >= 0]] + rank))


def fetch_float(threads: int):
    """float32 fetch-add and fetch-max on one shared element, every thread in order."""
    @T.prim_func
    def main(V: T.Tensor((threads,), "float32"), A: T.Tensor((threads,), "float32"),
             M: T.Tensor((threads,), "float32"), F: T.Tensor((2,), "float32")):
        with T.Kernel(1, threads=threads):
            tx = T.get_thread_binding()
            s = T.alloc_shared((2,), "float32")
            if tx < 2:
                s[tx] = F[tx]
            T.sync_threads()
            A[tx] = T.atomic_add(s[0], V[tx], return_prev=True)
            M[tx] = T.atomic_max(s[1], V[tx], return_prev=True)
            T.sync_threads()
            if tx < 2:
                F[tx] = s[tx]
    return main


@pytest.mark.parametrize("backend", ORDERED)
def test_float_fetch_add_and_max_replay_the_thread_order(backend):
    threads = 64
    v = torch.randn(threads, generator=torch.Generator().manual_seed(5)) * 100
    a, m = torch.full((threads,), np.nan), torch.full((threads,), np.nan)
    f = torch.tensor([0.25, -1e30])
    tilelang.compile(fetch_float(threads), target=backend)(v, a, m, f)
    acc, mx = np.float32(0.25), np.float32(-1e30)
    want_a, want_m = [], []
    for x in v.numpy():  # numpy, in float32, one thread after another
        want_a.append(acc)
        want_m.append(mx)
        acc, mx = np.float32(acc + x), max(mx, x)
    np.testing.assert_array_equal(a.numpy(), np.array(want_a, np.float32))
    np.testing.assert_array_equal(m.numpy(), np.array(want_m, np.float32))
    np.testing.assert_array_equal(f.numpy(), [acc, mx])


def test_float_fetch_on_cuda_emu_is_some_order():
    """Any arrival order: the fetched maxima are prefix maxima of some order, so each is -1e30 or
    one of the values, and the final sum matches to rounding."""
    threads = 64
    v = torch.randn(threads, generator=torch.Generator().manual_seed(6))
    a, m = torch.zeros(threads), torch.zeros(threads)
    f = torch.tensor([0.0, -1e30])
    tilelang.compile(fetch_float(threads), target="cuda-emu")(v, a, m, f)
    np.testing.assert_allclose(f.numpy()[0], v.numpy().astype(np.float64).sum(), rtol=1e-5, atol=1e-4)
    assert f.numpy()[1] == v.numpy().max()
    assert set(m.numpy().tolist()) <= set(v.numpy().tolist()) | {np.float32(-1e30)}
    assert (a.numpy() == 0.0).sum() >= 1  # the first arrival saw the start value


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(-2**31, 2**31 - 1)), min_size=1, max_size=40),
       st.lists(st.integers(-2**31, 2**31 - 1), min_size=6, max_size=6))
def test_interpreter_numbering_matches_a_serial_replay(lanes, start):
    """The interpreter's vectorised fetch-add (int32, wrapping) equals one lane after another."""
    arr = np.array(start, np.int32)
    flat = np.array([e for e, _ in lanes])
    vals = np.array([x for _, x in lanes], np.int32)
    got = _previous(np.add, arr, (flat,), vals)
    cur, want = arr.astype(np.int64), []
    for e, x in lanes:
        want.append(cur[e])
        cur[e] = (cur[e] + x + 2**31) % 2**32 - 2**31
    np.testing.assert_array_equal(got, np.array(want, np.int64).astype(np.int32))


def test_fetch_outside_thread_code_is_a_typed_error():
    with pytest.raises(UnsupportedError, match=r"return_prev=True\) outside thread-level code") as e:
        @T.prim_func
        def main(C: T.Tensor((4,), "int32"), P: T.Tensor((4,), "int32")):
            with T.Kernel(1, threads=32):
                p = T.alloc_var("int32")
                p = T.atomic_add(C[0], 1, return_prev=True)
                P[0] = p
    assert e.value.loc is not None and "test_fetch_add.py" in e.value.loc.file


def test_fetch_of_a_tile_is_a_typed_error():
    with pytest.raises(ir.KernelError, match=r"return_prev=True\) of a tile"):
        @T.prim_func
        def main(C: T.Tensor((4,), "float32")):
            with T.Kernel(1, threads=32):
                tx = T.get_thread_binding()  # noqa: F841 - opens the thread region
                t = T.alloc_fragment((4,), "float32")
                T.atomic_add(C[0], t, return_prev=True)


def test_printer_and_cpu_source_show_the_fetch():
    kern = tilelang.compile(slots(64, 4), target="cpu")
    src = kern.get_kernel_source()
    assert "kf::atomic_fetch_add(&" in src  # the global counter: a real fetching atomic
    assert "kf_prev" in src  # the shared one: read, add, hand back (threads run in order)
    text = format_kernel(kern.launch.parts[0].ir)
    assert text.count("= atomic_add") == 2, text


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_cuda_source_builds_with_nvcc(tmp_path):
    """No GPU here: the CUDA sources of both kernels (int fetch-adds on shared and global, float
    fetch-add and fetch-max) build for sm_90a, each previous value from ``kf::atomic_fetch_*``."""
    from kernforge import backends
    from kernforge.backends.cuda.renderer import INCLUDE_DIR
    from kernforge.codegen.renderer import Target

    for name, f in (("slots", slots(128, 7)), ("floats", fetch_float(64))):
        src = backends.get("cuda").render(f.ir, Target("cuda", "sm_90a")).source
        assert src.count("kf::atomic_fetch_") == 2, src
        path = tmp_path / f"{name}.cu"
        path.write_text(src)
        proc = subprocess.run(["nvcc", "-arch=sm_90a", "-cubin", "-std=c++17", f"-I{INCLUDE_DIR}",
                               "-o", str(tmp_path / f"{name}.cubin"), str(path)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
