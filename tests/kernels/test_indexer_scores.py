"""The indexer score kernel (`kernforge.kernels.indexer`, `ops.indexer_scores`): the engine's
former torch step is the oracle.  Within float32 rounding of float64 and of both of its modes
(tree-summed dots, pairwise heads; a matmul), on every tile; on the CPU a score's bits do not
depend on the batch, the keys beside it or the tile (the GEMM's fixed K order); +0.0 for
every zero score."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kernforge
from kernforge import ops
from kernforge.kernels import indexer as I
from kernforge.kernels.check import run_spec
from kernforge.kernels.registry import get
from kernforge.model import numerics as nx
from tests.conftest import host_backends

BACKENDS = host_backends("interp", "cpu")
TILES = [dict(block_S=1, block_N=16), dict(block_S=8, block_N=64), dict(block_S=32, block_N=64)]


def inputs(s, h, d, n, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(s, h, d, generator=g).to(dtype)
    keys = torch.randn(n, d, generator=g).to(dtype)
    w = torch.randn(s, h, generator=g).to(dtype)  # both signs: relu zeros times negative weights
    return q, keys, w, d ** -0.5 * h ** -0.5


def deterministic_oracle(q, keys, w, scale):
    with nx.deterministic():
        return I.reference(w, q, keys, scale)


def float64_oracle(q, keys, w, scale):
    return I.reference(w.double(), q.double(), keys.double(), scale)


def close(got, want):
    """float32 rounding of dots of unit-variance products (the registry's tolerance)."""
    torch.testing.assert_close(got.double(), want.double(), rtol=1e-5, atol=1e-5)


def bits(t):
    return t.contiguous().view(torch.int32)


def run_kernel(backend, q, keys, w, scale, **config):
    """The raw kernel into NaN-poisoned scores (so an element it skips shows)."""
    s, h, d = q.shape
    params = dict(I.choose.heuristic(backend, h, d, str(q.dtype)[6:], s), **config)
    scores = torch.full((s, keys.shape[0]), float("nan"))
    kernforge.compile(I.indexer_scores, backend=backend, **params)(q, keys, w, scores, scale)
    return scores


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("tile", TILES, ids=lambda t: f"{t['block_S']}x{t['block_N']}")
@pytest.mark.parametrize("s,h,d,n", [(3, 4, 64, 37), (1, 3, 37, 1), (40, 5, 100, 17), (4, 1, 1, 16)])
def test_scores_match_the_reference(backend, tile, s, h, d, n):
    """Odd heads and dims, one key, one query, ragged last query and key tiles: float32
    rounding of float64 and of both reference modes."""
    q, keys, w, scale = inputs(s, h, d, n, seed=s * 100 + n)
    got = run_kernel(backend, q, keys, w, scale, **tile)
    close(got, float64_oracle(q, keys, w, scale))
    close(got, deterministic_oracle(q, keys, w, scale))
    close(got, I.reference(w, q, keys, scale))


@pytest.mark.parametrize("backend", BACKENDS)
def test_bfloat16_inputs_within_float32_rounding_of_float64(backend):
    q, keys, w, scale = inputs(5, 4, 64, 70, torch.bfloat16, seed=3)
    got = ops.indexer_scores(q, keys, w, scale, backend=backend)
    assert got.dtype == torch.float32
    close(got, float64_oracle(q, keys, w, scale))


@pytest.mark.parametrize("backend", host_backends("cpu"))
def test_a_score_does_not_depend_on_the_batch_or_the_tile(backend):
    """The engine's deterministic rows: a query's scores alone, among others, against a prefix
    of the keys, with another tile and through the op (whose tile follows the query count)
    are the same bits: the CPU GEMM sums every output's K products in order 0..D-1."""
    q, keys, w, scale = inputs(40, 4, 64, 150, seed=4)
    full = run_kernel(backend, q, keys, w, scale)
    assert torch.equal(bits(run_kernel(backend, q[2:3], keys[:9], w[2:3], scale)), bits(full[2:3, :9]))
    for tile in TILES:
        assert torch.equal(bits(run_kernel(backend, q, keys, w, scale, **tile)), bits(full))
    alone = ops.indexer_scores(q[33:34].contiguous(), keys, w[33:34].contiguous(), scale, backend=backend)
    few = ops.indexer_scores(q[30:40].contiguous(), keys, w[30:40].contiguous(), scale, backend=backend)
    assert torch.equal(bits(alone), bits(full[33:34])) and torch.equal(bits(few), bits(full[30:40]))


def test_the_tile_follows_the_query_count():
    """Decode rows get one query a block (no padded GEMM rows), prefill slices 32."""
    assert [I.config.row_block(r) for r in (1, 7, 8, 31, 32, 128, None)] == [1, 1, 8, 8, 32, 32, 32]
    assert I.choose.heuristic("cpu", 4, 64, "float32", 1)["block_S"] == 1
    assert I.choose.heuristic("cuda", 64, 128, "bfloat16", 128)["block_S"] == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_scores_are_positive_zero(backend):
    """Zero queries, and relu zeros times negative weights: every score is +0.0 (topk ranks
    -0.0 below +0.0; the reference's sort calls them a tie)."""
    q, keys, w, scale = inputs(3, 4, 64, 20, seed=5)
    q[0] = 0.0
    w[1] = -w[1].abs()  # row 1: negative weights, so each term is <= 0
    keys[3] = 0.0
    got = run_kernel(backend, q, keys, w, scale)
    assert torch.equal(bits(got[0]), torch.zeros(20, dtype=torch.int32))
    assert torch.equal(bits(got[:, 3]), torch.zeros(3, dtype=torch.int32))
    assert (got[1] <= 0).all() and (bits(got) != bits(torch.tensor(-0.0))).all()
    close(got, deterministic_oracle(q, keys, w, scale))


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_propagates_as_in_torch(backend):
    q, keys, w, scale = inputs(2, 3, 64, 5, seed=6)
    q[1, 2, 7] = float("nan")
    got = run_kernel(backend, q, keys, w, scale)
    want = deterministic_oracle(q, keys, w, scale)
    assert torch.isnan(got[1]).all() and not torch.isnan(got[0]).any()
    close(got[0], want[0])


@settings(max_examples=10)
@given(s=st.integers(1, 40), h=st.integers(1, 6), d=st.integers(1, 70), n=st.integers(1, 40),
       seed=st.integers(0, 99))
def test_property_random_shapes_on_the_interpreter(s, h, d, n, seed):
    q, keys, w, scale = inputs(s, h, d, n, seed=seed)
    got = ops.indexer_scores(q, keys, w, scale, backend="interp")
    close(got, float64_oracle(q, keys, w, scale))


def test_empty_sizes_give_empty_or_zero_scores():
    q, keys, w, scale = inputs(2, 3, 8, 4)
    assert ops.indexer_scores(q[:0], keys, w[:0], scale).shape == (0, 4)
    assert ops.indexer_scores(q, keys[:0], w, scale).shape == (2, 0)
    none = ops.indexer_scores(q[:, :0].contiguous(), keys, w[:, :0].contiguous(), scale)
    assert torch.equal(bits(none), torch.zeros(2, 4, dtype=torch.int32))


def test_bad_arguments_raise_typed_errors_naming_them():
    q, keys, w, scale = inputs(2, 3, 8, 4)
    cases = [
        ((q.numpy(), keys, w, scale), ops.IndexerTypeError, "q must be a torch.Tensor"),
        ((q.half(), keys, w, scale), ops.IndexerTypeError, "q must be float32 or bfloat16"),
        ((q, keys.bfloat16(), w, scale), ops.IndexerTypeError, "keys must have q's dtype"),
        ((q[0], keys, w, scale), ops.IndexerValueError, "q must be 3-D"),
        ((q, keys[:, :5], w, scale), ops.IndexerValueError, "keys must be"),
        ((q, keys.t(), w, scale), ops.IndexerValueError, "keys must be contiguous"),
        ((q, keys, w[:, :2].contiguous(), scale), ops.IndexerValueError, "head_weights must be"),
        ((q, keys, w, float("inf")), ops.IndexerValueError, "scale must be a finite float"),
        ((q, keys, w, "0.1"), ops.IndexerValueError, "scale"),
    ]
    for args, err, match in cases:
        with pytest.raises(err, match=match):
            ops.indexer_scores(*args)
    with pytest.raises(ValueError, match="dtype"):
        I.indexer_scores(heads=2, dim=8, dtype="float16")
    with pytest.raises(ValueError, match="heads"):
        I.indexer_scores(heads=0, dim=8)


@pytest.mark.parametrize("backend", BACKENDS)
def test_registry_spec_verifies(backend):
    result = run_spec(get("indexer_scores"), backend, "small", repeat=1)
    assert result.verified, result.error


def test_registry_check_catches_a_wrong_score_and_a_negative_zero():
    spec = get("indexer_scores")
    params = spec.problems["small"].params
    ins = spec.make_inputs(params, 0, "cpu")
    want = spec.reference(ins, params)
    wrong = want[0].float().clone()
    wrong[1, 2] += 1e-3
    with pytest.raises(AssertionError, match="indexer_scores"):
        spec.check([wrong], want, ins, params)
    zero = want[0].float().clone()
    zero[zero == 0] = -0.0
    assert (want[0] == 0).any()
    with pytest.raises(AssertionError, match="-0.0"):
        spec.check([zero], want, ins, params)


def test_cuda_emu_matches_the_reference():
    """CUDA semantics on the host at a tiny size (cuda-emu compiles are slow)."""
    if "cuda-emu" not in host_backends("cuda-emu"):
        pytest.skip("cuda-emu not available")
    q, keys, w, scale = inputs(2, 3, 40, 19, seed=7)
    got = run_kernel("cuda-emu", q, keys, w, scale)
    close(got, float64_oracle(q, keys, w, scale))
    assert (bits(got) != bits(torch.tensor(-0.0))).all()
