"""The quantisation DSL kernels: bit-exact against the torch references (DeepGEMM's FP8 recipes,
the model's FP4 format) on interp and cpu, a few cases on cuda-emu, exact power-of-two
scales where ``exp2(ceil(log2))`` would be a backend's rounding, and the CUDA source compiling."""
import shutil

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kernforge
from kernforge import backends
from kernforge.kernels import quant as Q
from kernforge.kernels.check import run_spec
from kernforge.kernels.quant.problems import bits
from kernforge.kernels.registry import get
from kernforge.model.quant import _pow2_ceil_scale, dequantize_fp4, fake_quant_fp4
from tests.conftest import host_backends

BACKENDS = host_backends("interp", "cpu")
# every dtype on the interpreter; the cpu builds the kernels the catalogue builds (bf16), so a
# test run compiles each variant once (C++ builds dominate this file's time)
INTERP_ALL_CPU_BF16 = [pytest.param("interp", torch.bfloat16, id="interp-bf16"),
                       pytest.param("interp", torch.float32, id="interp-fp32"),
                       *[pytest.param(*p.values, torch.bfloat16, marks=p.marks, id="cpu-bf16")
                         for p in host_backends("cpu")]]
SPECS = ["per_token_cast_to_fp8", "per_token_cast_to_fp8_ue8m0", "per_block_cast_to_fp8", "per_token_cast_to_fp4"]


def _cdiv(a, b):
    return -(-a // b)


def activations(shape, dtype, seed=0):
    """Random rows with magnitudes from 2^-30 (below the amax floor) to 2^9 (beyond e4m3's 448
    before scaling), a zero row, subnormal-range values and e2m1 ties after scaling."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-30, 10, shape[:-1] + (1,), generator=g).float())
    flat = x.view(-1, shape[-1])
    flat[0] = 0.0
    ties = torch.tensor([6.0, -0.25, 0.75, -1.25, 1.75, 2.5, -3.5, 5.0])[:shape[-1]]
    tiny = torch.tensor([-0.0, -1e-38])[:shape[-1]]
    if flat.shape[0] > 1:
        flat[1, :len(ties)] = ties
    if flat.shape[0] > 2:
        flat[2, :len(tiny)] = tiny
    return x.to(dtype)


def run_token(backend, x, use_ue8m0):
    k = kernforge.compile(Q.per_token_cast, backend=backend, dtype=str(x.dtype)[6:], use_ue8m0=use_ue8m0)
    m, n = x.shape
    data = torch.full((m, n), float("nan")).to(torch.float8_e4m3fn)
    sf = torch.full((m, _cdiv(n, 128)), float("nan"))
    k(x, data, sf)
    return data, sf


def run_block(backend, x, use_ue8m0):
    k = kernforge.compile(Q.per_block_cast, backend=backend, dtype=str(x.dtype)[6:], use_ue8m0=use_ue8m0)
    g, n, kk = x.shape
    data = torch.full(x.shape, float("nan")).to(torch.float8_e4m3fn)
    sf = torch.full((g, _cdiv(n, 128), _cdiv(kk, 128)), float("nan"))
    k(x, data, sf)
    return data, sf


def run_fp4(backend, x):
    k = kernforge.compile(Q.per_token_cast_fp4, backend=backend, dtype=str(x.dtype)[6:])
    m, n = x.shape
    codes = torch.full((m, n // 2), 0xA5, dtype=torch.uint8)  # poisoned: not a code pair the data gives
    sf = torch.full((m, _cdiv(n, 32)), float("nan"))
    k(x, codes, sf)
    return codes.view(torch.int8), sf


def same_bits(got, want):
    return got.shape == want.shape and torch.equal(bits(got), bits(want))


@pytest.mark.parametrize("backend,dtype", INTERP_ALL_CPU_BF16)
@pytest.mark.parametrize("use_ue8m0", [False, True])
def test_per_token_fp8_is_the_reference_bit_for_bit(backend, dtype, use_ue8m0):
    x = activations((6, 300), dtype)  # a ragged last block of 44
    data, sf = run_token(backend, x, use_ue8m0)
    want_data, want_sf = Q.per_token_cast_to_fp8(x, use_ue8m0)
    assert same_bits(data, want_data) and same_bits(sf, want_sf)
    floor = float(torch.tensor(1e-4) / 448.0)  # the zero row: the amax floor, in float32
    assert float(sf[0, 0]) == (2.0 ** -22 if use_ue8m0 else floor)


@pytest.mark.parametrize("backend,dtype", INTERP_ALL_CPU_BF16)
@pytest.mark.parametrize("use_ue8m0", [False])
def test_per_block_fp8_is_the_reference_bit_for_bit(backend, dtype, use_ue8m0):
    x = activations((2, 130, 260), dtype, seed=1)  # ragged in both dims
    x[1, 128:, 256:] *= 1e6  # a corner block whose scale is its own
    data, sf = run_block(backend, x, use_ue8m0)
    want_data, want_sf = Q.per_block_cast_to_fp8(x, use_ue8m0)
    assert same_bits(data, want_data) and same_bits(sf, want_sf)


@pytest.mark.parametrize("backend,dtype", INTERP_ALL_CPU_BF16)
def test_per_token_fp4_is_the_model_format(backend, dtype):
    x = activations((5, 200), dtype, seed=2)  # 200 = 6 blocks of 32 + 8
    codes, sf = run_fp4(backend, x)
    want_codes, want_sf = Q.per_token_cast_to_fp4(x)
    assert same_bits(codes, want_codes) and same_bits(sf, want_sf)
    # the model's decoder of the format gives back the model's fake quantisation (blocks of 32)
    xf = x.float()[:, :192]
    decoded = dequantize_fp4(codes[:, :96], sf[:, :6].to(torch.float8_e8m0fnu))
    assert torch.equal(decoded.view(torch.int32), fake_quant_fp4(xf).view(torch.int32))


def test_fp4_ties_go_to_the_even_code_and_the_sign_bit_is_kept():
    # block scale 1 (amax 6): each value is its own scaled value
    vals = [6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.0, -0.2, -0.75, 4.9, 5.1, 0.26, 2.6, 3.4]
    x = torch.tensor([vals * 2])
    codes, sf = run_fp4("interp", x)
    assert float(sf[0, 0]) == 1.0
    nibbles = torch.stack([codes.view(torch.uint8) & 15, codes.view(torch.uint8) >> 4], -1).flatten()[:16]
    assert nibbles.tolist() == [7, 0, 2, 2, 4, 4, 6, 6, 8, 8, 10, 6, 7, 1, 5, 5]


@pytest.mark.parametrize("backend", BACKENDS)
def test_scales_are_exact_powers_of_two_just_above_a_power_of_two(backend):
    """amax / 448 one ulp above 2^-9: the exact ceiling is 2^-8 (log2 in float32 rounds to -9
    there, so exp2(ceil(log2(s))) would say 2^-9 on some backends).  The model's frexp
    rounding is the oracle."""
    dtype = torch.bfloat16 if backend == "cpu" else torch.float32  # cpu: the catalogue's bf16 build
    x = torch.zeros(2, 128, dtype=dtype)
    x[0, 5] = 0.875 * (1 + 2.0 ** -22) if dtype == torch.float32 else 0.87890625  # one ulp above 448 * 2^-9
    x[1, 7] = -torch.tensor(448.0 * 2.0 ** -9)  # exactly a power of two: stays
    _, sf = run_token(backend, x, True)
    want = _pow2_ceil_scale(x.abs().amax(-1, keepdim=True), 448.0, 1e-4)
    assert torch.equal(sf, want) and sf.flatten().tolist() == [2.0 ** -8, 2.0 ** -9]
    _, sf4 = run_fp4(backend, x[:, :32] / 448.0 * 6.0)
    assert torch.equal(sf4[:, :1], _pow2_ceil_scale((x[:, :32] / 448.0 * 6.0).abs().amax(-1, keepdim=True),
                                                    6.0, 6.0 * 2.0 ** -126))


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_propagates_to_its_block_as_torch_does(backend):
    x = activations((2, 256), torch.bfloat16 if backend == "cpu" else torch.float32, seed=3)
    x[1, 130] = float("nan")
    data, sf = run_token(backend, x, False)
    want_data, want_sf = Q.per_token_cast_to_fp8(x, False)
    assert torch.isnan(sf[1, 1]) and not torch.isnan(sf[1, 0])
    assert torch.equal(torch.isnan(data.float()), torch.isnan(want_data.float()))
    assert torch.equal(bits(data)[~torch.isnan(want_data.float())], bits(want_data)[~torch.isnan(want_data.float())])


@settings(max_examples=8)
@given(m=st.integers(1, 3), k=st.integers(1, 300), bf16=st.booleans(), ue8m0=st.booleans(), seed=st.integers(0, 99))
def test_property_random_shapes_on_the_interpreter(m, k, bf16, ue8m0, seed):
    x = activations((m, k), torch.bfloat16 if bf16 else torch.float32, seed)
    data, sf = run_token("interp", x, ue8m0)
    want = Q.per_token_cast_to_fp8(x, ue8m0)
    assert same_bits(data, want[0]) and same_bits(sf, want[1])
    if k % 2 == 0:
        codes, sf4 = run_fp4("interp", x)
        want4 = Q.per_token_cast_to_fp4(x)
        assert same_bits(codes, want4[0]) and same_bits(sf4, want4[1])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", SPECS)
def test_registry_specs_verify(backend, name):
    result = run_spec(get(name), backend, "small", repeat=1)
    assert result.verified, result.error


def test_registry_check_catches_one_wrong_byte():
    spec = get("per_token_cast_to_fp4")
    params = spec.problems["small"].params
    inputs = spec.make_inputs(params, 0, "cpu")
    expected = spec.reference(inputs, params)
    codes = expected[0].view(torch.uint8).clone()
    codes[2, 3] ^= 1
    with pytest.raises(AssertionError, match="codes differ"):
        spec.check([codes, expected[1]], expected, inputs, params)


def test_cuda_emu_runs_each_kernel():
    """CUDA semantics on the host: one small case per kernel (cuda-emu compiles are slow)."""
    if "cuda-emu" not in host_backends("cuda-emu"):
        pytest.skip("cuda-emu not available")
    x = activations((3, 300), torch.bfloat16, seed=4)
    data, sf = run_token("cuda-emu", x, True)
    want = Q.per_token_cast_to_fp8(x, True)
    assert same_bits(data, want[0]) and same_bits(sf, want[1])
    xb = activations((1, 130, 140), torch.float32, seed=5)
    data, sf = run_block("cuda-emu", xb, False)
    want = Q.per_block_cast_to_fp8(xb, False)
    assert same_bits(data, want[0]) and same_bits(sf, want[1])
    codes, sf = run_fp4("cuda-emu", x[:, :296].contiguous())
    want = Q.per_token_cast_to_fp4(x[:, :296])
    assert same_bits(codes, want[0]) and same_bits(sf, want[1])


def test_factories_reject_bad_dtypes():
    for factory in (Q.per_token_cast, Q.per_block_cast, Q.per_token_cast_fp4):
        with pytest.raises(ValueError, match="dtype"):
            factory(dtype="float16")


def _cuda():
    try:
        return backends.get("cuda")
    except backends.BackendError as e:
        pytest.skip(f"CUDA backend module absent: {e}")


def test_cuda_sources_render_for_sm90a():
    cuda = _cuda()
    for pf in (Q.per_token_cast(use_ue8m0=True), Q.per_block_cast(), Q.per_token_cast_fp4()):
        src = cuda.source(pf.ir, "sm_90a")
        assert f"kf_{pf.ir.name}(" in src and "__global__" in src


@pytest.mark.nvcc
def test_cuda_sources_compile_for_sm90a():
    _cuda()
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH")
    from kernforge.backends.cuda.backend import build_report

    for pf in (Q.per_token_cast_fp4(),):  # tests/backends/test_cuda_compile.py builds the catalogue's
        report = build_report(pf.ir, "sm_90a")
        assert report["arch"] == "sm_90a" and report["spill_stores"] == 0
