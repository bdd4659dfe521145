"""kernforge.ops' MoE permutation ops and swiglu: TileKernels' semantics against
independent torch references, the model's MoE torch path end to end, edge routings,
and a typed error naming the argument for each bad input."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kernforge.ops as kops
from kernforge.kernels.grouped_gemm.reference import per_token_cast_to_fp8
from kernforge.kernels.moe_permute import reference
from kernforge.kernels.moe_permute.problems import reduce_bound
from kernforge.model.moe import Expert
from kernforge.ops import moe

E, K, A = 16, 4, 64


def routing(t, experts=E, k=K, seed=0, skip=0.1):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, experts, (t, k), generator=g)
    idx[torch.rand((t, k), generator=g) < skip] = -1
    return idx


def assert_mapping(got, idx, experts, alignment, n):
    want = reference.mapping(idx, experts, alignment, n)
    for i, (g, w) in enumerate(zip(got[:7], want)):
        assert torch.equal(g, w), f"output {i}: {g.flatten()[:10].tolist()} != {w.flatten()[:10].tolist()}"


# ---------------------------------------------------------------- get_fused_mapping


@pytest.mark.parametrize("alignment", [64, 128])
@pytest.mark.parametrize("case", ["empty", "one token", "one expert", "all skipped", "random"])
def test_mapping_sync_path_sizes_trims_and_lists(case, alignment):
    idx = {"empty": torch.zeros((0, K), dtype=torch.int64), "one token": torch.tensor([[3, 9, -1, 3]]),
           "one expert": torch.full((50, K), 7, dtype=torch.int64),
           "all skipped": torch.full((5, K), -1, dtype=torch.int64), "random": routing(70)}[case]
    got = moe.get_fused_mapping(idx, E, 0, alignment)
    per = got[6]
    assert got[7] == per.tolist() and all(isinstance(v, int) for v in got[7])
    assert got[0].numel() == sum(got[7])                          # trimmed to the real total
    assert all(v % alignment == 0 for v in got[7])
    assert torch.equal(got[5] - got[4], per)                      # end = start + padded length
    assert_mapping(got, idx, E, alignment, got[0].numel())
    if case == "one expert":
        assert got[7][7] == 256 and sum(got[7]) == 256            # 200 rows padded to 256; others empty


def test_mapping_force_no_sync_keeps_the_bound_and_the_tail():
    idx = routing(33)
    bound = (33 * K + (A - 1) * E) // A * A
    got = moe.get_fused_mapping(idx, E, bound, A, force_no_sync=True)
    assert got[7] == [] and got[0].numel() == bound
    assert_mapping(got, idx, E, A, bound)
    assert (got[0][int(got[5][-1]):] == -1).all()                 # rows past the last segment
    # a non-zero size without force_no_sync: used as given, no sync either
    assert moe.get_fused_mapping(idx, E, bound, A)[7] == []


def test_mapping_is_deterministic_in_flat_slot_order():
    idx = torch.tensor([[2, 0], [2, 2], [0, 2]])
    p2e, p2t, p2tk, t2p, start, end, per, lst = moe.get_fused_mapping(idx, 3, 0, 64)
    assert p2tk[:3].tolist() == [1, 4, -1]
    seg2 = p2tk[int(start[2]):int(start[2]) + 4].tolist()
    assert seg2 == [0, 2, 3, 5]                                    # token order, then slot order
    assert p2t[int(start[2]):int(start[2]) + 4].tolist() == [0, 1, 1, 2]
    assert lst == [64, 0, 64]


@settings(max_examples=8)
@given(t=st.integers(0, 200), alignment=st.sampled_from([64, 128]), skip=st.floats(0, 1),
       seed=st.integers(0, 2 ** 16))
def test_mapping_random(t, alignment, skip, seed):
    idx = routing(t, seed=seed, skip=skip)
    got = moe.get_fused_mapping(idx, E, 0, alignment)
    assert_mapping(got, idx, E, alignment, got[0].numel())


# ---------------------------------------------------------------- expand / reduce


def layout(t, seed=0):
    idx = routing(t, seed=seed)
    got = moe.get_fused_mapping(idx, E, 0, A)
    return idx, got[0], got[3]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float8_e4m3fn])
def test_expand_to_fused(dtype):
    _, p2e, t2p = layout(40)
    x = torch.randn(40, 320).to(dtype)
    got = moe.expand_to_fused(x, t2p, p2e).double()
    want = reference.expand(x.float(), t2p, p2e)
    defined = ~torch.isnan(want)
    assert defined.all()                        # a consistent mapping defines every row
    assert torch.equal(got, want)


@pytest.mark.parametrize("backend", ["cpu", "interp"])
def test_expand_to_fused_into_a_reused_buffer(backend):
    """``out=``: a caller-held buffer poisoned with NaN, used by two routings in turn.  Each call
    writes exactly its first N rows (rows the previous routing filled with data are zeroed
    where they are padding now), leaves the rest poisoned, and returns a view of it."""
    buf = torch.full((1300, 96), float("nan")).bfloat16()
    sizes = set()
    for seed in (0, 2):     # one token count, two buffer sizes: the bound launch's grid must follow N
        _, p2e, t2p = layout(250, seed=seed)
        sizes.add(p2e.numel())
        x = torch.randn(t2p.shape[0], 96).bfloat16()
        n = p2e.numel()
        got = moe.expand_to_fused(x, t2p, p2e, out=buf, backend=backend)
        assert got.data_ptr() == buf.data_ptr() and got.shape == (n, 96)
        assert torch.equal(got.double(), reference.expand(x.float(), t2p, p2e))
        assert torch.isnan(buf[n:].float()).all(), "rows past N must be left untouched"
    assert len(sizes) == 2


def test_expand_to_fused_out_rejects_a_bad_buffer():
    _, p2e, t2p = layout(4)
    x = torch.randn(4, 256)
    n = p2e.numel()
    with pytest.raises(TypeError, match="out"):
        moe.expand_to_fused(x, t2p, p2e, out=torch.empty(n, 256).bfloat16())
    with pytest.raises(ValueError, match="out must have shape"):
        moe.expand_to_fused(x, t2p, p2e, out=torch.empty(n - 1, 256))
    with pytest.raises(ValueError, match="out must have shape"):
        moe.expand_to_fused(x, t2p, p2e, out=torch.empty(n, 128))
    with pytest.raises(ValueError, match="out must be contiguous"):
        moe.expand_to_fused(x, t2p, p2e, out=torch.empty(256, n).T)
    big = torch.zeros(n + 4, 256)
    with pytest.raises(ValueError, match="shares storage with x"):
        moe.expand_to_fused(big[:4], t2p, p2e, out=big)


def test_repeated_calls_reuse_the_bound_launch_on_new_buffers():
    """The second call of each op with the same signature runs the launch bound by the first
    (:mod:`kernforge.ops._launch`): it must read the new call's tensors, not the first's."""
    from kernforge.ops import _launch
    _, p2e, t2p = layout(30, seed=6)
    n = p2e.numel()
    for seed in (0, 1):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(30, 256, generator=g).bfloat16()
        xe = torch.randn(n, 256, generator=g)
        w = torch.rand(30, K, generator=g)
        before = len(_launch._BOUND)
        expanded = moe.expand_to_fused(x, t2p, p2e)
        reduced = moe.reduce_fused(xe, w, t2p)
        if seed:
            assert len(_launch._BOUND) == before, "a repeated signature must hit the bound launch"
        assert torch.equal(expanded.double(), reference.expand(x.float(), t2p, p2e))
        want = reference.reduce(xe, w, t2p)
        assert ((reduced.double() - want).abs() <= reduce_bound(xe.double(), w, t2p, want, torch.float32)).all()
    # the same tokens reading a larger buffer, at rows past the first one's end
    shifted = torch.where(t2p >= 0, t2p + 64, t2p)
    wide = torch.cat([torch.full((64, 256), float("nan")), xe])
    want = reference.reduce(wide, w, shifted)
    assert torch.equal(moe.reduce_fused(wide, w, shifted).double(), moe.reduce_fused(xe, w, t2p).double())
    assert not torch.isnan(want).any()


@pytest.mark.parametrize("per_channels,col_major,packed", [(128, False, False), (32, True, False),
                                                          (128, True, True)])
def test_expand_to_fused_with_sf(per_channels, col_major, packed):
    _, p2e, t2p = layout(21, seed=2)
    data = torch.randn(21, 512).to(torch.float8_e4m3fn)
    cols = -(-512 // per_channels)
    if packed:
        sf = torch.randint(-2 ** 31, 2 ** 31 - 1, (21, -(-cols // 4)), dtype=torch.int32)
    else:
        sf = torch.rand(21, cols) + 0.1
    out, out_sf = moe.expand_to_fused_with_sf((data, sf), per_channels, t2p, p2e, col_major)
    assert torch.equal(out.view(torch.uint8).double(), reference.expand(data.view(torch.uint8), t2p, p2e))
    assert torch.equal(out_sf.double(), reference.expand(sf, t2p, p2e))
    if col_major:
        n = p2e.numel()
        assert out_sf.stride() == (1, -(-n // 4) * 4)        # TMA-aligned, MN-major
    else:
        assert out_sf.is_contiguous()


@pytest.mark.parametrize("weighted,with_x_sf", [(True, False), (False, False), (True, True)])
def test_reduce_fused_against_float64(weighted, with_x_sf):
    _, p2e, t2p = layout(30, seed=3)
    n = p2e.numel()
    x = torch.randn(n, 512).bfloat16()
    w = torch.rand(30, K) if weighted else None
    x_sf = torch.rand(n) + 0.5 if with_x_sf else None
    got = moe.reduce_fused((x, x_sf) if with_x_sf else x, w, t2p)
    assert got.dtype == torch.bfloat16
    want = reference.reduce(x, w, t2p, x_sf)
    xs = x.double() * (x_sf.double()[:, None] if with_x_sf else 1)
    assert ((got.double() - want).abs() <= reduce_bound(xs, w, t2p, want, torch.bfloat16)).all()


@pytest.mark.parametrize("backend", ["cpu", "interp"])
@pytest.mark.parametrize("hidden", [256, 128, 100, 4100])
def test_reduce_fused_adds_in_slot_order_in_float32(hidden, backend):
    """Bit for bit the float32 chain acc = acc + x[p] * w, slot 0 first (not a tree, not
    float64): the order is fixed, so every run and every backend agrees.  Any hidden size:
    128 (tiny()'s), 100 (no power of two), 4100 (past the cpu's 4096-column tile)."""
    _, p2e, t2p = layout(25, seed=4)
    x = torch.randn(p2e.numel(), hidden)
    w = torch.rand(25, K)
    got = moe.reduce_fused(x, w, t2p, backend=backend)
    acc = torch.zeros(25, hidden)
    for j in range(K):
        p = t2p[:, j].long()
        term = torch.where((p >= 0)[:, None], x[p.clamp(min=0)] * w[:, j:j + 1], 0.0)
        acc = acc + term
    assert torch.equal(got, acc)
    assert torch.equal(moe.reduce_fused(x, w, t2p, backend=backend), got)


def test_reduce_fused_fp8_output_scale_and_out_argument():
    _, p2e, t2p = layout(12, seed=5)
    x = torch.randn(p2e.numel(), 256) * 0.1
    w = torch.rand(12, K)
    sf = torch.tensor([4.0])
    out = torch.full((12, 256), float("nan")).to(torch.float8_e4m3fn)     # poisoned
    got = moe.reduce_fused(x, w, t2p, fp8_format="e4m3", sf=sf, out=out)
    assert got is out and got.dtype == torch.float8_e4m3fn
    want = reference.reduce(x, w, t2p, sf=sf)
    assert not torch.isnan(got.float()).any()
    assert ((got.double() - want).abs() <= 2.0 ** -4 * want.abs() + 2.0 ** -9).all()
    unscaled = moe.reduce_fused(x, w, t2p, fp8_format="e4m3")
    assert ((unscaled.double() * 4 - want).abs() <= 2.0 ** -3 * want.abs() + 2.0 ** -7).all()


def test_reduce_fused_memoised_plan_follows_every_argument():
    """reduce_fused memoises its scalar checks and launch per signature: calls in turn that
    differ only in fp8_format, in which optional operand is given, or in the row count of x
    (same tokens) each get their own kernel, against float64, twice round (memo hits)."""
    _, p2e, t2p = layout(9, seed=8)
    n = p2e.numel()
    g = torch.Generator().manual_seed(8)
    x = torch.randn(n + 64, 256, generator=g) * 0.1
    w, x_sf, sf = torch.rand(9, K, generator=g), torch.rand(n, generator=g) + 0.5, torch.tensor([2.0])
    cases = [((x[:n],), {}, (x[:n], w, t2p)), ((x[:n], None), {}, (x[:n], None, t2p)),
             (((x[:n], x_sf), w), {}, (x[:n], w, t2p, x_sf)), ((x,), {}, (x, w, t2p)),
             ((x[:n],), {"fp8_format": "e4m3"}, (x[:n], w, t2p)),
             ((x[:n],), {"fp8_format": "e4m3", "sf": sf}, (x[:n], w, t2p, None, sf))]
    for _ in range(2):
        for args, kw, ref in cases:
            if len(args) == 1:
                args = (args[0], w)
            got = moe.reduce_fused(*args, t2p, backend="cpu", **kw)
            want = reference.reduce(*ref)
            fp8 = kw.get("fp8_format") == "e4m3"
            assert got.dtype == (torch.float8_e4m3fn if fp8 else torch.float32)
            tol = 2.0 ** -4 * want.abs() + 2.0 ** -9 if fp8 else 1e-5 * want.abs() + 1e-6
            assert ((got.double() - want).abs() <= tol).all(), (args[1] is None, kw)


def test_expand_into_a_buffer_of_exactly_n_rows_returns_it():
    """A caller's buffer with exactly N rows is written and returned as it is (no view)."""
    _, p2e, t2p = layout(10, seed=9)
    x = torch.randn(10, 128).bfloat16()
    out = torch.full((p2e.numel(), 128), float("nan")).bfloat16()      # poisoned
    got = moe.expand_to_fused(x, t2p, p2e, out=out, backend="cpu")
    assert got is out
    assert torch.equal(got.double(), reference.expand(x.float(), t2p, p2e))


def test_mapping_scratch_is_per_shape_and_per_thread():
    """get_fused_mapping reuses its scan's working tensors on the host, one pair per thread
    and (chunks, experts): shapes and expert counts in turn (1 to 5 chunks), and four threads
    mapping different routings at once, each get the reference's mapping."""
    import concurrent.futures
    cases = [(routing(t, experts=e, seed=t + e), e) for t, e in ((1, 16), (300, 16), (1, 8), (70, 32), (64, 16))]

    def check(case):
        idx, e = case
        got = moe.get_fused_mapping(idx, e, 0, A, backend="cpu")
        want = reference.mapping(idx, e, A, got[0].numel())
        return all(torch.equal(a, b) for a, b in zip(got[:7], want))

    assert all(check(c) for c in cases + cases)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        jobs = [routing(300, seed=s) for s in range(4)] * 10
        assert all(pool.map(check, [(idx, E) for idx in jobs]))


def test_reduce_fused_without_tokens():
    got = moe.reduce_fused(torch.randn(64, 256), None, torch.zeros((0, K), dtype=torch.int32))
    assert got.shape == (0, 256)


# ---------------------------------------------------------------- the model's MoE path end to end


@torch.no_grad()
def test_mapping_expand_swiglu_reduce_equals_the_model_moe_loop():
    """The permuted pipeline (mapping, expand, per-segment torch GEMMs, swiglu with the
    routing weight, reduce without weights) against MoE.forward's loop over experts on
    the same Expert modules, float32."""
    torch.manual_seed(0)
    hidden, inter, experts, k, t = 256, 128, 8, 3, 24
    ex = [Expert(hidden, inter, swiglu_limit=2.0) for _ in range(experts)]
    for e in ex:
        for lin in (e.w1, e.w2, e.w3):
            torch.nn.init.normal_(lin.weight, std=0.2)
    x = torch.randn(t, hidden)
    idx = torch.stack([torch.randperm(experts)[:k] for _ in range(t)])
    idx[2, 1] = -1
    weights = torch.rand(t, k)
    # the model's loop (MoE.forward without gate and shared expert)
    want = torch.zeros(t, hidden)
    for e in torch.unique(idx[idx >= 0]).tolist():
        hit = idx == e
        rows = hit.any(1).nonzero().squeeze(1)
        slot = hit[rows].to(torch.int8).argmax(1)
        want.index_add_(0, rows, ex[e](x.index_select(0, rows), weights[rows, slot, None]))
    p2e, _, p2tk, t2p, start, end, per, _ = moe.get_fused_mapping(idx, experts, 0, 64)
    expanded = moe.expand_to_fused(x, t2p, p2e)
    gate_up = torch.zeros(expanded.shape[0], 2 * inter)
    for e in range(experts):
        s, f = int(start[e]), int(end[e])
        gate_up[s:f] = expanded[s:f] @ torch.cat([ex[e].w1.weight, ex[e].w3.weight]).T
    row_w = torch.where(p2tk >= 0, weights.flatten()[p2tk.clamp(min=0).long()], 0.0)
    h = kops.swiglu(gate_up, row_w, swiglu_limit=2.0)
    down = torch.zeros(expanded.shape[0], hidden)
    for e in range(experts):
        s, f = int(start[e]), int(end[e])
        down[s:f] = h[s:f] @ ex[e].w2.weight.T
    got = moe.reduce_fused(down, None, t2p)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- swiglu op


def test_swiglu_op_matches_the_model_expert_activation():
    torch.manual_seed(1)
    x = (torch.randn(20, 256) * 5).bfloat16()
    w = torch.rand(20, 1)
    got = kops.swiglu(x, w, swiglu_limit=10.0)
    gate, up = x[:, :128].clone(), x[:, 128:].clone()
    up.clamp_(-10.0, 10.0)
    gate.clamp_(max=10.0)
    want = torch.nn.functional.silu(gate).mul_(up).mul_(w)
    assert ((got.double() - want.double()).abs() <= 2.0 ** -7 * want.double().abs()).all()
    assert kops.swiglu(x).shape == (20, 128)                  # no weights, no clamp
    q, sf = kops.swiglu(x, w, swiglu_limit=10.0, quantize=True)
    want_q, want_sf = per_token_cast_to_fp8(got)
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(sf, want_sf)
    assert kops.swiglu(x[:0]).shape == (0, 128)


# ---------------------------------------------------------------- bad input


def _bad_calls():
    idx = routing(4)
    _, p2e, t2p = layout(4)
    x = torch.randn(4, 256)
    xe = torch.randn(p2e.numel(), 256)
    return {
        "topk_idx dtype": (TypeError, "topk_idx", lambda: moe.get_fused_mapping(idx.int(), E, 0, A)),
        "topk_idx rank": (ValueError, "topk_idx", lambda: moe.get_fused_mapping(idx[0], E, 0, A)),
        "topk_idx contiguity": (ValueError, "topk_idx", lambda: moe.get_fused_mapping(idx.T, E, 0, A)),
        "topk_idx range": (ValueError, "topk_idx", lambda: moe.get_fused_mapping(idx.clone().fill_(E), E, 0, A)),
        "topk_idx below -1": (ValueError, "topk_idx", lambda: moe.get_fused_mapping(idx.clone().fill_(-2), E, 0, A)),
        "alignment": (ValueError, "alignment", lambda: moe.get_fused_mapping(idx, E, 0, 32)),
        "num_experts": (ValueError, "num_experts", lambda: moe.get_fused_mapping(idx, 0, 0, A)),
        "num_expanded_tokens": (ValueError, "num_expanded_tokens", lambda: moe.get_fused_mapping(idx, E, -1, A)),
        "force_no_sync without bound": (ValueError, "force_no_sync",
                                        lambda: moe.get_fused_mapping(idx, E, 0, A, force_no_sync=True)),
        # the scalar checks are memoised: a bool equal to a valid int, or an unhashable value,
        # must still be refused after the valid call that filled the memo
        "num_experts bool": (ValueError, "num_experts must be a positive int",
                             lambda: (moe.get_fused_mapping(idx * 0, 1, 0, A),
                                      moe.get_fused_mapping(idx * 0, True, 0, A))),
        "num_expanded_tokens list": (ValueError, "num_expanded_tokens",
                                     lambda: moe.get_fused_mapping(idx, E, [0], A)),
        "force_no_sync int": (TypeError, "force_no_sync",
                              lambda: (moe.get_fused_mapping(idx, E, 0, A),
                                       moe.get_fused_mapping(idx, E, 0, A, force_no_sync=0))),
        "expand x dtype": (TypeError, "x", lambda: moe.expand_to_fused(x.double(), t2p, p2e)),
        "expand rows": (ValueError, "token_topk_to_pos", lambda: moe.expand_to_fused(x[:3], t2p, p2e)),
        "expand position range": (ValueError, "token_topk_to_pos",
                                  lambda: moe.expand_to_fused(x, t2p, p2e[:1])),
        "expand pos dtype": (TypeError, "token_topk_to_pos", lambda: moe.expand_to_fused(x, t2p.long(), p2e)),
        "sf pair": (TypeError, "pair", lambda: moe.expand_to_fused_with_sf(x, 128, t2p, p2e)),
        "sf shape": (ValueError, "sf", lambda: moe.expand_to_fused_with_sf((x, torch.ones(4, 3)), 128, t2p, p2e)),
        "num_per_channels": (ValueError, "num_per_channels",
                             lambda: moe.expand_to_fused_with_sf((x, torch.ones(4, 4)), 64, t2p, p2e)),
        "packed sf row-major": (ValueError, "use_tma_aligned_col_major_sf",
                                lambda: moe.expand_to_fused_with_sf((x, torch.ones(4, 1, dtype=torch.int32)),
                                                                    128, t2p, p2e)),
        "reduce weights shape": (ValueError, "topk_weights", lambda: moe.reduce_fused(xe, torch.ones(4, 3), t2p)),
        "reduce weights dtype": (TypeError, "topk_weights",
                                 lambda: moe.reduce_fused(xe, torch.ones(4, K).bfloat16(), t2p)),
        "reduce fp8_format": (ValueError, "fp8_format", lambda: moe.reduce_fused(xe, None, t2p, fp8_format="e5m2")),
        # reduce_fused's scalar checks are memoised too: after a valid call, an unhashable
        # format and an sf without FP8 output are still refused
        "reduce fp8_format list": (ValueError, "fp8_format",
                                   lambda: (moe.reduce_fused(xe, None, t2p),
                                            moe.reduce_fused(xe, None, t2p, fp8_format=["e4m3"]))),
        "reduce sf after fp8": (ValueError, "sf is only valid",
                                lambda: (moe.reduce_fused(xe, None, t2p, fp8_format="e4m3", sf=torch.ones(1)),
                                         moe.reduce_fused(xe, None, t2p, sf=torch.ones(1)))),
        "reduce sf without fp8": (ValueError, "sf", lambda: moe.reduce_fused(xe, None, t2p, sf=torch.ones(1))),
        "reduce x_sf shape": (ValueError, "x_sf", lambda: moe.reduce_fused((xe, torch.ones(3)), None, t2p)),
        "reduce out dtype": (TypeError, "out",
                             lambda: moe.reduce_fused(xe, None, t2p, out=torch.empty(4, 256).bfloat16())),
        "reduce positions": (ValueError, "token_topk_to_pos", lambda: moe.reduce_fused(xe[:1], None, t2p)),
        "swiglu odd columns": (ValueError, "x", lambda: kops.swiglu(torch.randn(3, 255))),
        "swiglu dtype": (TypeError, "x", lambda: kops.swiglu(torch.randn(3, 256).double())),
        "swiglu weights": (ValueError, "weights", lambda: kops.swiglu(torch.randn(3, 256), torch.ones(4))),
        "swiglu quantize width": (ValueError, "quantize", lambda: kops.swiglu(torch.randn(3, 128), quantize=True)),
        "swiglu limit": (TypeError, "swiglu_limit", lambda: kops.swiglu(torch.randn(3, 256), swiglu_limit="10")),
    }


@pytest.mark.parametrize("case", sorted(_bad_calls()))
def test_bad_input_raises_a_typed_error_naming_the_argument(case):
    error, name, call = _bad_calls()[case]
    with pytest.raises(error, match=name):
        call()


def test_expand_without_tokens_still_zeroes_the_padding_rows():
    """T = 0 with a force_no_sync bound: every row is padding and comes out zero (TileKernels
    skips the launch and leaves them unwritten)."""
    idx = torch.zeros((0, K), dtype=torch.int64)
    p2e, _, _, t2p, *_ = moe.get_fused_mapping(idx, E, 128, A, force_no_sync=True)
    assert (p2e == -1).all() and t2p.shape == (0, K)
    out, sf = moe.expand_to_fused_with_sf((torch.randn(0, 256).bfloat16(), torch.ones(0, 2)), 128, t2p, p2e)
    assert out.shape == (128, 256) and (out == 0).all() and (sf == 0).all()


@pytest.mark.parametrize("backend,t,experts,alignment", [("cpu", 64, 256, 128), ("cpu", 37, 16, 64),
                                                          ("interp", 9, 32, 128)])
@pytest.mark.parametrize("hidden", [2048, 2056, 40])
def test_expand_writes_data_bits_and_all_zero_padding_into_a_poisoned_buffer(backend, t, experts, alignment,
                                                                              hidden):
    """V4's routing shape at T = 64 (E = 256, k = 6, alignment 128: 98% of the rows are padding,
    zeroed on the host a 32-row tile per non-temporal run) and layouts whose data and padding
    share tiles and whose rows end mid-tile.  The caller's buffer starts with every bit set
    and one row in, so with hidden 2056 (4112-byte rows) no run starts 64-byte aligned: data
    rows must hold the token's bits (a -0.0 stays -0.0), padding rows all-zero bits (+0.0),
    and the rows before and after the N written ones keep their poison."""
    g = torch.Generator().manual_seed(t + hidden)
    idx = torch.stack([torch.randperm(experts, generator=g)[:6] for _ in range(t)])
    idx[torch.rand(idx.shape, generator=g) < 0.1] = -1
    p2e, p2t, _, t2p, *_ = moe.get_fused_mapping(idx, experts, 0, alignment, backend=backend)
    n = p2e.numel()
    x = torch.randn(t, hidden, generator=g).bfloat16()
    x[:, ::7] = -0.0
    buf = torch.full((n + 3, hidden), -1, dtype=torch.int16)
    got = moe.expand_to_fused(x, t2p, p2e, out=buf.view(torch.bfloat16)[1:], backend=backend).view(torch.int16)
    valid = p2e >= 0
    assert (~valid).float().mean() > (0.9 if experts == 256 else 0.3)
    assert torch.equal(got[valid], x.view(torch.int16)[p2t[valid].long()])
    assert (got[~valid] == 0).all(), "padding rows must be +0.0 bits"
    assert (buf[0] == -1).all() and (buf[n + 1:] == -1).all()
