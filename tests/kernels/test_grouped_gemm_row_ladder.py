"""The host grouped GEMMs' row ladder (``row_step``): a tile multiplies only its used rows,
rounded up to a multiple of ``row_step``.  Checked on the CPU backend against float64 torch,
with garbage in the padding rows of A and NaN-poisoned outputs: a skipped row that holds an
expert's token, or a ladder step that picks too few rows, leaves NaN or a wrong value."""
import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kernforge
from kernforge.kernels import grouped_gemm as G
from tests.conftest import backend_param

CPU = [backend_param("cpu")]


def _contiguous(backend, m_indices, groups, n, k, seed, **tiles):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m_indices.numel(), k, generator=g)
    a[m_indices < 0] = 1e4  # padding rows hold garbage; D must still be 0 there
    a, b = a.bfloat16(), torch.randn(groups, n, k, generator=g).bfloat16()
    kernel = kernforge.compile(G.m_grouped_gemm_nt_contiguous, backend=backend, num_groups=groups, N=n, K=k,
                               num_stages=1, **tiles)
    d = torch.full((a.shape[0], n), float("nan"), dtype=torch.bfloat16)
    kernel(a, b, m_indices, d)
    expected = G.reference(a, b, m_indices)
    G.assert_close(d, expected, G.error_bound(a, b, m_indices, expected))
    assert torch.all(d[m_indices < 0] == 0)


@pytest.mark.parametrize("backend", CPU)
def test_contiguous_ladder_every_step(backend):
    """Experts of 1..32 rows in 32-row tiles with 8-row steps: every ladder size is taken, and
    exactly a multiple of the step (8, 16, 24, 32 used rows) as well as one row past it."""
    rows = [1, 8, 9, 16, 17, 24, 25, 31, 32, 0, 5]
    m_indices = G.contiguous_layout(rows, 32)
    _contiguous(backend, m_indices, len(rows), 40, 72, 0, block_M=32, block_N=32, block_K=32, row_step=8)


@pytest.mark.parametrize("backend", CPU)
def test_contiguous_ladder_padding_inside_a_tile(backend):
    """A padding row between two expert rows (the ops layer allows it) is zero, and the rows after
    it are still multiplied: the ladder follows the tile's last expert row, not its first padding."""
    m_indices = torch.tensor([0] * 3 + [-1] * 4 + [0] * 2 + [-1] * 7 + [1, -1, -1, 1] + [-1] * 12, dtype=torch.int32)
    _contiguous(backend, m_indices, 2, 16, 40, 1, block_M=16, block_N=16, block_K=16, row_step=4)


@pytest.mark.parametrize("backend", CPU)
def test_contiguous_ladder_ragged_m(backend):
    """M not a multiple of the tile: the last tile's rows past M are neither read nor counted."""
    m_indices = torch.tensor([0] * 16 + [1] * 13, dtype=torch.int32)  # M = 29, tiles of 16
    _contiguous(backend, m_indices, 2, 24, 33, 2, block_M=16, block_N=16, block_K=16, row_step=4)


@pytest.mark.parametrize("backend", CPU)
def test_masked_ladder(backend):
    """Masked layout: rows below masked_m match float64 torch, rows past it stay poisoned, for counts
    at, just past and beyond the tile (several row tiles per group), and 0."""
    masked, n, k, max_m = [0, 1, 8, 9, 16, 17, 35], 24, 40, 40
    g = torch.Generator().manual_seed(3)
    groups = len(masked)
    a = torch.randn(groups, max_m, k, generator=g).bfloat16()
    b = torch.randn(groups, n, k, generator=g).bfloat16()
    kernel = kernforge.compile(G.m_grouped_gemm_nt_masked, backend=backend, num_groups=groups, N=n, K=k,
                               block_M=16, block_N=16, block_K=16, num_stages=1, row_step=8)
    d = torch.full((groups, max_m, n), float("nan"), dtype=torch.bfloat16)
    kernel(a, b, torch.tensor(masked, dtype=torch.int32), d)
    for grp, rows in enumerate(masked):
        e = a[grp, :rows].double() @ b[grp].double().T
        G.assert_close(d[grp, :rows], e, G.error_bound(a[grp, :rows], b[grp:grp + 1],
                                                       torch.zeros(rows, dtype=torch.int32), e))
        assert torch.isnan(d[grp, rows:].float()).all()


def test_row_step_must_divide_the_tile():
    with pytest.raises(ValueError, match="row_step"):
        G.m_grouped_gemm_nt_contiguous(num_groups=1, N=16, K=16, block_M=32, row_step=12)
    with pytest.raises(ValueError, match="row_step"):
        G.m_grouped_gemm_nt_masked(num_groups=1, N=16, K=16, block_M=32, row_step=-1)


_PAIR = dict(block_M=16, block_N=16, block_K=16, row_step=4, row_tiles=2)


@pytest.mark.parametrize("backend", CPU)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(segments=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 40)), min_size=1, max_size=7),
       cut=st.integers(0, 15), seed=st.integers(0, 2 ** 16))
def test_contiguous_two_row_tiles(backend, segments, cut, seed):
    """``row_tiles=2``: a block's two 16-row tiles hold one expert (its GEMM spans both), two
    experts (one GEMM and B tile each), an expert then padding, or padding then an expert; the same
    expert may start again in the next aligned segment (padding rows inside its span), and M may
    end inside a tile (``cut`` rows off the last one).  A is read in place where the rows lie inside
    A and copied where they do not."""
    ids = []
    for expert, rows in segments:
        ids += [expert] * rows + [-1] * (-rows % 16)
    ids = ids[:max(1, len(ids) - cut)] if ids else [-1]
    _contiguous(backend, torch.tensor(ids, dtype=torch.int32), 3, 24, 40, seed, **_PAIR)


def test_two_row_tiles_need_the_ladder():
    with pytest.raises(ValueError, match="row_tiles"):
        G.m_grouped_gemm_nt_contiguous(num_groups=1, N=16, K=16, block_M=16, row_tiles=2)
    with pytest.raises(ValueError, match="row_tiles"):
        G.m_grouped_gemm_nt_contiguous(num_groups=1, N=16, K=16, block_M=16, row_step=4, row_tiles=3)


def test_ladder_reads_a_in_place_when_its_rows_lie_inside_a():
    """Each rung's A copy feeds only its GEMM, so the layout pass lets the GEMM read A where it is
    when the rung's rows lie inside A (the test the copy would make), and keeps the copy for a tile
    cut by M.  The expert's B tile is read in place as before."""
    from kernforge.backends.cpu.renderer import CpuRenderer
    from kernforge.codegen.renderer import Target
    kern = G.m_grouped_gemm_nt_contiguous(num_groups=3, N=32, K=64, num_stages=1, **_PAIR)
    src = CpuRenderer().render(kern.ir, Target("cpu", "avx512bf16")).source  # source only: any machine
    calls = re.findall(r"kf::gemm<[^>]*>\(\((\w+) \+", src)
    rungs = (1 + 8) + (1 + 4)  # each tile's ladder: 2 rows, then 4, 8, ... its 32 or 16 rows
    assert calls.count("A") == rungs and calls.count("A_shared") == rungs  # guarded: in place, else copied
    # each in-place call is guarded by its own rows lying inside A: start row + rows <= M
    guarded = re.findall(r"if \(\((.+?) <= M\)\) \{\n\s*kf::gemm<float, (\d+), [^>]*>"
                         r"\(\(A \+ \(int64_t\)(.+?) \* 64 ", src)
    assert len(guarded) == rungs
    for bound, rows, start in guarded:
        assert eval(bound, {"by": 5}) == eval(start, {"by": 5}) + int(rows)  # noqa: S307 - the kernel's own text
    assert "B_shared" not in src and "B_second" not in src
