"""The MoE permutation DSL kernels themselves: the catalogue entries on interp and cpu,
the mapping kernels against an independent stable-sort reference over random shapes
(hypothesis) and edge routings on the interpreter (which bounds-checks every access),
one cuda-emu case, and the sm_90a CUDA build with nvcc."""
import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kernforge
from kernforge import backends
from kernforge.kernels import moe_permute as K
from kernforge.kernels.moe_permute.config import choose_expand
from kernforge.kernels.check import run_spec
from kernforge.kernels.moe_permute import problems, reference
from kernforge.kernels.registry import get
from tests.conftest import host_backends

NAMES = ("moe_mapping_scan", "moe_mapping_scatter", "expand_to_fused", "reduce_fused")
POISON = -777


@pytest.mark.parametrize("backend", host_backends("interp", "cpu"))
@pytest.mark.parametrize("name", NAMES)
def test_catalogue_entry_verifies(name, backend):
    result = run_spec(get(name), backend, "small", repeat=1)
    assert result.verified, result.error


def mapping(idx, experts, alignment, n, backend, chunk=64, tail_tile=256):
    """Run both mapping kernels on poisoned outputs; returns the seven tensors in
    TileKernels' order (scan results included)."""
    t, k = idx.shape
    chunks = K.config.num_chunks(t * k, chunk)
    p = dict(num_topk=k, num_experts=experts, alignment=alignment, chunk=chunk)
    i32 = lambda *s: torch.full(s, POISON, dtype=torch.int32)  # noqa: E731
    offset, count, start, end, per = i32(chunks, experts), i32(experts), i32(experts), i32(experts), i32(experts)
    kernforge.compile(K.moe_mapping_scan, backend=backend, **p)(idx, offset, count, start, end, per)
    p2e, p2t, p2tk, t2p = i32(n), i32(n), i32(n), i32(t, k)
    kernforge.compile(K.moe_mapping_scatter, backend=backend, tail_tile=tail_tile, fill_tail=True, **p)(
        idx, offset, count, start, end, p2e, p2t, p2tk, t2p)
    return p2e, p2t, p2tk, t2p, start, end, per


def assert_mapping(got, idx, experts, alignment, n):
    want = reference.mapping(idx, experts, alignment, n)
    names = ("pos_to_expert", "pos_to_token", "pos_to_token_topk", "token_topk_to_pos", "expert_start",
             "expert_end", "num_tokens_per_expert")
    for name, g, w in zip(names, got, want):
        assert torch.equal(g, w), f"{name}: got {g.flatten()[:12].tolist()}, want {w.flatten()[:12].tolist()}"


def edge_routings():
    g = torch.Generator().manual_seed(3)
    return {
        "no tokens": torch.zeros((0, 4), dtype=torch.int64),
        "one token": torch.tensor([[5, 0, 2, 7]]),
        "all on one expert": torch.full((20, 4), 6, dtype=torch.int64),
        "all skipped": torch.full((7, 4), -1, dtype=torch.int64),
        "same expert twice in a row": torch.tensor([[3, 3, -1, 0], [0, 3, 3, 3]]),
        "ragged chunks": torch.randint(-1, 8, (37, 4), generator=g),   # 148 slots: 3 chunks of 64
    }


@pytest.mark.parametrize("case", sorted(edge_routings()))
def test_mapping_edges_on_the_interpreter(case):
    idx = edge_routings()[case]
    n = problems.expanded_rows(*idx.shape, 8, 16) + 40     # a tail past the last segment
    assert_mapping(mapping(idx, 8, 16, n, "interp"), idx, 8, 16, n)


def test_mapping_bound_too_small_drops_rows_in_bounds():
    """Rows at or past the buffer are dropped (token_topk_to_pos -1), never written out of
    bounds: the interpreter would raise on the first such store."""
    idx = torch.tensor([[0, 1], [1, 1], [2, 0]])
    p2e, p2t, p2tk, t2p, start, end, per = mapping(idx, 3, 8, 24, "interp")
    assert start.tolist() == [0, 8, 16] and end.tolist() == [8, 16, 24]
    assert t2p.tolist() == [[0, 8], [9, 10], [16, 1]]
    got = mapping(idx, 3, 8, 17, "interp")
    assert got[3].tolist() == [[0, 8], [9, 10], [16, 1]] and got[0][16].item() == 2
    got = mapping(idx, 3, 8, 16, "interp")       # expert 2's row would be row 16: dropped
    assert got[3].tolist() == [[0, 8], [9, 10], [-1, 1]] and (got[0] != POISON).all()


# compile-time configurations: the catalogue's "small" one (its build is shared with
# test_catalogue_entry_verifies through the session's JIT cache) and one with a single slot
# per token, an odd expert count and DeepGEMM's 64 alignment
CONFIGS = [(6, 8, 16), (1, 33, 64)]


@settings(max_examples=12)
@given(config=st.sampled_from(CONFIGS), t=st.integers(0, 300), extra=st.integers(0, 100),
       skip=st.floats(0, 1), seed=st.integers(0, 2 ** 16))
def test_mapping_matches_stable_sort_reference(config, t, extra, skip, seed):
    k, experts, alignment = config
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, experts, (t, k), generator=g)
    idx[torch.rand((t, k), generator=g) < skip] = -1
    n = problems.expanded_rows(t, k, experts, alignment) + extra
    assert_mapping(mapping(idx, experts, alignment, n, "cpu"), idx, experts, alignment, n)


def test_mapping_on_cuda_emu():
    idx = edge_routings()["ragged chunks"]
    n = problems.expanded_rows(*idx.shape, 8, 16) + 40
    assert_mapping(mapping(idx, 8, 16, n, "cuda-emu"), idx, 8, 16, n)


def test_reduce_on_cuda_emu_matches_cpu_bit_for_bit():
    """Slot-order float32 accumulation: the emulated CUDA kernel and the CPU give one answer."""
    spec = get("reduce_fused")
    params = spec.problems["small"].params
    outs = []
    for backend in ("cuda-emu", "cpu"):
        inputs = spec.make_inputs(params, 5, "cpu")
        kernforge.compile(spec.factory, backend=backend, **params)(*inputs)
        outs.append(inputs[5])
    assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16))


@pytest.mark.nvcc
def test_cuda_sm90a_builds_of_the_op_configurations():
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH")
    from kernforge.backends.cuda.backend import build_report

    # the largest-fragment configurations the ops compile for V4 sizes (the catalogue's
    # problems are built for every arch by tests/backends/test_cuda_compile.py)
    cfg = K.config
    kernels = [
        K.expand_to_fused(**cfg.choose_expand("cuda", 4096, 6, "float8_e4m3", 32, "float32", True)),
        K.reduce_fused(**cfg.choose_reduce("cuda", 4096, 6, "bfloat16", "bfloat16", True, False, False)),
    ]
    with ThreadPoolExecutor(2) as pool:
        reports = list(pool.map(lambda pf: build_report(pf.ir, "sm_90a"), kernels))
    for pf, report in zip(kernels, reports):
        assert report["arch"] == "sm_90a" and report["spill_stores"] == 0, (pf.ir.name, report)


def test_host_expand_streams_the_padding_and_fences_it():
    """The host build of expand_to_fused zeroes padding with non-temporal runs (a whole 32-row
    tile, or one row of a tile that also holds data), ends each block with the store fence,
    and writes data rows with ordinary stores (they are read next, from cache)."""
    kernel = K.expand_to_fused(**choose_expand("cpu", 2048, 6, "bfloat16"))
    src = backends.get("cpu").source(kernel.ir)
    assert src.count("kf::zero_stream(") == 2 and src.count("kf::stream_fence();") == 1
    assert "(int64_t)65536)" in src                    # 32 rows x 2048 columns in one run
    small = backends.get("cpu").source(K.expand_to_fused(hidden=64, num_topk=6).ir)
    assert small.count("kf::zero_stream(") == 1        # a 128-byte row is too short to stream alone


@pytest.mark.parametrize("backend", host_backends("interp", "cpu"))
def test_expand_zeroes_only_padding_rows(backend):
    """The zeroing blocks write exactly the rows with ``pos_to_expert < 0``: with no slot
    mapped (every ``token_topk_to_pos`` -1) the rows of any expert, expert 0 included, keep
    their poison, whether their 32-row tile is mixed, data throughout, or the partial last
    one; the padding rows come out +0.0 bits."""
    n, hidden = 32 * 5 + 7, 2048
    p2e = torch.full((n,), -1, dtype=torch.int32)
    p2e[3:5] = 0                    # tile 0: mixed, its largest id 0
    p2e[32:64] = 7                  # tile 1: data throughout
    p2e[64 + 31] = 0                # tile 2: one expert-0 row at its end
    p2e[n - 2] = 3                  # the partial last tile
    kernel = kernforge.compile(K.expand_to_fused, backend=backend, **choose_expand(backend, hidden, 2, "bfloat16"))
    out = torch.full((n, hidden), -1, dtype=torch.int16)
    one = torch.zeros(1, 1)
    kernel(torch.randn(3, hidden).bfloat16(), one, torch.full((3, 2), -1, dtype=torch.int32), p2e,
           out.view(torch.bfloat16), one)
    data = p2e >= 0
    assert (out[data] == -1).all(), "a data row was written by the zeroing blocks"
    assert (out[~data] == 0).all()


def test_host_streams_only_contiguous_positive_zero_runs():
    """The renderer's streamed fill (what expand_to_fused's padding uses) takes a +0.0 run of a
    row; a -0.0 fill (other bits), a strided column and a non-zero value stay ordinary loops,
    and all four give the right bits."""
    import kernforge.dsl as T

    @T.prim_func
    def fills(a: T.Tensor((4, 1024), "float32"), b: T.Tensor((4, 1024), "float32"),
              c: T.Tensor((1024, 4), "float32"), d: T.Tensor((4, 1024), "float32")):
        with T.Kernel(4, threads=32) as r:
            for i in T.Parallel(1024):
                a[r, i] = T.float32(0.0)
            for i in T.Parallel(1024):
                b[r, i] = T.float32(-0.0)
            for i in T.Parallel(1024):
                c[i, r] = T.float32(0.0)
            for i in T.Parallel(1024):
                d[r, i] = T.float32(1.0)

    assert backends.get("cpu").source(fills.ir).count("kf::zero_stream(") == 1
    a, b, c, d = (torch.full(s, float("nan")) for s in ((4, 1024), (4, 1024), (1024, 4), (4, 1024)))
    kernforge.compile(fills, backend="cpu")(a, b, c, d)
    assert (a.view(torch.int32) == 0).all() and (c.view(torch.int32) == 0).all() and (d == 1).all()
    assert (b.view(torch.int32) == torch.tensor(-0.0).view(torch.int32)).all()
