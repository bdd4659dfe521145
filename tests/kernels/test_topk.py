"""The TopK DSL kernel itself: both compaction strategies against the torch
reference on the backends present, the registry's specs, and the CUDA source
compiling for sm_90a and sm_100a (no GPU needed)."""
import shutil

import pytest
import torch

import kernforge
from kernforge import backends
from kernforge.kernels import topk as K
from kernforge.kernels.check import run_spec
from kernforge.kernels.registry import get
from tests.conftest import host_backends

BACKENDS = host_backends("interp", "cpu")
# tiny tiles and buffer: every row of a few hundred elements refines several times
SMALL = dict(tile=64, group=8, slack=64)


def _name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def rows(dtype):
    g = torch.Generator().manual_seed(11)
    v = 700
    x = torch.stack([
        torch.randn(v, generator=g),
        torch.arange(v, dtype=torch.float32),                       # ascending: refine per tile
        torch.round(torch.randn(v, generator=g) * 2),                # heavy ties
        torch.full((v,), -3.0),                                      # all equal
        torch.where(torch.arange(v) % 3 == 0, float("-inf"), 1e-40), # -inf and denormals
        torch.randn(v, generator=g),
    ]).to(dtype)
    x[5, 123] = float("nan")
    end = torch.tensor([v, 650, 699, 300, v, v], dtype=torch.int32)
    offset = torch.tensor([0, 5, -5, 100, 0, 1], dtype=torch.int32)
    return x, end, offset


def run(kernel, x, end, offset, k, dtype, itype, rv=True):
    b = x.shape[0]
    nan = torch.full((b,), -1, dtype=torch.int32)
    idx = torch.full((b, k), -77, dtype=itype)
    val = torch.full((b, k), float("nan"), dtype=dtype) if rv else torch.full((1, 1), 7.0, dtype=dtype)
    kernel(x, end, offset, -9, -5.5, nan, idx, val, *K.bit_tables())
    return nan, idx, val


# group 16 without the mask append is the CPU default: each group with survivors is one
# 16-lane chunk of the append idiom (AVX-512 compress), and every buffer compaction is
# an in-place append loop (vector path under the trailing-counter guard)
@pytest.mark.parametrize("compaction,dtype,k,itype,sorted_values,extra", [
    ("group_serial", torch.float32, 16, torch.int64, True, dict(mask_append=True)),
    ("group_serial", torch.bfloat16, 33, torch.int32, False, dict(mask_append=True)),
    ("group_serial", torch.float32, 16, torch.int64, True, dict(group=16, mask_append=False)),
    ("group_serial", torch.float32, 40, torch.int32, False, dict(group=16, mask_append=False)),
    ("group_serial", torch.bfloat16, 33, torch.int64, False, dict(group=16, mask_append=False)),
    ("tile_scan", torch.float32, 33, torch.int32, False, {}),
])
def test_both_compactions_match_reference_on_cpu(compaction, dtype, k, itype, sorted_values, extra):
    if "cpu" not in BACKENDS:
        pytest.skip("cpu backend not available (no C++ compiler)")
    pf = K.topk_select(k=k, dtype=_name(dtype), index_dtype=_name(itype),
                       sorted_values=sorted_values, compaction=compaction, **dict(SMALL, **extra))
    kernel = kernforge.compile(pf, backend="cpu")
    x, end, offset = rows(dtype)
    nan, idx, val = run(kernel, x, end, offset, k, dtype, itype)
    ref_v, ref_i, ref_nan = K.reference(x, k, end, sorted_values, offset, -9, -5.5, itype)
    assert torch.equal(nan, ref_nan)
    assert torch.equal(idx, ref_i)
    bits = torch.int16 if dtype == torch.bfloat16 else torch.int32
    live = ref_nan == 0  # a NaN row's values are unspecified
    assert torch.equal(val[live].view(bits), ref_v[live].view(bits))


# prescan (with the CPU's radix sort of the winners for sorted output):
# the start threshold from the first chunk's group maxima must keep the result
# exact on every row (ascending, ties, all equal, -inf, NaN, short `end`); chunks of 2
# tiles (several chunks per row, k above the chunk's group count: no start threshold),
# 8 (one start threshold, then refinements) and 16 (the whole row is one chunk)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("prescan,dtype,k,itype,sorted_values", [
    (2, torch.float32, 16, torch.int64, True),
    (8, torch.float32, 1, torch.int64, False),
    (8, torch.bfloat16, 33, torch.int32, False),
    (16, torch.float32, 64, torch.int32, True),
    (16, torch.bfloat16, 128, torch.int64, False),
])
def test_prescan_start_threshold_matches_reference(backend, prescan, dtype, k, itype, sorted_values):
    pf = K.topk_select(k=k, dtype=_name(dtype), index_dtype=_name(itype), sorted_values=sorted_values,
                       compaction="group_serial", tile=64, group=8, slack=64, prescan=prescan,
                       sort="radix")
    kernel = kernforge.compile(pf, backend=backend)
    x, end, offset = rows(dtype)
    if backend == "interp":  # the interpreter's cost is per statement: fewer rows
        x, end, offset = x[1:4], end[1:4], offset[1:4]
    nan, idx, val = run(kernel, x, end, offset, k, dtype, itype)
    ref_v, ref_i, ref_nan = K.reference(x, k, end, sorted_values, offset, -9, -5.5, itype)
    assert torch.equal(nan, ref_nan)
    assert torch.equal(idx, ref_i)
    bits = torch.int16 if dtype == torch.bfloat16 else torch.int32
    live = ref_nan == 0
    assert torch.equal(val[live].view(bits), ref_v[live].view(bits))


def test_prescan_k_equal_to_the_row_and_unaligned_lengths():
    """k = vocab (every element wins) and a vocab that is no multiple of the tile or group."""
    if "cpu" not in BACKENDS:
        pytest.skip("cpu backend not available (no C++ compiler)")
    g = torch.Generator().manual_seed(5)
    for vocab, k in ((64, 64), (203, 64), (203, 200)):
        x = torch.randn((3, vocab), generator=g)
        end = torch.tensor([vocab, vocab - 1, min(k, vocab)], dtype=torch.int32)
        offset = torch.zeros(3, dtype=torch.int32)
        pf = K.topk_select(k=k, dtype="float32", index_dtype="int64", compaction="group_serial",
                           tile=64, group=8, slack=64, prescan=32, sorted_values=True, sort="radix")
        nan, idx, val = run(kernforge.compile(pf, backend="cpu"), x, end, offset, k, torch.float32, torch.int64)
        ref_v, ref_i, _ = K.reference(x, k, end, True, offset, -9, -5.5)
        assert torch.equal(idx, ref_i), (vocab, k)
        assert torch.equal(val.view(torch.int32), ref_v.view(torch.int32)), (vocab, k)


@pytest.mark.parametrize("k,sorted_values", [(8, False), (64, True), (512, False)])
def test_short_row_configuration_matches_reference(k, sorted_values):
    """The CPU chooser's short-row configuration (rows of at most SHORT_ROW scores: the
    engine's indexer) against the reference, with ragged ends (the indexer's causal rows),
    ties and -inf padding; `row_bucket` sends longer rows (and unknown ones) to the long one."""
    if "cpu" not in BACKENDS:
        pytest.skip("cpu backend not available (no C++ compiler)")
    from kernforge.kernels.topk import config
    short = config.choose.heuristic("cpu", k, "float32", "int64", sorted_values, True,
                                    row=config.row_bucket(config.SHORT_ROW))
    long_ = config.choose.heuristic("cpu", k, "float32", "int64", sorted_values, True,
                                    row=config.row_bucket(config.SHORT_ROW + 1))
    assert (short["tile"], short["prescan"]) == (256, 0) and (long_["tile"], long_["prescan"]) == (1024, 128)
    assert long_ == config.choose.heuristic("cpu", k, "float32", "int64", sorted_values, True)
    g = torch.Generator().manual_seed(k)
    for vocab in (64, 257, 1024):
        x = torch.randn((6, vocab), generator=g)
        x[1] = torch.round(x[1] * 2)  # heavy ties
        x[2, vocab // 2:] = float("-inf")  # the engine pads rows past a sequence's keys with -inf
        end = torch.tensor([vocab, vocab - 1, vocab // 2, 1, 0, min(k, vocab)], dtype=torch.int32)
        offset = torch.zeros(6, dtype=torch.int32)
        nan, idx, val = run(kernforge.compile(K.topk_select, backend="cpu", **short), x, end, offset, k,
                            torch.float32, torch.int64)
        ref_v, ref_i, _ = K.reference(x, k, end, sorted_values, offset, -9, -5.5)
        assert torch.equal(idx, ref_i), vocab
        assert torch.equal(val.view(torch.int32), ref_v.view(torch.int32)), vocab


@pytest.mark.parametrize("compaction", ["group_serial", "tile_scan"])
def test_interpreter_runs_both_compactions(compaction):
    pf = K.topk_select(k=8, dtype="float32", index_dtype="int64", compaction=compaction, return_value=False,
                       **SMALL)
    kernel = kernforge.compile(pf, backend="interp")
    x, end, offset = rows(torch.float32)
    x, end, offset = x[:3, :200], torch.tensor([200, 150, 0], dtype=torch.int32), offset[:3]
    nan, idx, val = run(kernel, x, end, offset, 8, torch.float32, torch.int64, rv=False)
    assert torch.equal(idx, K.reference(x, 8, end, False, offset, -9)[1])
    assert float(val[0, 0]) == 7.0  # return_value=False: the values buffer is never touched


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["topk_fp32", "topk_bf16"])
def test_registry_specs_verify(backend, name):
    result = run_spec(get(name), backend, "small", repeat=1)
    assert result.verified, result.error


@pytest.mark.parametrize("name", ["topk_fp32", "topk_bf16"])
def test_registry_demo_problem_on_cpu(name):
    """The defaults the CLI's `run`/`demo` use build and verify (group_serial, mask append)."""
    if "cpu" not in BACKENDS:
        pytest.skip("cpu backend not available (no C++ compiler)")
    result = run_spec(get(name), "cpu", "demo", repeat=1)
    assert result.verified, result.error


def test_factory_rejects_bad_parameters():
    with pytest.raises(ValueError, match="dtype"):
        K.topk_select(k=4, dtype="float16")
    with pytest.raises(ValueError, match="compaction"):
        K.topk_select(k=4, compaction="magic")
    with pytest.raises(ValueError, match="multiple of group"):
        K.topk_select(k=4, tile=100, group=16, compaction="tile_scan")
    with pytest.raises(ValueError, match="8-bit group masks"):
        K.topk_select(k=4, group=16, mask_append=True)
    with pytest.raises(ValueError, match="sort"):
        K.topk_select(k=4, sort="bogo")
    with pytest.raises(ValueError, match="prescan"):
        K.topk_select(k=4, prescan=8, compaction="tile_scan")
    with pytest.raises(ValueError, match="prescan"):
        K.topk_select(k=600, tile=64, group=8, prescan=8)  # 64 group maxima per chunk < k


def _cuda_backend():
    try:
        return backends.get("cuda")
    except backends.BackendError as e:
        pytest.skip(f"CUDA backend module absent: {e}")


def test_cuda_source_renders_for_both_archs():
    cuda = _cuda_backend()
    from kernforge.ops.topk import kernel_params

    pf = K.topk_select(**kernel_params("cuda", 512, "bfloat16", "int32", False, False))
    sources = {arch: cuda.source(pf.ir, arch) for arch in ("sm_90a", "sm_100a")}
    for arch, src in sources.items():
        # the CUDA renderer's own header and entry point (the CPU source has the same symbol,
        # as `extern "C" int kf_topk_select_kernel(void** args, ...)`)
        assert src.startswith(f"// Generated by kernforge: kernel topk_select_kernel for {arch} (256 threads, ")
        assert 'extern "C" __global__ void __launch_bounds__(256, 1) kf_topk_select_kernel(' in src
        assert "void** args" not in src
    # nothing in TopK is arch-specific: the two sources differ in their header line only
    assert sources["sm_90a"].split("\n", 1)[1] == sources["sm_100a"].split("\n", 1)[1]


@pytest.mark.nvcc
@pytest.mark.slow
@pytest.mark.parametrize("arch,dtype,itype,sorted_values", [
    ("sm_90a", "float32", "int64", True),
    ("sm_100a", "bfloat16", "int32", False),
])
def test_cuda_source_compiles(arch, dtype, itype, sorted_values):
    _cuda_backend()
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH")
    from kernforge.backends.cuda.backend import build_report
    from kernforge.ops.topk import kernel_params

    pf = K.topk_select(**kernel_params("cuda", 64, dtype, itype, sorted_values, True))
    report = build_report(pf.ir, arch)
    assert report["arch"] == arch and report["spill_stores"] == 0
    assert report["shared_bytes"] <= 227 * 1024
