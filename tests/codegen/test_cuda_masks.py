"""CUDA edge masks come from the shared mask logic of ``codegen/passes/masks.py`` (the CPU's
``lower_copies`` uses the same functions with a stronger prover), and ragged tiles still run
correctly on the host emulator."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import kernforge
import kernforge.dsl as T
from kernforge import dtypes
from kernforge.backends.cuda.renderer import render_cuda
from kernforge.codegen import ir
from kernforge.codegen.passes import masks, ranges
from kernforge.codegen.printer import format_expr


def ragged(bm=16, bn=24, dtype="float32"):
    """Tiles of a symbolic ``(M, N)`` matrix through a fragment (scalar copies, masked on both
    dimensions) and a shared tile with rows too short for 16-byte cp.async."""
    M, N = T.symbolic("M"), T.symbolic("N")

    @T.prim_func
    def kf_ragged(X: T.Tensor((M, N), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=64) as (bx, by):
            F = T.alloc_fragment((bm, bn), dtype)
            S = T.alloc_shared((bm, 3), dtype)
            T.copy(X[by * bm, bx * bn], F)
            T.copy(X[by * bm, bx * bn], S)
            for i, j in T.Parallel(bm, bn):
                F[i, j] = F[i, j] * 2.0 + S[i, j % 3]
            T.copy(F, Y[by * bm, bx * bn])
    return kf_ragged


def _regions(k: ir.Kernel):
    for n in ir.walk(k.body):
        if isinstance(n, ir.Copy):
            yield n.src
            yield n.dst
        elif isinstance(n, ir.Fill):
            yield n.dst


def test_cuda_masks_are_the_shared_element_masks(monkeypatch):
    """Every bounds test in the CUDA source is one the shared ``element_mask`` built; with the
    shared edge analysis reporting no edges, the CUDA source has no bounds test left."""
    made = []
    real = masks.element_mask

    def spy(region, indices, bounds, upper_first=False):
        out = real(region, indices, bounds, upper_first)
        if out is not None:
            made.append((region, out))
        return out

    monkeypatch.setattr(masks, "element_mask", spy)
    src = render_cuda(ragged().ir, "sm_80").source
    assert {r.buffer.name for r, _ in made} == {"X", "Y"}
    assert "< M" in src and "< N" in src
    monkeypatch.setattr(masks, "edge_conditions", lambda region, bounds: [])
    unmasked = render_cuda(ragged().ir, "sm_80").source
    assert "< M" not in unmasked and "< N" not in unmasked


def test_cuda_and_cpu_share_edge_conditions_with_their_own_provers():
    """CUDA's constant-shape prover tests every dimension the range prover tests (it is weaker,
    never unsound), and the conditions are built alike: ``idx >= 0`` / ``idx < dim``."""
    k = ragged().ir
    table = ranges.var_ranges(k)
    cpu, cuda = masks.RangeBounds(table), masks.ConstBounds(ranges.nonneg_vars(k))
    seen = 0
    for r in _regions(k):
        c_edges = {d: (lo, hi) for d, lo, hi in masks.edge_conditions(r, cpu)}
        g_edges = {d: (lo, hi) for d, lo, hi in masks.edge_conditions(r, cuda)}
        for d, (lo, hi) in c_edges.items():
            assert d in g_edges and (g_edges[d][0] or not lo) and (g_edges[d][1] or not hi)
        if r.buffer.scope == ir.Scope.GLOBAL:
            idx = tuple(ir.Var(f"i{d}") for d in range(r.buffer.ndim))
            text = format_expr(masks.element_mask(r, idx, cuda, upper_first=True))
            assert "(i0 < M)" in text and "(i1 < N)" in text
            seen += 1
    assert seen == 3


def test_const_bounds_drop_a_test_only_for_constant_tiles_inside_constant_shapes():
    X = ir.Buffer("X", (ir.const(64), ir.const(48)), dtypes.float32, ir.Scope.GLOBAL)
    b = ir.Var("b")
    inside = ir.Region(X, (ir.const(16), ir.const(0)), (16, 48))
    assert masks.edge_conditions(inside, masks.ConstBounds()) == []
    edge = ir.Region(X, (ir.binary(ir.Op.MUL, b, 16), ir.const(40)), (16, 16))
    # b * 16 is not proven non-negative without knowing b; 40 + 16 > 48 needs an upper test only
    assert masks.edge_conditions(edge, masks.ConstBounds()) == [(0, True, True), (1, False, True)]
    assert masks.edge_conditions(edge, masks.ConstBounds({b})) == [(0, False, True), (1, False, True)]
    # the range prover knows b's range and proves what the constant prover cannot
    assert masks.edge_conditions(edge, masks.RangeBounds({b: (0, 3)})) == [(1, False, True)]
    assert masks.tile_mask(edge, masks.RangeBounds({b: (0, 3)})) is not None


@pytest.fixture(scope="module")
def emu():
    from kernforge import backends

    try:
        backends.get("cuda-emu")
    except backends.BackendError as e:
        pytest.skip(f"cuda-emu backend unavailable: {e}")


def test_ragged_tiles_run_correctly_on_the_emulator(emu):
    k = kernforge.compile(ragged(), backend="cuda-emu", arch="sm_80")
    rng = np.random.default_rng(3)
    for M, N in ((37, 50), (16, 24), (5, 7)):
        x = rng.standard_normal((M, N)).astype(np.float32)
        y = np.full((M, N), np.nan, np.float32)
        xt, yt = torch.from_numpy(x), torch.from_numpy(y)
        k(xt, yt)
        pad = np.zeros((-(-M // 16) * 16, -(-N // 24) * 24), np.float32)
        pad[:M, :N] = x
        s = np.zeros_like(pad)
        for by in range(pad.shape[0] // 16):
            for bx in range(pad.shape[1] // 24):
                tile = pad[by * 16:(by + 1) * 16, bx * 24:(bx + 1) * 24]
                s[by * 16:(by + 1) * 16, bx * 24:(bx + 1) * 24] = tile * 2 + tile[:, np.arange(24) % 3]
        np.testing.assert_allclose(yt.numpy(), s[:M, :N], rtol=1e-6)
