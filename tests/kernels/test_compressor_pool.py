"""The compressor pooling kernel (``ops.compressor_pool``) against a float64 torch reference
and the model's ``Compressor._pool``, at ratio 4 (overlapping halves) and other ratios, with
absent (-inf) rows, rows past the last entry that must not be read, poisoned outputs and
hypothesis shapes, on interp and cpu (cuda-emu at a tiny size); and the engine's
``compressor_pool`` step (pool + RMSNorm + RoPE + Hadamard/FP4 or FP8) against the model's
``_finish(_pool(...))``."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kernforge
from kernforge import ops
from kernforge.engine import kernel_steps as ks
from kernforge.kernels import compressor as C
from kernforge.kernels.check import run_spec
from kernforge.kernels.registry import get
from kernforge.model import random_model, tiny
from kernforge.ops.compressor import CompressorTypeError, CompressorValueError
from tests.conftest import host_backends

BACKENDS = host_backends("interp", "cpu")


def projections(n, r, d, overlap, dtype=torch.float32, seed=0, extra=3):
    """kv, score for n entries plus `extra` rows of a partial block, which are NaN: a kernel
    that read past row (n + 1) * r would show it. Half of block 0 is absent (-inf)."""
    g = torch.Generator().manual_seed(seed)
    w = 2 * d if overlap else d
    rows = (n + 1) * r
    kv = torch.randn(rows + extra, w, generator=g)
    score = torch.randn(rows + extra, w, generator=g) * 4.0
    score[:max(1, r // 2)] = float("-inf")
    kv[rows:] = float("nan")
    score[rows:] = float("nan")
    return kv.to(dtype), score.to(dtype)


def model_pool(kv, score, n, r, d, overlap):
    """The model's `_pool` on the same rows (a Compressor with only the fields it reads)."""
    from kernforge.model.compressor import Compressor

    comp = Compressor.__new__(Compressor)
    comp.head_dim, comp.overlap = d, overlap
    rows = (n + 1) * r
    return comp._pool(kv[None, :rows].unflatten(1, (n + 1, r)), score[None, :rows].unflatten(1, (n + 1, r)), n)[0]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("r,overlap,d", [(4, True, 96), (4, True, 64), (128, False, 32), (8, False, 48)])
def test_pool_matches_the_reference_and_the_model(backend, r, overlap, d):
    n = 3
    kv, score = projections(n, r, d, overlap, seed=r + d)
    got = ops.compressor_pool(kv, score, n, r, overlap, backend=backend)
    want = C.reference.compressor_pool(kv, score, n, r, overlap)
    assert got.dtype == torch.float32 and got.shape == (n, d)
    torch.testing.assert_close(got.double(), want, atol=2e-6, rtol=2e-6)
    torch.testing.assert_close(got, model_pool(kv, score, n, r, d, overlap), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("r,overlap,d,dtype", [(4, True, 64, torch.float32), (8, False, 48, torch.float32),
                                               (4, True, 32, torch.bfloat16)])
def test_pool_adds_the_gate_position_bias(backend, r, overlap, d, dtype):
    """`ape [ratio, width]`: row i's gates are score[i] + ape[i % ratio] rounded to the dtype,
    the model's `wgate(x) + ape`: the same entries as pooling the pre-biased scores (float32:
    within the kernel's float32 tolerance of the model's pool; bf16: of the float64 reference)."""
    n = 5
    kv, score = projections(n, r, d, overlap, dtype=dtype, seed=r * d)
    g = torch.Generator().manual_seed(d)
    ape = (torch.randn(r, score.shape[1], generator=g) * 3.0).to(dtype)
    got = ops.compressor_pool(kv, score, n, r, overlap, ape, backend=backend)
    rows = torch.arange(score.shape[0])
    biased = score + ape[rows % r]  # in the dtype, as the model adds it
    want = C.reference.compressor_pool(kv, score, n, r, overlap, ape)
    torch.testing.assert_close(want, C.reference.compressor_pool(kv, biased, n, r, overlap))
    tol = 2e-6 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.double(), want, atol=tol, rtol=tol)
    if dtype == torch.float32:
        torch.testing.assert_close(got, model_pool(kv, biased, n, r, d, overlap), atol=1e-6, rtol=1e-6)
        # a bias that differs per position changes the entries (the kernel does not drop it)
        assert (got - ops.compressor_pool(kv, score, n, r, overlap, backend=backend)).abs().max() > 1e-3
    with pytest.raises(CompressorValueError, match="ape"):
        ops.compressor_pool(kv, score, n, r, overlap, ape[:, 1:].contiguous(), backend=backend)
    with pytest.raises(CompressorTypeError, match="ape"):
        ops.compressor_pool(kv, score, n, r, overlap, ape.double(), backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_pool_bf16_rounds_like_the_model(backend):
    kv, score = projections(4, 4, 64, True, torch.bfloat16, seed=5)
    got = ops.compressor_pool(kv, score, 4, 4, True, backend=backend)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), model_pool(kv, score, 4, 4, 64, True).float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_dominant_candidate_and_all_absent_channels(backend):
    """A score far above the rest takes the whole weight (the kv value itself); a channel whose
    candidates are all absent is NaN, as the model's softmax makes it."""
    kv, score = projections(2, 4, 32, True, seed=6, extra=0)
    score[5, 3] = 1e4  # entry 1, channel 3: its previous block's (block 1's) row 1, first half
    score[:, [7, 32 + 7]] = float("-inf")  # channel 7: no candidate in either half
    got = ops.compressor_pool(kv, score, 2, 4, True, backend=backend)
    want = model_pool(kv, score, 2, 4, 32, True)
    assert got[1, 3] == kv[5, 3] and got[0, 3] != kv[5, 3]
    assert torch.isnan(got[:, 7]).all() and torch.isnan(want[:, 7]).all()
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6, equal_nan=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_output_is_written(backend):
    kv, score = projections(5, 4, 64, True, seed=7, extra=0)
    k = kernforge.compile(C.compressor_pool, backend=backend, **C.choose(backend, 64, 4, True, "float32"))
    out = torch.full((5, 64), float("nan"))
    k(kv, score, torch.zeros(4, 128), out)
    assert not torch.isnan(out).any()


@settings(max_examples=8, deadline=None)
@given(n=st.integers(1, 4), r=st.sampled_from([1, 2, 4, 16]), d=st.sampled_from([8, 24, 64]),
       overlap=st.booleans(), seed=st.integers(0, 999))
def test_property_shapes_on_the_interpreter(n, r, d, overlap, seed):
    kv, score = projections(n, r, d, overlap, seed=seed)
    got = ops.compressor_pool(kv, score, n, r, overlap, backend="interp")
    torch.testing.assert_close(got.double(), C.reference.compressor_pool(kv, score, n, r, overlap),
                               atol=2e-6, rtol=2e-6)


def test_cuda_emu_tiny():
    if "cuda-emu" not in host_backends("cuda-emu"):
        pytest.skip("cuda-emu not available")
    kv, score = projections(2, 4, 32, True, seed=8)
    got = ops.compressor_pool(kv, score, 2, 4, True, backend="cuda-emu")
    torch.testing.assert_close(got.double(), C.reference.compressor_pool(kv, score, 2, 4, True),
                               atol=2e-6, rtol=2e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_registry_spec_verifies(backend):
    result = run_spec(get("compressor_pool"), backend, "small", repeat=1)
    assert result.verified, result.error


def test_registry_check_catches_a_wrong_entry():
    spec = get("compressor_pool")
    params = spec.problems["small"].params
    inputs = spec.make_inputs(params, 0, "cpu")
    want = spec.reference(inputs, params)
    bad = want[0].float().clone()
    bad[1, 2] += 1e-3
    with pytest.raises(AssertionError, match="max error"):
        spec.check([bad], want, inputs, params)


@pytest.mark.parametrize("fake_quant", [False, True])
def test_engine_step_is_the_models_pool_and_finish(fake_quant):
    """`ks.compressor_pool` (the pool kernel, then the rms_norm, rope, hadamard and fake-quant
    kernels) against `Compressor._finish(_pool(...))`: the main ratio-4 and ratio-128
    compressors (FP8 on the nope dims) and the indexer's (Hadamard, FP4)."""
    model = random_model(tiny(fake_quant=fake_quant), seed=0)
    layers = [layer.attn for layer in model.layers if layer.attn.compress_ratio]
    comps = [a.compressor for a in layers] + [a.indexer.compressor for a in layers if a.indexer is not None]
    assert {c.ratio for c in comps} == {4, 128} and any(c.rotate for c in comps)
    g = torch.Generator().manual_seed(9)
    for comp in comps:
        n, first, r = 2, 3, comp.ratio
        kv = torch.randn((n + 1) * r, comp.width, generator=g)
        score = torch.randn((n + 1) * r, comp.width, generator=g)
        chosen, entry_ids = torch.arange(n), torch.arange(first, first + n)  # every entry, numbered from first
        got = ks.compressor_pool(comp, ops.rope_cos_sin(comp.rope), kv, score, n, chosen, entry_ids, "cpu")
        biased = score + comp.ape.detach()[torch.arange(score.shape[0]) % r]  # the model's wgate(x) + ape
        blocks = (kv[None].unflatten(1, (n + 1, r)), biased[None].unflatten(1, (n + 1, r)))
        pooled = comp._pool(*blocks, n)
        want = comp._finish(pooled, first)[0]
        if not fake_quant:
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
            continue
        # an ulp in the pooled entry may move one FP8/FP4 code: compare against the model's
        # rounding of the unrounded kernel chain's result instead, bit for bit
        comp.fake_quant = False
        try:
            unrounded = ks.compressor_pool(comp, ops.rope_cos_sin(comp.rope), kv, score, n, chosen, entry_ids, "cpu")
        finally:
            comp.fake_quant = True
        if comp.rotate:
            from kernforge.model.quant import fake_quant_fp4

            assert torch.equal(got, fake_quant_fp4(unrounded))
        else:
            from kernforge.model.quant import fake_quant_fp8

            d = comp.rope_dim
            assert torch.equal(got, torch.cat([fake_quant_fp8(unrounded[:, :-d]), unrounded[:, -d:]], -1))
        torch.testing.assert_close(got, want, atol=0.1, rtol=0.1)


def test_bad_arguments_raise_named_errors():
    kv, score = projections(2, 4, 32, True, extra=0)
    with pytest.raises(CompressorTypeError, match="kv must be a torch.Tensor"):
        ops.compressor_pool(kv.numpy(), score, 2, 4, True)
    with pytest.raises(CompressorTypeError, match="score must be float32 or bfloat16"):
        ops.compressor_pool(kv, score.half(), 2, 4, True)
    with pytest.raises(CompressorValueError, match="score must match kv"):
        ops.compressor_pool(kv, score.bfloat16(), 2, 4, True)
    with pytest.raises(CompressorValueError, match="kv must be 2-D"):
        ops.compressor_pool(kv[None], score[None], 2, 4, True)
    with pytest.raises(CompressorValueError, match="score must be contiguous"):
        ops.compressor_pool(kv, score.T.contiguous().T, 2, 4, True)
    with pytest.raises(CompressorTypeError, match="overlap must be a bool"):
        ops.compressor_pool(kv, score, 2, 4, 1)
    with pytest.raises(CompressorTypeError, match="n_entries must be an int"):
        ops.compressor_pool(kv, score, 2.0, 4, True)
    with pytest.raises(CompressorValueError, match="ratio must be >= 1"):
        ops.compressor_pool(kv, score, 2, 0, True)
    with pytest.raises(CompressorValueError, match="12 rows; 3 entries at ratio 4 read 16"):
        ops.compressor_pool(kv, score, 3, 4, True)
    with pytest.raises(CompressorValueError, match="even with overlap"):
        ops.compressor_pool(kv[:, :63].contiguous(), score[:, :63].contiguous(), 2, 4, True)
    assert ops.compressor_pool(kv, score, 0, 4, True).shape == (0, 32)
    with pytest.raises(ValueError, match="block_d 32 does not divide head_dim 48"):
        C.compressor_pool(head_dim=48, ratio=4, overlap=True, block_d=32)
    with pytest.raises(ValueError, match="dtype"):
        C.compressor_pool(head_dim=32, ratio=4, overlap=True, dtype="float16")
