"""TileLang's safe global accesses (kernforge.codegen.passes.safe_access).

A store past the end of a global tensor is skipped and a load there reads 0 in a program
traced through the TileLang surface (the eager ``T.jit``, ``kernforge.tilelang``); accesses the
pass proves in bounds stay unguarded; kernforge's own ``@T.prim_func`` keeps reporting an
out-of-bounds access.  The outputs live inside larger tensors filled with a sentinel, so a
store that escaped its guard shows up (instead of corrupting memory).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import kernforge
import kernforge.dsl as KT
import kernforge.tilelang as tilelang
import kernforge.tilelang.language as T
from kernforge import backends
from kernforge.codegen import ir
from kernforge.codegen.passes.safe_access import safe_access

SENTINEL = -777.0


@T.jit
def shifted_add(A, B, blk: int = 128, shift: int = 0):
    """``B[r] = A[r + shift] + 1`` for every ``r`` of the block's tile: rows past ``M`` are
    stored, rows past ``A``'s end are read, whenever ``blk`` does not divide ``M``."""
    M, N = T.const("M, N")
    A: T.Tensor((M, N), T.float32)
    B: T.Tensor((M, N), T.float32)
    with T.Kernel(T.ceildiv(M, blk), threads=32) as bx:
        for i, j in T.Parallel(blk, N):
            B[bx * blk + i, j] = A[bx * blk + i + shift, j] + 1.0


@T.jit
def guarded_by_author(A, B, blk: int = 64):
    M = T.const("M")
    A: T.Tensor((M,), T.float32)
    B: T.Tensor((M,), T.float32)
    with T.Kernel(T.ceildiv(M, blk), threads=32) as bx:
        for i in T.Parallel(blk):
            if bx * blk + i < M:
                B[bx * blk + i] = A[bx * blk + i] * 2.0


@T.jit
def atomic_rows(A, S, blk: int = 64):
    M = T.const("M")
    A: T.Tensor((M,), T.float32)
    S: T.Tensor((M,), T.float32)
    with T.Kernel(T.ceildiv(M, blk), threads=32) as bx:
        for i in T.Parallel(blk):
            T.atomic_add(S[bx * blk + i], A[bx * blk + i] + 1.0)


def _guards(kernel: ir.Kernel) -> tuple[int, int]:
    """(ifs, selects) in ``kernel``'s body."""
    n = list(ir.nodes(kernel.body))
    return sum(isinstance(x, ir.If) for x in n), sum(isinstance(x, ir.Select) for x in n)


def _padded(M, N, extra=256 * 8):
    """An (M, N) view at the start of a larger sentinel-filled tensor (room for every row a
    tile could reach past the end, so an unguarded access fails the test, not the process)."""
    big = torch.full((M * N + extra,), SENTINEL)
    return big, big[:M * N].view(M, N)


def _skip_unless(name):
    if name != "interp":
        from tests.conftest import host_backend_skip_reason

        reason = host_backend_skip_reason(name)
        if reason:
            pytest.skip(reason)


@pytest.mark.parametrize("name", ["interp", "cpu", "cuda-emu"])
@pytest.mark.parametrize("M,N,blk,shift", [(100, 3, 128, 0), (70, 2, 32, 5), (64, 4, 64, 1)])
def test_out_of_range_stores_skip_and_loads_read_zero(name, M, N, blk, shift):
    _skip_unless(name)
    torch.manual_seed(M + shift)
    big_a, a = _padded(M, N)  # an unguarded load past the end would read the sentinel
    a.copy_(torch.randn(M, N))
    big, b = _padded(M, N)
    k = shifted_add.compile(M=M, N=N, blk=blk, shift=shift, backend=name)
    k(a, b)
    want = torch.zeros(M, N, dtype=torch.float64)
    want[:M - shift] = a[shift:].double()
    want += 1.0
    np.testing.assert_allclose(b.double().numpy(), want.numpy(), rtol=1e-6, atol=1e-6)
    assert (big[M * N:] == SENTINEL).all(), "a store past the end was not skipped"


def test_provable_accesses_stay_unguarded():
    # 256 rows in tiles of 64: every index is bx * 64 + i <= 255, so nothing is guarded
    k = shifted_add.get_tir(M=256, N=8, blk=64).kernels[0]
    assert _guards(k) == (0, 0)
    # 100 rows in a 128-row tile: the store is guarded (an If), the load too (a select)
    k = shifted_add.get_tir(M=100, N=8, blk=128).kernels[0]
    ifs, sels = _guards(k)
    assert ifs == 1 and sels >= 2  # the load's select and its safe row index
    # an in-range tile whose load is shifted: only the load needs a guard
    k = shifted_add.get_tir(M=256, N=8, blk=64, shift=1).kernels[0]
    assert _guards(k)[0] == 0 and _guards(k)[1] >= 1
    # the author's own edge guard is a fact: no second guard under it
    k = guarded_by_author.get_tir(M=100).kernels[0]
    assert _guards(k) == (1, 0)


@pytest.mark.parametrize("name", ["interp", "cpu"])
def test_atomics_past_the_end_are_skipped(name):
    _skip_unless(name)
    a = torch.randn(50)
    big = torch.full((50 + 256,), SENTINEL)
    s = big[:50]
    s.zero_()
    atomic_rows.compile(M=50, blk=64, backend=name)(a, s)
    torch.testing.assert_close(s, a + 1)
    assert (big[50:] == SENTINEL).all()


def test_tilelang_prim_func_gets_the_guard_and_dsl_prim_func_keeps_reporting():
    def make():
        @T.prim_func
        def store_past(A: T.Tensor((10,), T.float32), B: T.Tensor((10,), T.float32)):
            with T.Kernel(1, threads=32) as bx:
                for i in T.Parallel(16):
                    B[i] = A[i] + 1.0
        return store_past

    a = torch.arange(10, dtype=torch.float32)
    out = tilelang.compile(make(), out_idx=[1], target="interp")(a)
    torch.testing.assert_close(out, a + 1)
    with pytest.raises(ir.KernelError, match="out-of-bounds"):
        kernforge.compile(make(), backend="interp", out_idx=[1])(a)


def test_the_pass_leaves_on_chip_buffers_and_tile_copies_alone():
    @KT.prim_func
    def copy_past(A: KT.Tensor((10, 4), "float32"), B: KT.Tensor((10, 4), "float32")):
        with KT.Kernel(1, threads=32) as bx:
            s = KT.alloc_shared((16, 4), "float32")
            KT.copy(A[0, 0], s)   # a tile copy masks its global edge itself
            KT.copy(s, B[0, 0])
    k = copy_past.ir
    assert safe_access(k) is k
    a = torch.randn(10, 4)
    out = kernforge.compile(copy_past, backend="interp", out_idx=[1])(a)
    torch.testing.assert_close(out, a)


@pytest.mark.parametrize("name", ["interp", "cpu", "cuda", "cuda-emu", "ascend", "ascend-emu"])
def test_every_backend_renders_the_guard(name):
    if name not in backends.names():
        pytest.skip(f"no {name} backend here")
    k = shifted_add.get_tir(M=100, N=8, blk=128, shift=3).kernels[0]
    src = backends.get(name).source(k)
    plain = backends.get(name).source(shifted_add.get_tir(M=256, N=8, blk=64).kernels[0])
    assert src != plain
    if name != "interp":  # the C-family sources: the store's if and the load's two selects
        assert "if ((((bx * 128) + i) < 100)) {" in src
        assert "(((((bx * 128) + i) + 3) < 100) ? (((bx * 128) + i) + 3) : 0)" in src
        assert "< 100) ? A" in src
