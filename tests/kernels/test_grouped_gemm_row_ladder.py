"""The host grouped GEMMs' row ladder (``row_step``): a tile multiplies only its used rows,
rounded up to a multiple of ``row_step``.  Checked on the CPU backend against float64 torch,
with garbage in the padding rows of A and NaN-poisoned outputs: a skipped row that holds an
expert's token, or a ladder step that picks too few rows, leaves NaN or a wrong value."""
import pytest
import torch

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
