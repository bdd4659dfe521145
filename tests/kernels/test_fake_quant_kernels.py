"""The QAT fake-quant kernels (``ops.fake_quant_fp8`` / ``ops.fake_quant_fp4``): bit for bit the
model's ``fake_quant_fp8`` / ``fake_quant_fp4`` (the oracle the engine must reproduce), on
random rows, edge values (zeros, all-equal blocks, subnormals, values near the float32
maximum, scale boundaries, e2m1 ties, NaN and infinity blocks), hypothesis shapes, and with
poisoned outputs, on interp and cpu (cuda-emu at a tiny size)."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernforge import ops
from kernforge.kernels import quant as Q
from kernforge.kernels.check import run_spec
from kernforge.kernels.registry import get
from kernforge.model.quant import fake_quant_fp4, fake_quant_fp8
from kernforge.ops.quant import QuantTypeError, QuantValueError
from tests.conftest import host_backends

BACKENDS = host_backends("interp", "cpu")
FP8_DTYPES = [torch.float32, torch.bfloat16]
INT = {4: torch.int32, 2: torch.int16}


def same(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Bit equality, with NaN equal to NaN wherever both are NaN (payloads may differ)."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    bits = INT[got.element_size()]
    nan = torch.isnan(want)
    return torch.equal(torch.isnan(got), nan) and torch.equal(got.view(bits)[~nan], want.view(bits)[~nan])


def rows(shape, dtype=torch.float32, seed=0):
    """Random blocks with magnitudes from 2^-40 (below both amax floors) to 2^30."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-40, 30, shape[:-1] + (1,), generator=g).float())
    return x.to(dtype)


def edge_rows(block: int) -> torch.Tensor:
    """One block per row: the values where a scale or a rounding could go wrong."""
    f32 = torch.finfo(torch.float32)
    r = torch.zeros(12, block)
    r[1] = 3.0  # all equal
    r[2] = -1e-39  # subnormal, below the amax floor
    r[3, ::2] = f32.max  # near the float32 maximum: the largest scales
    r[3, 1::2] = -f32.max / 3
    r[4] = torch.linspace(-f32.tiny * 4, f32.tiny * 4, block)  # around the smallest normal
    r[5, 0] = 448.0 * 2.0 ** -9 * (1 + 2.0 ** -23)  # amax / 448 one ulp above a power of two
    r[5, 1:] = torch.linspace(-1, 1, block - 1) * 2.0 ** -9
    r[6, 0] = 6.0 * 2.0 ** -5  # amax / 6 exactly a power of two
    r[6, 1:] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.0]).repeat(block)[:block - 1] * 2.0 ** -5
    r[7, :8] = torch.tensor([-0.0, 0.0, -0.0, 1e-45, -1e-45, 2e-38, -3e-39, 1e-30])[:block]
    r[8, 3] = float("nan")  # a NaN block: the model's scale is 1
    r[8, 4:] = torch.linspace(-1000, 1000, block - 4)
    r[9, 0] = float("inf")  # an infinite block: scale 1 too, e4m3 saturating at 448
    r[9, 1] = float("-inf")
    r[9, 2:] = torch.linspace(-600, 7, block - 2)
    r[10] = torch.tensor(float("nan"))  # all NaN
    r[11] = -1e-4  # exactly the FP8 amax floor
    return r


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", FP8_DTYPES)
def test_fp8_is_the_model_bit_for_bit(backend, dtype):
    x = rows((3, 5, 448), dtype)  # the window KV's nope dims: 7 blocks of 64
    assert same(ops.fake_quant_fp8(x, backend=backend), fake_quant_fp8(x))


@pytest.mark.parametrize("backend", BACKENDS)
def test_fp4_is_the_model_bit_for_bit(backend):
    x = rows((7, 4, 64), seed=1)  # the indexer q [tokens, heads, head_dim]
    assert same(ops.fake_quant_fp4(x, backend=backend), fake_quant_fp4(x))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", FP8_DTYPES)
def test_fp8_edge_values(backend, dtype):
    x = edge_rows(64).to(dtype)
    got, want = ops.fake_quant_fp8(x, backend=backend), fake_quant_fp8(x)
    assert same(got, want)
    assert got[9, 0] == 448.0 and got[9, 1] == -448.0  # infinity saturates with the block's scale 1
    assert torch.isnan(got[10]).all() and got[0].eq(0).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_fp8_rounds_every_e4m3_interval_as_torch(backend):
    """The kernel rounds in float32 arithmetic (`_round_e4m3`), not through an e4m3 cast: in
    blocks of scale 1 (amax 448), every e4m3 value, every midpoint between neighbours (ties to
    even) and the float32 values one ulp either side of each midpoint, both signs, against
    torch's own float32 -> float8_e4m3fn -> float32 conversion."""
    grid = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()  # 0 .. 448
    mid = (grid[:-1] + grid[1:]) / 2
    vals = torch.cat([grid, mid, torch.nextafter(mid, torch.zeros(())), torch.nextafter(mid, grid[1:])])
    vals = torch.cat([vals, -vals])
    vals = torch.cat([vals, vals.new_zeros(-vals.numel() % 63)]).view(-1, 63)
    x = torch.cat([torch.full((vals.shape[0], 1), 448.0), vals], dim=1)  # every block's scale is 1
    got = ops.fake_quant_fp8(x, backend=backend)
    assert same(got, x.to(torch.float8_e4m3fn).float())


@pytest.mark.parametrize("backend", host_backends("cpu"))
def test_fp8_bf16_every_amax(backend):
    """One block per finite positive bf16 amax: the kernel computes the scale in float32, the
    model in bf16; they agree for every one.  Beside the amax, values that land in e4m3's
    subnormals after scaling, where a scale off by two would round differently (in e4m3's
    normal range the scale does not change the rounding)."""
    amax = torch.arange(1, 0x7F80, dtype=torch.int16).view(torch.bfloat16)
    x = torch.zeros(amax.numel(), 64, dtype=torch.bfloat16)
    x[:, 0], x[:, 1] = amax, -amax
    x[:, 2:10] = amax[:, None] * torch.tensor([2.0 ** -e * 1.3 for e in range(12, 20)], dtype=torch.bfloat16)
    assert same(ops.fake_quant_fp8(x, backend=backend), fake_quant_fp8(x))


@pytest.mark.parametrize("backend", BACKENDS)
def test_fp4_edge_values(backend):
    x = edge_rows(32)
    got, want = ops.fake_quant_fp4(x, backend=backend), fake_quant_fp4(x)
    assert same(got, want)
    assert torch.signbit(got[7, 0]) and not torch.signbit(got[7, 1])  # -0.0 keeps its sign
    assert got[9, 0] == float("inf") and got[8, 4] == -1000.0  # scale-1 blocks round on the model's grid


@pytest.mark.parametrize("backend", BACKENDS)
def test_other_block_sizes(backend):
    x = rows((4, 256), seed=2)
    for block in (16, 128):
        assert same(ops.fake_quant_fp8(x, block, backend=backend), fake_quant_fp8(x, block))
        assert same(ops.fake_quant_fp4(x, block, backend=backend), fake_quant_fp4(x, block))


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_output_is_written(backend):
    """Poisoned outputs: the kernel writes each element (NaN poison where the data has none)."""
    import kernforge

    for m, block_rows in ((3, 1), (3, 4), (37, 16), (16, 16)):  # rows past the end of a ragged last program
        x = rows((m, 128), seed=m + block_rows)
        for factory, params, ref in ((Q.fake_quant_e4m3, dict(dtype="float32", block=64), fake_quant_fp8),
                                     (Q.fake_quant_e2m1, dict(block=32), fake_quant_fp4)):
            out = torch.full_like(x, float("nan"))
            kernforge.compile(factory, backend=backend, block_rows=block_rows, **params)(x, out)
            assert not torch.isnan(out).any() and same(out, ref(x)), (factory.__name__, m, block_rows)


@settings(max_examples=10, deadline=None)
@given(lead=st.lists(st.integers(0, 3), min_size=0, max_size=2), blocks=st.integers(1, 5),
       block=st.sampled_from([8, 32, 64]), bf16=st.booleans(), seed=st.integers(0, 999))
def test_property_shapes_on_the_interpreter(lead, blocks, block, bf16, seed):
    x = rows((*lead, blocks * block), seed=seed)
    assert same(ops.fake_quant_fp4(x, block, backend="interp"), fake_quant_fp4(x, block))
    xd = x.to(torch.bfloat16 if bf16 else torch.float32)
    assert same(ops.fake_quant_fp8(xd, block, backend="interp"), fake_quant_fp8(xd, block))


def test_cuda_emu_tiny():
    """CUDA semantics on the host (one small case each: cuda-emu compiles are slow)."""
    if "cuda-emu" not in host_backends("cuda-emu"):
        pytest.skip("cuda-emu not available")
    x = torch.cat([edge_rows(64), rows((2, 64), seed=4)])
    assert same(ops.fake_quant_fp8(x, backend="cuda-emu"), fake_quant_fp8(x))
    x4 = x.view(-1, 32)
    assert same(ops.fake_quant_fp4(x4, backend="cuda-emu"), fake_quant_fp4(x4))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["fake_quant_fp8", "fake_quant_fp4"])
def test_registry_specs_verify(backend, name):
    result = run_spec(get(name), backend, "small", repeat=1)
    assert result.verified, result.error


def test_registry_check_catches_one_wrong_bit():
    spec = get("fake_quant_fp8")
    params = spec.problems["small"].params
    inputs = spec.make_inputs(params, 0, "cpu")
    want = spec.reference(inputs, params)
    bad = want[0].clone()
    bad.view(torch.int32)[1, 2] ^= 1
    with pytest.raises(AssertionError, match="out differ"):
        spec.check([bad], want, inputs, params)


def test_empty_inputs_give_empty_outputs():
    assert ops.fake_quant_fp8(torch.empty(0, 64)).shape == (0, 64)
    assert ops.fake_quant_fp4(torch.empty(3, 0)).shape == (3, 0)


def test_bad_arguments_raise_named_errors():
    x = torch.zeros(2, 64)
    with pytest.raises(QuantTypeError, match="x must be a torch.Tensor"):
        ops.fake_quant_fp8(x.numpy())
    with pytest.raises(QuantTypeError, match="x must be float32 or bfloat16"):
        ops.fake_quant_fp8(x.half())
    with pytest.raises(QuantTypeError, match="x must be float32, got torch.bfloat16"):
        ops.fake_quant_fp4(x.bfloat16())  # the model's FP4 rounding is float32 only
    with pytest.raises(QuantTypeError, match="block must be an int"):
        ops.fake_quant_fp8(x, 64.0)
    with pytest.raises(QuantValueError, match="block must be positive"):
        ops.fake_quant_fp4(x, 0)
    with pytest.raises(QuantValueError, match="not a multiple of block 48"):
        ops.fake_quant_fp8(x, 48)
    with pytest.raises(QuantValueError, match="contiguous"):
        ops.fake_quant_fp4(torch.zeros(64, 2).T)
    with pytest.raises(QuantValueError, match="at least 1-D"):
        ops.fake_quant_fp8(torch.tensor(1.0), 1)
    for factory in (Q.fake_quant_e4m3, Q.fake_quant_e2m1):
        with pytest.raises(ValueError, match="block must be positive"):
            factory(block=0)
    with pytest.raises(ValueError, match="dtype"):
        Q.fake_quant_e4m3(dtype="float16")
