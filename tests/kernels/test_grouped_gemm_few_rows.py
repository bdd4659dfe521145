"""The CPU grouped GEMMs' decode-sized work: the few-row bf16 micro-kernel (``kf/gemm_rows.h``,
K-major A and B read in place), the row ladder's small rungs that reach it, and the grid order
that splits ragged experts evenly over threads (``n_splits``).

Against float64 torch with NaN-poisoned outputs and garbage in A's padding rows: a row the
ladder skips, a column or K element the micro-kernel drops or reads twice, or a block the grid
order loses leaves NaN or a wrong value."""
import functools
import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kernforge
import kernforge.dsl as T
from kernforge.backends.cpu import isa
from kernforge.kernels import grouped_gemm as G
from kernforge.kernels.grouped_gemm.kernel import _blocks, _grid, _row_ladder
from tests.conftest import backend_param

CPU = [backend_param("cpu")]
BF16_PATH = pytest.mark.skipif("avx512bf16" not in isa.compiler_paths(),
                               reason="the few-row micro-kernel is the AVX512-BF16 path; the compiler does not target it")

# (M, N, K, clear_accum): rows 1..17 (the 4-, 2- and 1-row strips, the single row's two K chains)
# and 32 (the largest few-row GEMM) against 33 (gemm_bf16_nt), N with 16-, 8- and 4-column tails
# and a single column, K with 32-element tails below and above 32 past a 64 step
SHAPES = ((1, 20, 100, False), (2, 36, 48, True), (3, 7, 31, False), (5, 16, 64, False), (9, 33, 72, True),
          (17, 1, 40, False), (32, 24, 96, False), (33, 20, 40, False))
MM, NN, KK = 33, 36, 100


@functools.lru_cache(maxsize=None)
def _nt_gemms():
    """One kernel, one GEMM per shape on windows of one A and one B, each called twice (the second
    call adds to the first's C, or with ``clear_accum`` replaces it).  A and B are read in place:
    rows ``KK`` apart, so the micro-kernel also sees a row stride wider than its K."""
    @T.prim_func
    def gemms(A: T.Tensor((MM, KK), "bfloat16"), B: T.Tensor((NN, KK), "bfloat16"),
              C: T.Tensor((len(SHAPES), MM, NN), "float32")):
        with T.Kernel(1, threads=128) as bx:
            for i, (m, n, k, clear) in enumerate(SHAPES):
                C_l = T.alloc_fragment((m, n), "float32")
                T.clear(C_l)
                for _ in T.serial(2):
                    A_s = T.alloc_shared((m, k), "bfloat16")
                    B_s = T.alloc_shared((n, k), "bfloat16")
                    T.copy(A[0, 0], A_s)
                    T.copy(B[0, 0], B_s)
                    T.gemm(A_s, B_s, C_l, transpose_B=True, clear_accum=clear)
                T.copy(C_l, C[i, 0, 0])
    return kernforge.compile(gemms, backend="cpu", arch="avx512bf16")


@BF16_PATH
@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("seed", [0, 1])
def test_few_row_gemm_matches_float64(backend, seed):
    kernel = _nt_gemms()
    # every shape reaches the nt GEMM (A K-contiguous, B K-contiguous: B_RS = 1), so M <= 32 runs
    # gemm_bf16_rows and M = 33 gemm_bf16_nt's packing
    calls = re.findall(r"kf::gemm<float, (\d+), (\d+), (\d+), \d+, 1, 1, \d+,", kernel.get_kernel_source())
    assert [tuple(map(int, c)) for c in calls] == [s[:3] for s in SHAPES]
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(MM, KK, generator=g).bfloat16()
    b = (torch.randn(NN, KK, generator=g) * 4).bfloat16()
    c = torch.full((len(SHAPES), MM, NN), float("nan"))
    kernel(a, b, c)
    for i, (m, n, k, clear) in enumerate(SHAPES):
        want = (1 if clear else 2) * (a[:m, :k].double() @ b[:n, :k].double().T)
        bound = 2 * (k + 2) * 2.0 ** -24 * (a[:m, :k].double().abs() @ b[:n, :k].double().abs().T) + 1e-30
        assert ((c[i, :m, :n].double() - want).abs() <= bound).all(), f"shape {(m, n, k)}"
        assert torch.isnan(c[i, m:]).all() and torch.isnan(c[i, :, n:]).all()


def test_row_ladder_rungs():
    """Powers of two below the step, then its multiples; each rung paired with the one before it."""
    assert _row_ladder(64, 16) == [(0, 2), (2, 4), (4, 8), (8, 16), (16, 32), (32, 48), (48, 64)]
    assert _row_ladder(12, 3) == [(0, 2), (2, 3), (3, 6), (6, 9), (9, 12)]
    assert _row_ladder(4, 4) == [(0, 2), (2, 4)]


@pytest.mark.parametrize("groups", [0, 3])
@pytest.mark.parametrize("n_splits", [1, 2, 4])
def test_grid_visits_every_block_once_in_runs_of_n_tiles(n_splits, groups):
    """Walked as the CPU walks it (last dimension outermost), the grid gives every (N tile, row tile,
    group) once, and the first 1 / n_splits of the walk is that share of the N tiles with every row
    tile and group: the first guided chunk of an ``n_splits``-thread team."""
    n_tiles, rows = 8, 5
    dims = _grid(n_tiles, rows, n_splits, groups)
    walk = []
    for outer in range(dims[-1]):
        for mid in range(dims[1] if groups else 1):
            for inner in range(dims[0]):
                ids = (inner, mid, outer) if groups else (inner, outer)
                walk.append(_blocks(ids, n_tiles, rows, n_splits, groups))
    everything = {(n, m, g) if groups else (n, m) for n in range(n_tiles) for m in range(rows)
                  for g in range(groups or 1)}
    assert len(walk) == len(everything) and set(walk) == everything
    first = walk[:len(walk) // n_splits]
    assert {b[0] for b in first} == set(range(n_tiles // n_splits))
    assert {b[1:] for b in first} == {b[1:] for b in everything}


def test_n_splits_must_divide_the_n_tiles():
    with pytest.raises(ValueError, match="n_splits"):
        G.m_grouped_gemm_nt_contiguous(num_groups=2, N=48, K=16, block_M=16, block_N=16, n_splits=2)
    with pytest.raises(ValueError, match="n_splits"):
        G.m_grouped_gemm_nt_masked(num_groups=2, N=32, K=16, block_M=16, block_N=16, n_splits=0)


# 12-row tiles in 3-row steps (rungs 2, 3, 6, 9, 12; two tiles: 2, 3, 6, ... 24), so the ladder hands
# the micro-kernel odd row counts as well as even ones; N and K with tails inside the tiles
_TILES = dict(block_M=12, block_N=20, block_K=40, num_stages=1, row_step=3)
_ROWS = st.sampled_from([0, 0, 1, 2, 3, 4, 9, 11, 12, 13, 17, 24, 25, 30])


@functools.lru_cache(maxsize=None)
def _contiguous(groups: int, n: int, k: int):
    return kernforge.compile(G.m_grouped_gemm_nt_contiguous, backend="cpu", num_groups=groups, N=n, K=k,
                             row_tiles=2, n_splits=3, **_TILES)


@pytest.mark.parametrize("backend", CPU)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(_ROWS, min_size=1, max_size=6), seed=st.integers(0, 2 ** 16))
def test_contiguous_few_rows(backend, rows, seed):
    """Experts of 0 (empty), 1, 3, 9, 17... rows, aligned to the 12-row tile: every expert row
    matches float64 torch, padding rows are 0 whatever A holds; the N tiles in 3 runs."""
    groups, n, k = 3, 60, 88
    ids = []
    for i, r in enumerate(rows):
        ids += [i % groups] * r + [-1] * (-r % 12)
    m_indices = torch.tensor(ids or [-1] * 12, dtype=torch.int32)
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m_indices.numel(), k, generator=g)
    a[m_indices < 0] = 1e4
    a, b = a.bfloat16(), torch.randn(groups, n, k, generator=g).bfloat16()
    d = torch.full((a.shape[0], n), float("nan"), dtype=torch.bfloat16)
    _contiguous(groups, n, k)(a, b, m_indices, d)
    want = G.reference(a, b, m_indices)
    G.assert_close(d, want, G.error_bound(a, b, m_indices, want))
    assert torch.all(d[m_indices < 0] == 0)


@functools.lru_cache(maxsize=None)
def _masked(groups: int, n: int, k: int):
    return kernforge.compile(G.m_grouped_gemm_nt_masked, backend="cpu", num_groups=groups, N=n, K=k,
                             n_splits=3, **_TILES)


@pytest.mark.parametrize("backend", CPU)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(masked=st.lists(st.sampled_from([0, 1, 3, 9, 12, 17, 29, 30]), min_size=4, max_size=4),
       seed=st.integers(0, 2 ** 16))
def test_masked_few_rows(backend, masked, seed):
    """masked_m from 0 to max_m (30: a group's last tile cut inside its ladder): rows below it match
    float64 torch, rows at or past it stay poisoned; the N tiles in 3 runs."""
    groups, max_m, n, k = 4, 30, 60, 88
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(groups, max_m, k, generator=g).bfloat16()
    b = torch.randn(groups, n, k, generator=g).bfloat16()
    d = torch.full((groups, max_m, n), float("nan"), dtype=torch.bfloat16)
    _masked(groups, n, k)(a, b, torch.tensor(masked, dtype=torch.int32), d)
    for grp, rows in enumerate(masked):
        want = a[grp, :rows].double() @ b[grp].double().T
        G.assert_close(d[grp, :rows], want, G.error_bound(a[grp, :rows], b[grp:grp + 1],
                                                          torch.zeros(rows, dtype=torch.int32), want))
        assert torch.isnan(d[grp, rows:].float()).all()


def test_cpu_config_splits_the_n_tiles_per_thread_and_gpus_do_not():
    """The CPU's masked chooser gives one run of N tiles per thread when the runs are whole, one run
    at one thread; the contiguous one keeps one run (the row tiles outermost: A reused across N
    tiles); CUDA keeps N tiles first (blockIdx.x), so its sources are unchanged."""
    assert G.choose_masked("cpu", 4, 2048, 2048, 9, threads=2)["n_splits"] == 2
    assert G.choose_masked("cpu", 4, 2048, 2048, 9)["n_splits"] == 1
    assert G.choose_masked("cpu", 4, 384, 2048, 9, threads=2)["n_splits"] == 1  # 3 N tiles
    assert G.choose("cpu", 4, 2048, 2048)["n_splits"] == 1
    assert "n_splits" not in G.choose("cuda", 4, 2048, 2048)
    assert "n_splits" not in G.choose_masked("cuda", 4, 2048, 2048, 9, threads=2)


@pytest.mark.parametrize("backend", ["interp"])
def test_n_splits_on_the_interpreter(backend):
    """The grid order is a host schedule; any backend still computes the same D with it."""
    rows, n, k = [5, 0, 17], 24, 40
    m_indices = G.contiguous_layout(rows, 16)
    g = torch.Generator().manual_seed(7)
    a = torch.randn(m_indices.numel(), k, generator=g)
    a[m_indices < 0] = 1e4
    a, b = a.bfloat16(), torch.randn(len(rows), n, k, generator=g).bfloat16()
    d = torch.full((a.shape[0], n), float("nan"), dtype=torch.bfloat16)
    kernel = kernforge.compile(G.m_grouped_gemm_nt_contiguous, backend=backend, num_groups=len(rows), N=n, K=k,
                               block_M=16, block_N=8, block_K=16, num_stages=1, n_splits=3)
    kernel(a, b, m_indices, d)
    want = G.reference(a, b, m_indices)
    G.assert_close(d, want, G.error_bound(a, b, m_indices, want))
    assert torch.all(d[m_indices < 0] == 0)
