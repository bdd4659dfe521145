"""kernforge.ops.topk: DeepSelect's API and semantics, checked against torch.topk.

Properties (hypothesis): the selected values are the k largest (same multiset as
torch.topk), every index is valid and points at its value bit for bit, and ties
at the k-th value go to the lowest indices.  Then every option and every error
path, on every host backend present.  Kernel configurations are drawn from a
short list so that the suite compiles few C++ variants.
"""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernforge.backends import BackendError
from kernforge.kernels.topk import NAN_ROW_MARKER, ordered_keys, reference
from kernforge.ops.topk import (TopKNaNError, TopKTypeError, TopKUnsupportedError, TopKValueError,
                                get_stride_requirement, topk)
from tests.conftest import host_backend_skip_reason, host_backends

BACKENDS = host_backends("interp", "cpu", "cuda-emu")

# (dtype, k, indices_type, sorted, return_value): each is one compiled kernel per backend
CONFIGS = [
    (torch.float32, 16, torch.int64, False, True),
    (torch.float32, 300, torch.int32, True, True),
    (torch.bfloat16, 16, torch.int32, False, False),
    (torch.bfloat16, 1, torch.int64, False, True),
]


def _bits(t):
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t.view(torch.int32)


def make_rows(batch, vocab, dtype, seed, ties=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((batch, vocab), generator=g) * 3
    if ties:  # few distinct values: most selections cut through a run of equal values
        x = torch.round(x)
    return x.to(dtype)


def check_against_torch(x, k, end, values, idx, sorted_values, offset=None):
    """The properties, row by row, against torch.topk on each row's valid prefix."""
    for r in range(x.shape[0]):
        n = x.shape[1] if end is None else int(end[r])
        c = min(n, k)
        row = x[r, :n]
        got = idx[r, :c].long() - (0 if offset is None else int(offset[r]))
        assert got.unique().numel() == c, f"row {r}: repeated indices"
        assert bool(((got >= 0) & (got < n)).all()), f"row {r}: index out of [0, {n})"
        if c:
            want_vals = torch.topk(row.float(), c, sorted=True).values
            got_vals = torch.sort(row[got].float(), descending=True).values
            assert torch.equal(got_vals, want_vals), f"row {r}: value multisets differ"
            # ties: every unselected element equal to the k-th value has a larger index
            kth = ordered_keys(row)[got].min()
            keys = ordered_keys(row)
            chosen = torch.zeros(n, dtype=torch.bool)
            chosen[got] = True
            losers = ((keys == kth) & ~chosen).nonzero().flatten()
            winners = ((keys == kth) & chosen).nonzero().flatten()
            if losers.numel() and winners.numel():
                assert int(winners.max()) < int(losers.min()), f"row {r}: tie went to a higher index"
        if values is not None:
            assert torch.equal(_bits(values[r, :c]), _bits(row[got])), f"row {r}: values not bit-exact"
            if sorted_values:
                v = values[r, :c].float()
                assert bool((v[:-1] >= v[1:]).all()), f"row {r}: values not sorted"
            else:
                assert bool((got[:-1] < got[1:]).all()), f"row {r}: unsorted output not in index order"
        assert bool((idx[r, c:] == 2**31 - 1).all()), f"row {r}: fill slots"


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=10)
@given(cfg=st.sampled_from(CONFIGS), batch=st.integers(1, 4), vocab=st.integers(1, 2000),
       ties=st.booleans(), with_end=st.booleans(), seed=st.integers(0, 2**16))
def test_properties_against_torch_topk(backend, cfg, batch, vocab, ties, with_end, seed):
    dtype, k, itype, sorted_values, rv = cfg
    x = make_rows(batch, vocab, dtype, seed, ties)
    end = None
    if with_end:
        g = torch.Generator().manual_seed(seed + 1)
        end = torch.randint(0, vocab + 1, (batch,), generator=g, dtype=torch.int32)
        end[0] = 0  # an empty row: all fill
    values, idx = topk(x, k, sorted=sorted_values, end=end, indices_type=itype, return_value=rv,
                       backend=backend)
    assert idx.dtype == itype and idx.shape == (batch, k)
    assert (values is None) == (not rv)
    if rv:
        assert values.dtype == dtype and values.shape == (batch, k)
    check_against_torch(x, k, end, values, idx, sorted_values)
    # and exactly the documented result (tie policy included)
    ref_v, ref_i, _ = reference(x, k, end, sorted_values, index_dtype=itype)
    assert torch.equal(idx, ref_i)
    if rv:
        assert torch.equal(_bits(values), _bits(ref_v))


@pytest.mark.parametrize("backend", BACKENDS)
def test_adversarial_rows(backend):
    """Ascending rows force a refinement per tile; equal rows test ties everywhere;
    -inf, +-0 and denormals test the key order."""
    v = 3000
    rows = [torch.arange(v, dtype=torch.float32),                  # ascending
            torch.arange(v, 0, -1, dtype=torch.float32),           # descending
            torch.full((v,), 0.5),                                 # all equal
            torch.full((v,), float("-inf")),                       # all -inf
            torch.tensor([0.0, -0.0] * (v // 2)),                  # signed zeros
            torch.arange(v, dtype=torch.float32) * 1e-45]          # denormals
    x = torch.stack(rows)
    values, idx = topk(x, 16, backend=backend)
    ref_v, ref_i, _ = reference(x, 16)
    assert torch.equal(idx, ref_i) and torch.equal(values, ref_v)
    _, idx16 = topk(x.bfloat16(), 16, indices_type=torch.int32, return_value=False, backend=backend)
    assert torch.equal(idx16, reference(x.bfloat16(), 16, index_dtype=torch.int32)[1])
    assert idx[2].tolist() == list(range(16))  # all equal: the lowest indices win
    assert idx[4].tolist() == list(range(0, 32, 2))  # +0 ranks above -0


@pytest.mark.parametrize("backend", BACKENDS)
def test_output_buffer_offsets_and_fills(backend):
    x = make_rows(3, 700, torch.float32, 1)
    end = torch.tensor([700, 5, 0], dtype=torch.int32)
    offset = torch.tensor([2**31 - 1, -2**31, 7], dtype=torch.int32)
    storage = torch.full((3, 24), -5, dtype=torch.int64)  # strided rows with a canary tail
    out = storage[:, :16]
    values, idx = topk(x, 16, sorted=True, end=end, output_idx=out, output_idx_offset=offset,
                       idx_oob_fill_value=-2000000 + 700, value_oob_fill_value=-1234123412341234.0,
                       backend=backend)
    assert idx is out
    assert bool((storage[:, 16:] == -5).all()), "wrote past the logical columns"
    ref_v, ref_i, _ = reference(x, 16, end, True, offset, -2000000 + 700,
                                float(torch.tensor(-1234123412341234.0, dtype=torch.float32)))
    assert torch.equal(idx, ref_i) and torch.equal(values, ref_v)
    assert int(idx[0, 0]) >= 2**31 - 1  # the offset is added in 64 bits
    assert bool((idx[1, 5:] == -2000000 + 700).all()) and bool((idx[2] == -2000000 + 700).all())


@pytest.mark.parametrize("backend", BACKENDS)
def test_any_row_stride_and_k_above_vocab(backend):
    big = make_rows(4, 1000, torch.float32, 3)
    x = big[:, 3:3 + 517]  # row stride 1000 elements, odd start, odd width
    _, idx = topk(x, 16, backend=backend)
    assert torch.equal(idx, reference(x, 16)[1])
    short = big[:, 5:5 + 211]  # k > vocab: the whole row, sorted by value
    values, idx = topk(short, 300, sorted=True, indices_type=torch.int32, backend=backend)
    ref_v, ref_i, _ = reference(short, 300, sorted_values=True, index_dtype=torch.int32)
    assert torch.equal(idx, ref_i) and torch.equal(values, ref_v)
    assert bool((idx[:, 211:] == 2**31 - 1).all()) and bool(torch.isneginf(values[:, 211:]).all())


@pytest.mark.parametrize("backend", BACKENDS)
def test_sorted_index(backend):
    x = make_rows(2, 900, torch.float32, 4)
    _, idx = topk(x, 16, sorted_index=True, backend=backend)
    assert bool((idx[:, 1:] > idx[:, :-1]).all())
    check_against_torch(x, 16, None, None, idx, False)


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_policy(backend):
    x = make_rows(4, 800, torch.float32, 5)
    x[1, 17] = float("nan")
    x[2, 799] = -float("nan")
    x[3, 700] = float("nan")
    end = torch.tensor([800, 800, 800, 600], dtype=torch.int32)  # row 3's NaN is beyond end
    with pytest.raises(TopKNaNError, match="batch index 1") as info:
        topk(x, 16, end=end, backend=backend)
    assert info.value.rows == [1, 2]
    values, idx = topk(x, 16, end=end, abort_when_nan_found=False, backend=backend)
    assert bool((idx[1:3] == NAN_ROW_MARKER).all())
    check_against_torch(x[[0, 3]], 16, end[[0, 3]], values[[0, 3]], idx[[0, 3]], False)
    short = x[:, 10:20]  # short rows (end <= topk) are checked too
    with pytest.raises(TopKNaNError):
        topk(short, 16, backend=backend)


def test_errors_are_typed_and_raised_before_work():
    x = torch.randn(2, 100)
    for bad in (0, -1, 4097, 2**31):
        with pytest.raises(TopKValueError, match="topk must be between 1 and 4096"):
            topk(x, bad)
    # a non-int k is a type problem, named as such (not "must be between 1 and 4096")
    for bad, type_name in ((8.0, "float"), (True, "bool"), ("8", "str"), (torch.tensor(8), "Tensor")):
        with pytest.raises(TopKTypeError, match=rf"^`topk` \(k\) must be an int, got {type_name} ") as info:
            topk(x, bad)
        assert "between" not in str(info.value)
    with pytest.raises(ValueError):
        topk(x, 0)
    with pytest.raises(RuntimeError):
        topk(x, 5000)
    for kw in ({"begin": torch.zeros(2, dtype=torch.int32)}, {"hint": 1}):
        with pytest.raises(TopKUnsupportedError, match="not supported"):
            topk(x, 4, **kw)
        with pytest.raises(AssertionError):
            topk(x, 4, **kw)
    with pytest.raises(TopKTypeError, match="must match `indices_type`"):
        topk(x, 4, output_idx=torch.empty(2, 4, dtype=torch.int32))
    with pytest.raises(TypeError):
        topk(x, 4, output_idx=torch.empty(2, 4, dtype=torch.int32))
    cases = [
        (dict(sorted=True, return_value=False), TopKValueError, r"`sorted=True` needs `return_value=True`"),
        (dict(sorted=True, sorted_index=True), TopKValueError,
         r"`sorted=True` and `sorted_index=True` cannot be used at the same time"),
        (dict(indices_type=torch.int16), TopKTypeError, "indices_type"),
        (dict(end=torch.zeros(2, dtype=torch.int64)), TopKTypeError, "int32"),
        (dict(end=torch.zeros(3, dtype=torch.int32)), TopKValueError, "shape"),
        (dict(end=torch.tensor([5, 101], dtype=torch.int32)), TopKValueError, r"end\[1\]"),
        (dict(end=torch.tensor([-1, 5], dtype=torch.int32)), TopKValueError, r"end\[0\]"),
        (dict(output_idx_offset=torch.zeros(2, dtype=torch.int64)), TopKTypeError, "int32"),
        (dict(output_idx=torch.empty(2, 5)), TopKTypeError, "dtype"),
        (dict(output_idx=torch.empty(2, 5, dtype=torch.int64)), TopKValueError, "shape"),
        (dict(output_idx=torch.empty(4, 2, dtype=torch.int64).t()), TopKValueError, "contiguous"),
        (dict(output_idx=torch.empty(1, 4, dtype=torch.int64).expand(2, 4)), TopKValueError, "overlap"),
        (dict(idx_oob_fill_value=2**31), TopKValueError, "int32"),
        (dict(value_oob_fill_value="x"), TopKValueError, "float"),
        (dict(backend="nope"), BackendError, "unknown backend"),
        (dict(backend="ascend"), BackendError, "ascend"),
    ]
    for kw, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            topk(x, 4, **kw)
    inputs = [
        (torch.randn(100), TopKValueError, "2-D"),
        (torch.randn(2, 100, dtype=torch.float64), TopKTypeError, "bfloat16 or float32"),
        (torch.randn(100, 2).t(), TopKValueError, "contiguous"),
        (torch.empty(1, 2**23), TopKValueError, "2\\^23"),
        ([[1.0]], TopKTypeError, "torch.Tensor"),
    ]
    for inp, exc, msg in inputs:
        with pytest.raises(exc, match=msg):
            topk(inp, 4)
    # the messages name the parameters the caller wrote (`sorted`), none that do not exist
    with pytest.raises(TopKTypeError, match=r"`sorted=True` is only supported for float32 input, "
                                            r"got torch.bfloat16") as info:
        topk(x.bfloat16(), 4, sorted=True)
    assert "sorted_value" not in str(info.value)
    for kw in (dict(sorted=True, return_value=False), dict(sorted=True, sorted_index=True)):
        with pytest.raises(TopKValueError) as info:
            topk(x, 4, **kw)
        assert "sorted_value" not in str(info.value)


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_batch_and_vocab(backend):
    v, i = topk(torch.randn(0, 50), 16, backend=backend)
    assert v.shape == (0, 16) and i.shape == (0, 16)
    v, i = topk(torch.randn(2, 0), 16, backend=backend)
    assert bool((i == 2**31 - 1).all()) and bool(torch.isneginf(v).all())


def test_default_backend_follows_the_device(monkeypatch):
    import importlib

    ops = importlib.import_module("kernforge.ops.topk")  # the module (kernforge.ops.topk is also the function)

    reason = host_backend_skip_reason("cpu")
    if reason:
        pytest.skip(reason)
    ran = []
    build = ops._compiled

    def recording(backend, *rest):
        kernel = build(backend, *rest)
        ran.append((backend, kernel.backend_name))
        return kernel

    monkeypatch.setattr(ops, "_compiled", recording)
    x = make_rows(2, 300, torch.float32, 6)
    v, i = topk(x, 16)
    assert ran == [("cpu", "cpu")]  # a CPU tensor runs the compiled cpu kernel, not interp
    ref_v, ref_i, _ = reference(x, 16)
    assert torch.equal(i, ref_i) and torch.equal(v, ref_v)
    topk(x, 16, backend="interp")
    assert ran[1:] == [("interp", "interp")]


def test_stride_requirement_and_output_allocation():
    assert get_stride_requirement() == (64, 32)
    v, i = topk(make_rows(3, 100, torch.float32, 7), 5, indices_type=torch.int32, backend="interp")
    # DeepSelect's allocation: rows padded to 32 bytes, sliced to (b, topk)
    assert i.stride(0) == 8 and v.stride(0) == 8
