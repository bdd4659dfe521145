"""The FP8 KV page kernels (`kernforge.kernels.kv_quant`, `ops.fp8_kv_quantize` /
`ops.fp8_kv_dequantize`): byte for byte the engine's former torch steps (the oracles in the
family's reference.py) on interp and cpu, non-finite values and every scale byte included,
lossless for QAT-rounded rows, with every output byte written."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kernforge
from kernforge import ops
from kernforge.kernels import kv_quant as KV
from kernforge.kernels.check import run_spec
from kernforge.kernels.kv_quant.problems import kv_rows, pages_of
from kernforge.kernels.registry import get
from tests.conftest import host_backends

BACKENDS = host_backends("interp", "cpu")


def same_bits(got, want):
    view = {1: torch.uint8, 2: torch.int16}[got.element_size()]
    return got.shape == want.shape and torch.equal(got.view(view), want.view(view))


def edge_rows(nope, rope, dtype, seed=0):
    """Random rows plus: a zero row, one below the 1e-4 amax floor, blocks whose amax / 448 is
    exactly a power of two (no step up) or one ulp above it, -0.0, NaN and +-inf in nope and
    rope dims, and values rounding to e4m3 ties."""
    x = kv_rows(12, nope + rope, torch.float32, seed)
    x[0] = 0.0
    x[1] = 1e-6
    x[2, :64] = 0.0
    x[2, 5] = 448.0 * 2.0 ** -9  # amax / 448 = 2^-9 exactly
    x[3, :64] = 1.0
    x[3, 9] = float(torch.tensor(448.0 * 2.0 ** -9).nextafter(torch.tensor(1.0)))  # one ulp above
    x[4, :64] = torch.tensor([-0.0, 0.0, 1.0, -1.0] * 16)
    x[5, 3] = float("nan")
    x[6, nope - 1] = float("inf")
    x[7, 0] = -float("inf")
    if rope:
        x[8, nope] = float("nan")
        x[9, nope + rope - 1] = -float("inf")
    x[10, 0] = 448.0  # scale 1: the block's values are their own e4m3 inputs,
    x[10, 1:64] = 17.0 + torch.arange(63)  # 17, 19, .., 34, 38, .., 68, 76: halfway between codes
    return x.to(dtype)


def run_quantize(backend, values, nope):
    n, width = values.shape
    lay = KV.PageLayout(nope, width - nope)
    data = torch.full((n, lay.token_bytes), 0xA5, dtype=torch.uint8)  # poisoned
    scales = torch.full((n, lay.scale_bytes), 0xA5, dtype=torch.uint8)
    params = KV.config.choose_quantize.heuristic(backend, nope, width - nope, str(values.dtype)[6:])
    kernel = kernforge.compile(KV.fp8_kv_quantize, backend=backend, **params)
    kernel(values, data, scales)
    return data, scales


def run_dequantize(backend, pages, lay, block_tokens):
    out = torch.full((pages.shape[0], lay.block_size, lay.nope + lay.rope), float("nan"), dtype=torch.bfloat16)
    kernel = kernforge.compile(KV.fp8_kv_dequantize, backend=backend, nope=lay.nope, rope=lay.rope,
                               block_size=lay.block_size, block_tokens=block_tokens)
    kernel(pages, out)
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("nope,rope", [(64, 0), (128, 32), (448, 64)])
def test_quantize_is_the_oracle_byte_for_byte(backend, dtype, nope, rope):
    values = edge_rows(nope, rope, dtype, seed=nope + rope)
    data, scales = run_quantize(backend, values, nope)
    want = KV.quantize_reference(values, KV.PageLayout(nope, rope))
    assert same_bits(data, want[0]), (data != want[0]).nonzero()[:5].tolist()
    assert same_bits(scales, want[1]), (scales != want[1]).nonzero()[:5].tolist()
    nb = nope // 64
    assert scales[0, :nb].tolist() == [127 - 22] * nb  # the floor: 1e-4 / 448 rounds up to 2^-22
    assert scales[2, 0] == 127 - 9 and scales[3, 0] == 127 - 8  # exact power of two stays, ulp above steps
    assert (scales[:, nb:] == 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("block_tokens", [16, 5])
def test_dequantize_is_the_oracle_on_any_bytes(backend, block_tokens):
    """Random bytes: NaN codes, scale bytes 0 (2^-127, subnormal) and 255 (infinity), and
    a block of tokens that does not divide the page."""
    lay = KV.PageLayout(128, 32, 16)
    pages = torch.randint(0, 256, (3, lay.page_bytes), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    scale_at = lay.block_size * lay.token_bytes
    pages[0, scale_at:scale_at + 2] = torch.tensor([0, 255], dtype=torch.uint8)
    out = run_dequantize(backend, pages, lay, block_tokens)
    want = KV.fp8_kv_dequantize_pages(pages, lay)[:, :, 0]
    assert same_bits(out, want), (out.view(torch.int16) != want.view(torch.int16)).nonzero()[:5].tolist()


@pytest.mark.parametrize("backend", BACKENDS)
def test_round_trip_is_lossless_for_qat_rows(backend):
    """Nope blocks that are e4m3 codes times a power of two and bf16 rope dims (what the
    model's QAT writes) come back unchanged, through the ops and the page layout."""
    g = torch.Generator().manual_seed(2)
    nope, rope, bs = 448, 64, 8
    codes = (torch.randn(2 * bs, nope // 64, 64, generator=g) * 300).clamp(-448, 448).to(torch.float8_e4m3fn)
    scale = 2.0 ** torch.randint(-20, 5, (2 * bs, nope // 64, 1), generator=g).float()
    rows = torch.cat([(codes.float() * scale).flatten(1), torch.randn(2 * bs, rope, generator=g).bfloat16().float()], 1)
    data, scales = ops.fp8_kv_quantize(rows, nope, backend=backend)
    pages = torch.cat([data.view(2, -1), scales.view(2, -1)], 1).contiguous()
    back = ops.fp8_kv_dequantize(pages, nope, rope, bs, backend=backend)
    assert back.shape == (2, bs, 1, nope + rope) and back.dtype == torch.bfloat16
    assert torch.equal(back.float().flatten(0, 2).view(2 * bs, -1), rows)


@settings(max_examples=10)
@given(n=st.integers(1, 5), blocks=st.integers(1, 3), rope=st.integers(0, 40), bs=st.integers(1, 9),
       bt=st.integers(1, 4), bf16=st.booleans(), seed=st.integers(0, 99))
def test_property_random_shapes_on_the_interpreter(n, blocks, rope, bs, bt, bf16, seed):
    nope = 64 * blocks
    values = kv_rows(n, nope + rope, torch.bfloat16 if bf16 else torch.float32, seed)
    lay = KV.PageLayout(nope, rope, bs)
    got = ops.fp8_kv_quantize(values, nope, backend="interp")
    want = KV.quantize_reference(values, lay)
    assert same_bits(got[0], want[0]) and same_bits(got[1], want[1])
    pages = pages_of(kv_rows(2 * bs, nope + rope, torch.float32, seed + 1), lay)
    out = run_dequantize("interp", pages, lay, min(bt, bs))
    assert same_bits(out, KV.fp8_kv_dequantize_pages(pages, lay)[:, :, 0])


def test_empty_batches_give_empty_results():
    data, scales = ops.fp8_kv_quantize(torch.zeros(0, 96), 64)
    assert data.shape == (0, 128) and scales.shape == (0, 8)
    assert ops.fp8_kv_dequantize(torch.zeros(0, 4 * 136, dtype=torch.uint8), 64, 32, 4).shape == (0, 4, 1, 96)


def test_bad_arguments_raise_typed_errors_naming_them():
    v = torch.zeros(3, 96)
    pages = torch.zeros(2, 4 * 136, dtype=torch.uint8)
    with pytest.raises(ops.KVQuantTypeError, match="values must be a torch.Tensor"):
        ops.fp8_kv_quantize(v.numpy(), 64)
    with pytest.raises(ops.KVQuantTypeError, match="values must have dtype"):
        ops.fp8_kv_quantize(v.half(), 64)
    with pytest.raises(ops.KVQuantValueError, match="values must be 2-D"):
        ops.fp8_kv_quantize(v[0], 64)
    with pytest.raises(ops.KVQuantValueError, match="values must be contiguous"):
        ops.fp8_kv_quantize(torch.zeros(96, 3).t(), 64)
    with pytest.raises(ops.KVQuantValueError, match="nope must be a positive multiple of 64"):
        ops.fp8_kv_quantize(v, 32)
    with pytest.raises(ops.KVQuantValueError, match="nope must be an int"):
        ops.fp8_kv_quantize(v, True)
    with pytest.raises(ops.KVQuantValueError, match="at least nope=128 columns"):
        ops.fp8_kv_quantize(v, 128)
    with pytest.raises(ops.KVQuantTypeError, match="pages must have dtype"):
        ops.fp8_kv_dequantize(pages.float(), 64, 32, 4)
    with pytest.raises(ops.KVQuantValueError, match=r"pages must be \[P, 544\]"):
        ops.fp8_kv_dequantize(pages[:, :-1].contiguous(), 64, 32, 4)
    with pytest.raises(ops.KVQuantValueError, match="rope must be an int >= 0"):
        ops.fp8_kv_dequantize(pages, 64, -1, 4)
    with pytest.raises(ops.KVQuantValueError, match="block_size must be an int >= 1"):
        ops.fp8_kv_dequantize(pages, 64, 32, 0)
    with pytest.raises(ValueError, match="nope"):
        KV.fp8_kv_quantize(nope=100, rope=0)
    with pytest.raises(ValueError, match="dtype"):
        KV.fp8_kv_quantize(nope=64, rope=0, dtype="float16")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["fp8_kv_quantize", "fp8_kv_dequantize"])
def test_registry_specs_verify(backend, name):
    result = run_spec(get(name), backend, "small", repeat=1)
    assert result.verified, result.error


def test_registry_check_catches_one_wrong_byte():
    spec = get("fp8_kv_dequantize")
    params = spec.problems["small"].params
    ins = spec.make_inputs(params, 0, "cpu")
    want = spec.reference(ins, params)
    wrong = want[0].clone()
    wrong.view(torch.int16)[1, 2, 3] ^= 1
    with pytest.raises(AssertionError, match="pages differ"):
        spec.check([wrong], want, ins, params)


def test_cuda_emu_runs_each_kernel():
    """CUDA semantics on the host at a tiny size (cuda-emu compiles are slow)."""
    if "cuda-emu" not in host_backends("cuda-emu"):
        pytest.skip("cuda-emu not available")
    values = edge_rows(64, 32, torch.float32, seed=9)
    data, scales = run_quantize("cuda-emu", values, 64)
    want = KV.quantize_reference(values, KV.PageLayout(64, 32))
    assert same_bits(data, want[0]) and same_bits(scales, want[1])
    lay = KV.PageLayout(64, 32, 4)
    pages = pages_of(kv_rows(8, 96, torch.float32, 3), lay)
    assert same_bits(run_dequantize("cuda-emu", pages, lay, 3), KV.fp8_kv_dequantize_pages(pages, lay)[:, :, 0])
