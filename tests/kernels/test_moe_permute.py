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
from kernforge.kernels import moe_permute as K
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
