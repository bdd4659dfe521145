"""Checked mode (``kernforge.compile(..., checks=True)`` / ``KERNFORGE_CHECKS=1``): the kernel bugs
the interpreter reports -- a read past a tile, a constant-index write past a tile, a read past
the end of a global tensor, an index computed at run time out of range -- raise
:class:`kernforge.CheckError` on the compiled backends too, naming the buffer, the index, the
shape and the author's line, with the interpreter's own words; correct kernels (ragged edge
tiles, whose global copies are masked by definition, and the library) give the same results
checked and unchecked; the checked CUDA source compiles with nvcc.
"""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

import kernforge
import kernforge.dsl as T
from kernforge import backends
from kernforge.codegen import ir
from kernforge.codegen.renderer import Target
from kernforge.jit.kernel import ArgumentError
from kernforge.kernels import registry
from tests.conftest import host_backends

F32 = "float32"


def _line(marker: str) -> int:
    """The line of this file carrying ``# <marker>``: where a bug kernel's author wrote the bug."""
    with open(__file__) as f:
        hits = [n for n, text in enumerate(f, 1) if text.rstrip().endswith(f"# {marker}")]
    assert len(hits) == 1, marker
    return hits[0]


# ---------------------------------------------------------------- the four bugs of issue 16


def read_past_tile(scope: str = "shared"):
    N = T.symbolic("N")
    alloc = T.alloc_shared if scope == "shared" else T.alloc_fragment

    @T.prim_func
    def main(A: T.Tensor((N,), F32), B: T.Tensor((N,), F32)):
        with T.Kernel(T.ceildiv(N, 32), threads=32) as bx:
            t = alloc((32,), F32)
            T.copy(A[bx * 32], t)
            for i in T.Parallel(32):
                B[bx * 32 + i] = t[i + 1] * 2.0  # BUG-read-tile
    return main


def const_write_past_tile():
    N = T.symbolic("N")

    @T.prim_func
    def main(A: T.Tensor((N,), F32), B: T.Tensor((N,), F32)):
        with T.Kernel(T.ceildiv(N, 32), threads=32) as bx:
            t = T.alloc_shared((32,), F32)
            T.copy(A[bx * 32], t)
            t[32] = 1.0  # BUG-const-write
            T.copy(t, B[bx * 32])
    return main


def read_past_global():
    N = T.symbolic("N")

    @T.prim_func
    def main(A: T.Tensor((N,), F32), B: T.Tensor((N,), F32)):
        with T.Kernel(T.ceildiv(N, 32), threads=32) as bx:
            for i in T.Parallel(32):
                if bx * 32 + i < N:
                    B[bx * 32 + i] = A[bx * 32 + i + 1]  # BUG-read-global
    return main


def runtime_index():
    """A gather whose column index comes from memory: ``A[r, K]`` lies inside A's storage (the
    next row), so only a per-dimension test sees it."""
    M, K = T.symbolic("M"), T.symbolic("K")

    @T.prim_func
    def main(A: T.Tensor((M, K), F32), I: T.Tensor((M, K), "int32"), B: T.Tensor((M, K), F32)):
        with T.Kernel(T.ceildiv(K, 8), T.ceildiv(M, 4), threads=32) as (bx, by):
            for i, j in T.Parallel(4, 8):
                if (by * 4 + i < M) & (bx * 8 + j < K):
                    B[by * 4 + i, bx * 8 + j] = A[by * 4 + i, I[by * 4 + i, bx * 8 + j]]  # BUG-runtime-index
    return main


def _inputs(n=70, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(n).astype(np.float32), np.full(n, np.nan, np.float32)


def _gather_inputs(bad, m=6, k=13, seed=1):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype(np.float32)
    idx = rng.integers(0, k, size=(m, k)).astype(np.int32)
    idx[bad[0], bad[1]] = bad[2]
    return a, idx, np.full((m, k), np.nan, np.float32)


# (name, factory, inputs, kind, buffer, index, shape, marker)
BUGS = [
    ("read_past_shared_tile", lambda: read_past_tile("shared"), _inputs, "read", "t", [32], (32,), "BUG-read-tile"),
    ("read_past_fragment", lambda: read_past_tile("fragment"), _inputs, "read", "t", [32], (32,), "BUG-read-tile"),
    ("const_write_past_tile", const_write_past_tile, _inputs, "write", "t", [32], (32,), "BUG-const-write"),
    ("read_past_global", read_past_global, lambda: _inputs(70), "read", "A", [70], (70,), "BUG-read-global"),
    ("runtime_index_high", runtime_index, lambda: _gather_inputs((3, 9, 13)), "read", "A", [3, 13], (6, 13),
     "BUG-runtime-index"),
    ("runtime_index_negative", runtime_index, lambda: _gather_inputs((5, 0, -2)), "read", "A", [5, -2], (6, 13),
     "BUG-runtime-index"),
]


@pytest.mark.parametrize("backend", host_backends())
@pytest.mark.parametrize("name,factory,inputs,kind,buf,index,shape,marker", BUGS, ids=[b[0] for b in BUGS])
def test_bug_raises_check_error(backend, name, factory, inputs, kind, buf, index, shape, marker):
    kernel = kernforge.compile(factory(), backend=backend, checks=True)
    with pytest.raises(kernforge.CheckError) as info:
        kernel(*inputs())
    e = info.value
    assert (e.kind, e.buffer, list(e.index), e.shape) == (kind, buf, index, shape)
    assert e.loc is not None and e.loc.file == __file__ and e.loc.line == _line(marker), e.loc
    assert isinstance(e, ir.KernelError)
    text = str(e)
    assert text.startswith(f"{__file__}:{_line(marker)}: ") and f"{buf}{index}" in text and f"{shape}" in text


@pytest.mark.parametrize("name,factory,inputs,kind,buf,index,shape,marker", BUGS, ids=[b[0] for b in BUGS])
def test_message_is_the_interpreters(name, factory, inputs, kind, buf, index, shape, marker):
    """The compiled backends' CheckError reads exactly as the interpreter's own (unchecked) report."""
    with pytest.raises(ir.KernelError) as oracle:
        kernforge.compile(factory(), backend="interp")(*inputs())
    assert not isinstance(oracle.value, kernforge.CheckError)
    with pytest.raises(kernforge.CheckError) as checked:
        kernforge.compile(factory(), backend="cpu", checks=True)(*inputs())
    assert str(checked.value) == str(oracle.value)


def write_past_global():
    N = T.symbolic("N")

    @T.prim_func
    def main(A: T.Tensor((N,), F32), B: T.Tensor((N,), F32)):
        with T.Kernel(T.ceildiv(N, 32), threads=32) as bx:
            for i in T.Parallel(32):
                if bx * 32 + i < N:
                    B[bx * 32 + i + 1] = A[bx * 32 + i]  # BUG-write-global
    return main


@pytest.mark.parametrize("backend", host_backends())
def test_violating_store_never_lands(backend):
    """B is a view of a longer array: the unchecked kernel really writes the element past B's
    end; the checked one reports it and leaves that element alone."""
    n = 45
    a = np.random.default_rng(3).standard_normal(n).astype(np.float32)
    for checks in (False, True):
        storage = np.full(n + 1, 123.0, np.float32)
        kernel = kernforge.compile(write_past_global(), backend=backend, checks=checks)
        if not checks:
            if backend == "interp":
                with pytest.raises(ir.KernelError, match=r"out-of-bounds write B\[45\]"):
                    kernel(a, storage[:n])
                continue
            kernel(a, storage[:n])
            assert storage[n] == a[n - 1]  # the bug is real: memory past B was overwritten
            continue
        with pytest.raises(kernforge.CheckError) as info:
            kernel(a, storage[:n])
        assert (info.value.kind, info.value.buffer, info.value.index, info.value.shape) == ("write", "B", (n,), (n,))
        assert info.value.loc.line == _line("BUG-write-global")
        assert storage[n] == 123.0


# ---------------------------------------------------------------- tile-op regions


def region_kernel():
    """A copy into a shared tile at a run-time offset: past the tile when ``off > 24``."""
    N = T.symbolic("N")

    @T.prim_func
    def main(A: T.Tensor((N,), F32), B: T.Tensor((N,), F32), off: T.int32):
        with T.Kernel(1, threads=32):
            t = T.alloc_shared((32,), F32)
            T.fill(t, 0.0)
            T.copy(A[0:8], t[off])  # BUG-region
            T.copy(t, B[0])
    return main


@pytest.mark.parametrize("backend", host_backends())
def test_on_chip_region_past_its_tile(backend):
    kernel = kernforge.compile(region_kernel(), backend=backend, checks=True)
    a, b = _inputs(40)
    kernel(a, b, 24)  # the last 8 elements: inside
    want = np.zeros(32, np.float32)
    want[24:] = a[:8]
    np.testing.assert_array_equal(b[:32], want)
    with pytest.raises(kernforge.CheckError) as info:
        kernel(a, b, 25)
    e = info.value
    assert (e.kind, e.buffer, e.index, e.extents, e.shape) == ("copy into", "t", (25,), (8,), (32,))
    assert e.loc.line == _line("BUG-region") and "t[25:+8] (shape (32,))" in str(e)


def ragged_copy():
    """Global tiles past the tensor's edges: a copy reads 0 there and skips the writes (legal)."""
    M, N = T.symbolic("M"), T.symbolic("N")

    @T.prim_func
    def main(A: T.Tensor((M, N), F32), B: T.Tensor((M, N), F32)):
        with T.Kernel(T.ceildiv(N, 8), T.ceildiv(M, 16), threads=64) as (bx, by):
            s = T.alloc_shared((16, 8), F32)
            f = T.alloc_fragment((16, 8), F32)
            T.copy(A[by * 16, bx * 8], s)
            for i, j in T.Parallel(16, 8):
                f[i, j] = s[i, j] * 3.0 + 1.0
            T.copy(f, B[by * 16, bx * 8])
    return main


@pytest.mark.parametrize("backend", host_backends())
@pytest.mark.parametrize("shape", [(37, 13), (16, 8), (1, 1)])
def test_correct_kernel_same_results_checked_and_unchecked(backend, shape):
    rng = np.random.default_rng(shape[0])
    a = rng.standard_normal(shape).astype(np.float32)
    got = {}
    for checks in (False, True):
        b = np.full(shape, np.nan, np.float32)
        kernforge.compile(ragged_copy(), backend=backend, checks=checks)(a, b)
        got[checks] = b
    np.testing.assert_array_equal(got[True], got[False])
    np.testing.assert_array_equal(got[True], a * np.float32(3.0) + np.float32(1.0))  # float32 ops, rounded each


LIBRARY = sorted(registry.all_specs())


@pytest.mark.slow
@pytest.mark.parametrize("name", LIBRARY)
def test_library_kernels_checked_on_cpu(name):
    """Every library kernel, checked, passes its own reference check with results identical to
    the unchecked build's (no false positive, no change of semantics)."""
    spec = registry.all_specs()[name]
    params = spec.problems["small"].params
    outs = {}
    for checks in (False, True):
        inputs = spec.make_inputs(params, 0, "cpu")
        kernforge.compile(spec.factory, backend="cpu", checks=checks, **params)(*inputs)
        got = [inputs[i] for i in spec.outputs]
        spec.check(got, spec.reference(inputs, params), inputs, params)
        outs[checks] = got
    for x, y in zip(outs[False], outs[True]):  # bit for bit (NaN and -0.0 included)
        assert torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mla_decode", "m_grouped_gemm_nt_masked"])
def test_library_kernels_checked_on_cuda_emu(name):
    spec = registry.all_specs()[name]
    params = spec.problems["small"].params
    inputs = spec.make_inputs(params, 0, "cpu")
    kernel = kernforge.compile(spec.factory, backend="cuda-emu", checks=True, **params)
    kernel(*inputs)
    spec.check([inputs[i] for i in spec.outputs], spec.reference(inputs, params), inputs, params)


# ---------------------------------------------------------------- switching it on


def test_environment_variable_turns_it_on(monkeypatch):
    a, b = _inputs(64)
    monkeypatch.setenv("KERNFORGE_CHECKS", "1")
    kernel = kernforge.compile(read_past_tile(), backend="cpu")
    assert kernel.checks and "kf_check_fail" in kernel.get_kernel_source()
    with pytest.raises(kernforge.CheckError):
        kernel(a, b)
    assert not kernforge.compile(read_past_tile(), backend="cpu", checks=False).checks  # explicit wins
    monkeypatch.setenv("KERNFORGE_CHECKS", "0")
    off = kernforge.compile(read_past_tile(), backend="cpu")
    assert not off.checks and "kf_check" not in off.get_kernel_source()
    off(a, b)  # reads the arena past the tile: garbage, no error
    monkeypatch.setenv("KERNFORGE_CHECKS", "maybe")
    with pytest.raises(ArgumentError, match="KERNFORGE_CHECKS"):
        kernforge.compile(read_past_tile(), backend="cpu")


def test_bad_checks_argument_and_unsupported_backend(monkeypatch):
    from kernforge.backends import registry as table

    with pytest.raises(ArgumentError, match="checks must be True or False"):
        kernforge.compile(read_past_tile(), backend="cpu", checks="yes")
    monkeypatch.setattr(table, "_ENTRIES", dict(table._ENTRIES))
    monkeypatch.setattr(table, "_INSTANCES", dict(table._INSTANCES))
    backends.register("cpu-serial", "tests.backends.toy_serial.backend:SerialBackend", device="cpu", lang="c++")
    with pytest.raises(ArgumentError, match="'cpu-serial' has no checked mode"):
        kernforge.compile(read_past_tile(), backend="cpu-serial", checks=True)


@pytest.mark.parametrize("backend", ["interp", "cpu", "cuda", "cuda-emu"])
def test_off_by_default_is_todays_source(backend):
    """``Target(checks=False)`` is the default and renders no trace of checked mode; the checked
    source differs and reports its checks (the pinned digests cover the library byte for byte)."""
    k = read_past_global().ir
    b = backends.get(backend)
    plain = b.render(k, Target(backend, "sm_90a" if backend.startswith("cuda") else None))
    assert plain.checks is None and "kf_check" not in plain.source and "check #" not in plain.source
    checked = b.render(k, Target(backend, "sm_90a" if backend.startswith("cuda") else None, checks=True))
    assert checked.source != plain.source and [s.kind for s in checked.checks.values()] == ["read"]


# ---------------------------------------------------------------- CUDA: nvcc


@pytest.mark.nvcc
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("name", ["bugs", "mla_decode"])
def test_checked_cuda_source_compiles_for_sm_90a(name):
    from kernforge.backends.cuda import backend as cuda_backend

    if name == "bugs":
        kernels = [read_past_tile("fragment").ir, const_write_past_tile().ir, runtime_index().ir, region_kernel().ir]
    else:
        spec = registry.all_specs()[name]
        kernels = [spec.factory(**spec.problems["small"].params).ir]
    for k in kernels:
        report = cuda_backend.build_report(k, "sm_90a", checks=True)
        assert report["arch"] == "sm_90a" and "_checked" in report["path"], report
