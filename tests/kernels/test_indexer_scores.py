"""The indexer score kernel (`kernforge.kernels.indexer`, `ops.indexer_scores`): the engine's
former torch step is the oracle.  Bit for bit against its deterministic mode (tree-summed
dots, pairwise heads) at float32 on interp and cpu, within float32 rounding of its matmul
mode and of float64, bits independent of the batch, +0.0 for every zero score."""
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


def inputs(s, h, d, n, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(s, h, d, generator=g).to(dtype)
    keys = torch.randn(n, d, generator=g).to(dtype)
    w = torch.randn(s, h, generator=g).to(dtype)  # both signs: relu zeros times negative weights
    return q, keys, w, d ** -0.5 * h ** -0.5


def deterministic_oracle(q, keys, w, scale):
    with nx.deterministic():
        return I.reference(w, q, keys, scale)


def bits(t):
    return t.contiguous().view(torch.int32)


def run_kernel(backend, q, keys, w, scale, **config):
    """The raw kernel into NaN-poisoned scores (so an element it skips shows)."""
    s, h, d = q.shape
    params = dict(I.choose.heuristic(backend, h, d, str(q.dtype)[6:]), **config)
    scores = torch.full((s, keys.shape[0]), float("nan"))
    kernforge.compile(I.indexer_scores, backend=backend, **params)(q, keys, w, scores, scale)
    return scores


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("s,h,d,n", [(3, 4, 64, 37), (1, 3, 37, 1), (2, 5, 100, 17), (4, 1, 1, 16)])
def test_bits_are_the_deterministic_reference(backend, s, h, d, n):
    """Odd heads (sum_terms' carried term), dims that are not a power of two (tree_sum's zero
    padding), one key, one query, a ragged last key tile."""
    q, keys, w, scale = inputs(s, h, d, n, seed=s * 100 + n)
    got = run_kernel(backend, q, keys, w, scale)
    want = deterministic_oracle(q, keys, w, scale)
    assert torch.equal(bits(got), bits(want)), (got - want).abs().max()
    # the default mode's matmul sums in another order: float32 rounding apart
    torch.testing.assert_close(got, I.reference(w, q, keys, scale), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bfloat16_inputs_within_float32_rounding_of_float64(backend):
    q, keys, w, scale = inputs(5, 4, 64, 70, torch.bfloat16, seed=3)
    got = ops.indexer_scores(q, keys, w, scale, backend=backend)
    assert got.dtype == torch.float32
    want = I.reference(w.double(), q.double(), keys.double(), scale)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_score_does_not_depend_on_the_batch_or_the_tile(backend):
    """The engine's deterministic rows: a query's scores alone, among others, against a prefix
    of the keys, and with another key tile are the same bits."""
    q, keys, w, scale = inputs(6, 4, 64, 50, seed=4)
    full = run_kernel(backend, q, keys, w, scale)
    assert torch.equal(bits(run_kernel(backend, q[2:3], keys[:9], w[2:3], scale)), bits(full[2:3, :9]))
    assert torch.equal(bits(run_kernel(backend, q, keys, w, scale, block_N=8)), bits(full))


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
    assert torch.equal(bits(got), bits(deterministic_oracle(q, keys, w, scale)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_propagates_as_in_torch(backend):
    q, keys, w, scale = inputs(2, 3, 64, 5, seed=6)
    q[1, 2, 7] = float("nan")
    got = run_kernel(backend, q, keys, w, scale)
    want = deterministic_oracle(q, keys, w, scale)
    assert torch.isnan(got[1]).all() and not torch.isnan(got[0]).any()
    assert torch.equal(bits(got[0]), bits(want[0]))


@settings(max_examples=10)
@given(s=st.integers(1, 3), h=st.integers(1, 6), d=st.integers(1, 70), n=st.integers(1, 40),
       seed=st.integers(0, 99))
def test_property_random_shapes_on_the_interpreter(s, h, d, n, seed):
    q, keys, w, scale = inputs(s, h, d, n, seed=seed)
    got = ops.indexer_scores(q, keys, w, scale, backend="interp")
    assert torch.equal(bits(got), bits(deterministic_oracle(q, keys, w, scale)))


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
    torch.testing.assert_close(got, deterministic_oracle(q, keys, w, scale), rtol=1e-6, atol=1e-6)
    assert (bits(got) != bits(torch.tensor(-0.0))).all()
