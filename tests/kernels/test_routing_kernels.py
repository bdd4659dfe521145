"""The routing DSL kernels: exact indices (ties to the smaller index) and weights against the
torch references on interp and cpu, every top2_sum_gate option through the catalogue's small
problem, a few cases on cuda-emu, and the CUDA sources compiling."""
import shutil

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import kernforge
from kernforge import backends
from kernforge.kernels import routing as R
from kernforge.kernels.check import run_spec
from kernforge.kernels.registry import get
from kernforge.kernels.routing.problems import logits_with_ties
from tests.conftest import host_backends

BACKENDS = host_backends("interp", "cpu")
ALL_BACKENDS = host_backends()
#: scores with exact ties, signed zeros (equal), denormals, the largest float and infinities
TIE_VALUES = [float("-inf"), -3e38, -2.0, -1e-45, -0.0, 0.0, 1e-45, 0.5, 1.0, 3e38, float("inf")]
#: logits and biases whose sums (and sums of two sums) are exact in float32: the reference's
#: float64 keys and group scores are the kernel's float32 ones, ties included
DYADIC = [-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0]
SPECS = ["topk_gate", "top2_sum_gate", "normalize_weight", "hash_gate"]


def run_topk(backend, scores, k, threads=128):
    kernel = kernforge.compile(R.topk_gate, backend=backend, num_experts=scores.shape[1], num_topk=k,
                               threads=threads)
    out = torch.full((scores.shape[0], k), -77, dtype=torch.int64)
    kernel(scores, out)
    return out


def run_top2(backend, logits, bias, k, groups=0, topk_groups=0, scoring="sigmoid", scale=1.0):
    kernel = kernforge.compile(R.top2_sum_gate, backend=backend, num_experts=logits.shape[1], num_topk=k,
                               num_groups=groups, num_topk_groups=topk_groups, scoring_func=scoring)
    t, e = logits.shape
    idx = torch.full((t, k), -77, dtype=torch.int64)
    w = torch.full((t, k), float("nan"))
    one = torch.ones(1, dtype=torch.bool)
    kernel(logits, bias, one, one, torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32),
           torch.zeros(1, 1, dtype=torch.int64), idx, w, scale, 0, 0, 1, e, e)
    return idx, w


def reference_top2(logits, bias, k, groups, topk_groups, scoring, scale=1.0):
    return R.reference.top2_sum_gate(logits, bias, k, topk_groups, groups, False, 0, scale, 0, 1, 0, 1, scoring)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", SPECS)
def test_registry_specs_verify(backend, name):
    """The small problems: ties in every fourth row; top2_sum_gate with groups, two shared
    slots, a physical map with replicas, EP x TP = 4 x 2 masking, a mask and fixed rows."""
    result = run_spec(get(name), backend, "small", repeat=1)
    assert result.verified, result.error


def test_small_top2_problem_exercises_every_option():
    """The catalogue's small problem is only a test of the options if they change the result."""
    spec = get("top2_sum_gate")
    p = spec.problems["small"].params
    inputs = spec.make_inputs(p, 0, "cpu")
    idx, w, unmapped = spec.reference(inputs, p)
    mask, fix = inputs[2], inputs[3]
    assert (~mask).any() and (fix & mask).any()
    assert (idx[mask] == -1).any() and (idx[mask] >= 0).any()      # TP masking drops some slots
    assert (w[mask][:, -2:] == 1.0).all()                          # shared slots
    assert (unmapped[~mask] == -1).all() and torch.equal(unmapped[fix & mask], inputs[6][fix & mask])


@pytest.mark.parametrize("backend", BACKENDS)
def test_topk_gate_ties_go_to_the_smaller_index(backend):
    # 64 experts, k = 6: the catalogue's small build
    head = torch.tensor([[0.0, 2.0, 2.0, -1.0, 2.0, 0.0, 0.0, 2.0, -0.0, 5.0],
                         [float("-inf")] * 2 + [-1e30] * 8])
    s = torch.cat([head, torch.full((2, 54), float("-inf"))], dim=1)
    s = torch.cat([s, torch.ones(1, 64), torch.full((1, 64), float("-inf"))])
    out = run_topk(backend, s, 6)
    assert out.tolist() == [[9, 1, 2, 4, 7, 0], [2, 3, 4, 5, 6, 7], [0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5]]
    assert torch.equal(out, R.reference.topk_gate(s, 6))


@pytest.mark.parametrize("backend", BACKENDS)
def test_topk_gate_matches_torch_stable_sort(backend):
    s = logits_with_ties(33, 64, seed=3)
    assert torch.equal(run_topk(backend, s, 6), torch.sort(s, dim=1, descending=True, stable=True).indices[:, :6])


def stable_select(keys: np.ndarray, k: int) -> np.ndarray:
    """float64 numpy: per row the ``k`` largest keys' indices, descending, equal keys (``-0.0 ==
    0.0``) in index order: an independent statement of the tie rule, without torch."""
    return np.argsort(-keys.astype(np.float64), axis=1, kind="stable")[:, :k]


@pytest.mark.parametrize("backend", ALL_BACKENDS)
@settings(max_examples=12, deadline=None)
@given(data=st.data(), build=st.sampled_from([(1, 1), (3, 2), (12, 5), (64, 6), (64, 64)]))
def test_topk_gate_property_ties_go_to_the_smaller_index(backend, data, build):
    """Scores drawn from a handful of values: most rows are ties, broken by index alone."""
    e, k = build
    t = data.draw(st.integers(1, 6), label="tokens")
    s = data.draw(hnp.arrays(np.float32, (t, e), elements=st.sampled_from(TIE_VALUES)), label="scores")
    assert np.array_equal(run_topk(backend, torch.from_numpy(s), k).numpy(), stable_select(s, k))


#: (E, k, num_groups, num_topk_groups, scoring) builds of the top2_sum_gate property
TOP2_BUILDS = [(8, 3, 0, 0, "sigmoid"), (64, 6, 0, 0, "sqrtsoftplus"), (64, 6, 0, 0, "softmax"),
               (64, 6, 8, 3, "softmax"), (32, 5, 4, 1, "softmax")]


@pytest.mark.parametrize("backend", ALL_BACKENDS)
@settings(max_examples=12, deadline=None)
@given(data=st.data(), build=st.sampled_from(TOP2_BUILDS))
def test_top2_sum_gate_property_ties_against_float64(backend, data, build):
    """Logits and bias from a few dyadic values: experts and groups tie exactly.  Softmax ranks
    by ``logit + bias`` (exact in float64); sigmoid and sqrt-softplus, strictly increasing,
    rank by the logit under a constant bias.  Groups: the float64 sum of each group's top two."""
    e, k, groups, topk_groups, scoring = build
    t = data.draw(st.integers(1, 6), label="tokens")
    logits = data.draw(hnp.arrays(np.float32, (t, e), elements=st.sampled_from(DYADIC)), label="logits")
    if scoring == "softmax":
        bias = data.draw(hnp.arrays(np.float32, (e,), elements=st.sampled_from(DYADIC)), label="bias")
    else:
        bias = np.full(e, data.draw(st.sampled_from(DYADIC), label="bias"), np.float32)
    keys = logits.astype(np.float64) + (bias if scoring == "softmax" else 0.0)
    if groups:
        per = keys.reshape(t, groups, e // groups)
        top2 = -np.sort(-per, axis=2)[:, :, :2].sum(axis=2)
        dropped = np.ones((t, groups), bool)
        np.put_along_axis(dropped, stable_select(top2, topk_groups), False, axis=1)
        keys = np.where(dropped.repeat(e // groups, axis=1), -np.inf, keys)
    want = stable_select(keys, k)
    idx, w = run_top2(backend, torch.from_numpy(logits), torch.from_numpy(bias), k, groups, topk_groups, scoring,
                      scale=1.5)
    assert np.array_equal(idx.numpy(), want)
    x = logits.astype(np.float64)
    if scoring == "softmax":
        score = np.exp(x - x.max(1, keepdims=True))
        score /= score.sum(1, keepdims=True)
    else:
        score = 1 / (1 + np.exp(-x)) if scoring == "sigmoid" else np.sqrt(np.logaddexp(0.0, x))
    chosen = np.take_along_axis(score, want, axis=1)
    np.testing.assert_allclose(w.numpy(), chosen / chosen.sum(1, keepdims=True) * 1.5, rtol=1e-5, atol=0)


@pytest.mark.parametrize("scoring", R.SCORING_FUNCS)
@pytest.mark.parametrize("groups,topk_groups", [(0, 0), (8, 3), (4, 4)])
def test_top2_sum_gate_against_the_reference_on_the_interpreter(scoring, groups, topk_groups):
    logits = logits_with_ties(21, 64, seed=5) * 3
    bias = torch.randn(64, generator=torch.Generator().manual_seed(1)) * 0.2
    idx, w = run_top2("interp", logits, bias, 6, groups, topk_groups, scoring, scale=2.5)
    want_idx, want_w = reference_top2(logits, bias, 6, groups, topk_groups, scoring, scale=2.5)
    assert torch.equal(idx, want_idx)
    torch.testing.assert_close(w, want_w, rtol=2e-6, atol=0)


def test_group_limit_is_the_top2_sum_of_biased_scores():
    """Group 1 holds the single best expert but group 0 the best pair: with one group kept,
    every pick comes from group 0 (a top-1 group limit would pick group 1)."""
    logits = torch.full((1, 8), -4.0)
    logits[0, :4] = torch.tensor([1.0, 1.0, 0.0, 0.0])   # group 0: top-2 sum 2 sigmoid(1)
    logits[0, 4:] = torch.tensor([3.0, -6.0, -6.0, -6.0])  # group 1: sigmoid(3) + sigmoid(-6)
    idx, _ = run_top2("interp", logits, torch.zeros(8), 2, groups=2, topk_groups=1)
    assert idx.tolist() == [[0, 1]]
    # the bias ranks, the weights stay unbiased
    bias = torch.zeros(8)
    bias[3] = 10.0
    idx, w = run_top2("interp", logits, bias, 2, groups=2, topk_groups=1)
    s = torch.sigmoid(logits[0])
    assert idx.tolist() == [[3, 0]]
    torch.testing.assert_close(w, torch.stack([s[3], s[0]])[None] / (s[3] + s[0]), rtol=2e-6, atol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_hash_gate_and_normalize_weight(backend):
    spec = get("hash_gate")
    p = dict(spec.problems["small"].params, num_tokens=1)  # T = 1
    result = run_spec(get("normalize_weight"), backend, "small", repeat=1)
    assert result.verified, result.error
    kernel = kernforge.compile(spec.factory, backend=backend, **p)
    inputs = spec.make_inputs(p, 7, "cpu")
    kernel(*inputs)
    spec.check([inputs[i] for i in spec.outputs], spec.reference(inputs, p), inputs, p)


@settings(max_examples=8)
@given(t=st.integers(1, 9), e=st.sampled_from([4, 12, 40, 64]), k=st.integers(1, 8), seed=st.integers(0, 99))
def test_property_shapes_on_the_interpreter(t, e, k, seed):
    k = min(k, e)
    logits = logits_with_ties(t, e, seed)
    assert torch.equal(run_topk("interp", logits, k), R.reference.topk_gate(logits, k))
    bias = torch.randn(e, generator=torch.Generator().manual_seed(seed)) * 0.1
    idx, w = run_top2("interp", logits, bias, k)
    want_idx, want_w = reference_top2(logits, bias, k, 0, 0, "sigmoid")
    assert torch.equal(idx, want_idx)
    torch.testing.assert_close(w, want_w, rtol=2e-6, atol=0)


def test_check_catches_a_swapped_index():
    spec = get("topk_gate")
    p = spec.problems["small"].params
    inputs = spec.make_inputs(p, 0, "cpu")
    (want,) = spec.reference(inputs, p)
    got = want.clone()
    got[0, [0, 1]] = got[0, [1, 0]]
    with pytest.raises(AssertionError, match="topk_idx differ"):
        spec.check([got], [want], inputs, p)


def test_cuda_emu_runs_each_kernel():
    """CUDA semantics on the host: the catalogue's small problem of each kernel."""
    if "cuda-emu" not in host_backends("cuda-emu"):
        pytest.skip("cuda-emu not available")
    for name in SPECS:
        result = run_spec(get(name), "cuda-emu", "small", repeat=1)
        assert result.verified, f"{name}: {result.error}"


def test_factories_reject_bad_parameters():
    with pytest.raises(ValueError, match="num_topk"):
        R.topk_gate(num_experts=8, num_topk=9)
    with pytest.raises(ValueError, match="multiple of 4"):
        R.top2_sum_gate(num_experts=10, num_topk=2)
    with pytest.raises(ValueError, match="num_topk"):
        R.top2_sum_gate(num_experts=64, num_topk=33)
    with pytest.raises(ValueError, match="num_groups"):
        R.top2_sum_gate(num_experts=64, num_topk=4, num_groups=6, num_topk_groups=2)
    with pytest.raises(ValueError, match="experts per group"):
        R.top2_sum_gate(num_experts=128, num_topk=4, num_groups=2, num_topk_groups=1)
    with pytest.raises(ValueError, match="scoring_func"):
        R.top2_sum_gate(num_experts=64, num_topk=4, scoring_func="identity")
    with pytest.raises(ValueError, match="scoring_func"):
        R.hash_gate(num_experts=64, num_topk=4, scoring_func="tanh")


def _cuda():
    try:
        return backends.get("cuda")
    except backends.BackendError as e:
        pytest.skip(f"CUDA backend module absent: {e}")


def test_cuda_sources_render_for_sm90a():
    cuda = _cuda()
    for spec in map(get, SPECS):
        pf = spec.factory(**spec.problems["demo"].params)
        assert f"kf_{pf.ir.name}(" in cuda.source(pf.ir, "sm_90a")


@pytest.mark.nvcc
def test_cuda_source_compiles_for_sm90a():
    """The full-option top2_sum_gate at V3's size (the catalogue's builds are in
    tests/backends/test_cuda_compile.py)."""
    _cuda()
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH")
    from kernforge.backends.cuda.backend import build_report

    pf = R.top2_sum_gate(num_experts=256, num_topk=8, num_groups=8, num_topk_groups=4, num_shared=1,
                         has_mask=True, has_fix=True, has_unmapped=True, has_map=True)
    report = build_report(pf.ir, "sm_90a")
    assert report["arch"] == "sm_90a" and report["spill_stores"] == 0


#: logits where each scoring's float32 evaluation is fully accurate: the extremes of float32
#: (scores 0, 1, sqrt(3e38)), signed zeros, tiny values, and both sides of where
#: exp(-|x|) leaves the normal range (|x| = 87.3) and float32 exp overflows (88.7)
EDGE_LOGITS = [-3.4e38, -1e30, -200.0, -104.0, -87.0, -60.0, -20.0, -1.0, -1e-30, -0.0, 0.0, 1e-30,
               1e-7, 0.5, 20.0, 87.0, 88.0, 89.0, 200.0, 1e4, 1e30, 3.4e38]


def gate_scores(backend, logits, scoring):
    """Every expert's score, unnormalised: hash_gate routing token ``t`` to all ``E`` experts."""
    t, e = logits.shape
    kernel = kernforge.compile(R.hash_gate, backend=backend, num_experts=e, num_topk=e, scoring_func=scoring,
                               norm_topk_prob=False)
    idx = torch.empty(t, e, dtype=torch.int64)
    w = torch.full((t, e), float("nan"))
    kernel(logits, torch.arange(t), torch.arange(e).repeat(t, 1), idx, w, 1.0)
    return w


def float64_scores(logits, scoring):
    x = logits.double()
    if scoring == "sigmoid":
        return torch.sigmoid(x)
    if scoring == "sqrtsoftplus":
        return torch.sqrt(torch.logaddexp(torch.zeros_like(x), x))
    return torch.softmax(x, dim=-1)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scoring", R.SCORING_FUNCS)
def test_scores_against_float64(backend, scoring):
    """The vectorisable scoring (kernforge.kernels.vexp's exp, the float64 atanh-series log1p
    and Newton sqrt) against torch in float64, on random rows (scales 1, 4, 30), the edge
    values and the band where exp(-|x|) is a float32 denormal: each score within 2e-6
    relative (the ops' documented tolerance, 17 float32 ulps; measured at most 4 for sigmoid,
    2 for sqrt-softplus outside the band, 12 for softmax) plus one smallest normal, or, where
    float32 itself is ill-conditioned (softmax's ``x - max`` of wide rows, denormal ``exp``),
    no further from float64 than twice torch's own float32 evaluation; no NaN anywhere."""
    g = torch.Generator().manual_seed(11)
    rows = [torch.randn(64, generator=g) * s for s in (1.0, 4.0, 30.0)]
    edge = torch.tensor(EDGE_LOGITS)
    rows += [torch.cat([edge, torch.full((64 - edge.numel(),), -5.0)]), edge.repeat(3)[:64].flip(0),
             torch.linspace(-87.0, 88.0, 64), torch.linspace(-104.0, -87.0, 64)]
    logits = torch.stack(rows)
    got = gate_scores(backend, logits, scoring).double()
    want = float64_scores(logits, scoring)
    torch32 = R.reference.scores_of(logits, scoring).double()
    assert not torch.isnan(got).any()
    err = (got - want).abs()
    bound = 2e-6 * want.abs() + 2.0 ** -126
    assert ((err <= bound) | (err <= 2 * (torch32 - want).abs())).all(), logits[err > bound]
    # outside the denormal band (the last row) the fallback is for a few ill-conditioned scores
    assert (err <= bound)[:-1].float().mean() > 0.97


@pytest.mark.parametrize("scoring", R.SCORING_FUNCS)
def test_top2_sum_gate_on_the_host_at_v4_size(scoring):
    """E = 256, k = 6 (V4-Flash) on the compiled host kernel: the same experts as the torch
    reference (torch's float32 scores, a stable sort), weights within the documented 2e-6."""
    g = torch.Generator().manual_seed(12)
    logits = torch.randn(64, 256, generator=g) * 2
    bias = torch.randn(256, generator=g) * 0.1
    idx, w = run_top2("cpu", logits, bias, 6, scoring=scoring, scale=1.5)
    want_idx, want_w = reference_top2(logits, bias, 6, 0, 0, scoring, scale=1.5)
    assert torch.equal(idx, want_idx)
    torch.testing.assert_close(w, want_w, rtol=2e-6, atol=0)
