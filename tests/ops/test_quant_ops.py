"""``kernforge.ops`` quantisation: DeepGEMM's casting helpers and V4's FP4 format, bit for bit
against the torch references, shapes (leading dims, 3-D weights, empty), and typed errors
before launch."""
import pytest
import torch

from kernforge import ops
from kernforge.kernels.grouped_gemm.reference import dequantize
from kernforge.kernels.quant import reference
from kernforge.kernels.quant.problems import bits
from kernforge.model.quant import dequantize_fp4, fake_quant_fp4
from tests.conftest import host_backends

# the default backend of a CPU tensor (cpu) and the oracle
BACKENDS = [None if p.values[0] == "cpu" else p.values[0] for p in host_backends("cpu") if not p.marks] + ["interp"]


def x_of(shape, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * torch.exp2(torch.randint(-12, 6, shape[:-1] + (1,), generator=g)
                                                        .float())).to(dtype)


def same_bits(got, want):
    return got.shape == want.shape and torch.equal(bits(got), bits(want))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("use_ue8m0", [False, True])
def test_per_token_cast_to_fp8(backend, use_ue8m0):
    x = x_of((2, 3, 260))  # leading dims flatten into rows
    data, sf = ops.per_token_cast_to_fp8(x, use_ue8m0=use_ue8m0, backend=backend)
    want = reference.per_token_cast_to_fp8(x, use_ue8m0)
    assert data.dtype == torch.float8_e4m3fn and sf.shape == (2, 3, 3)
    assert same_bits(data, want[0]) and same_bits(sf, want[1])
    # and it is a quantisation of x: within e4m3's half ulp (2^-4 relative) plus the block's floor
    err = (dequantize(data.view(6, 260), sf.view(6, 3), (1, 128)) - x.view(6, 260).double()).abs()
    assert (err <= x.view(6, 260).double().abs() * 2 ** -4 + sf.view(6, 3).repeat_interleave(128, 1)[:, :260]
            .double() * 2 ** -9).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", [(130, 257), (2, 129, 128)])
def test_per_block_cast_to_fp8(backend, shape):
    x = x_of(shape, seed=1)
    data, sf = ops.per_block_cast_to_fp8(x, backend=backend)
    want = reference.per_block_cast_to_fp8(x)
    assert same_bits(data, want[0]) and same_bits(sf, want[1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_per_token_cast_to_fp4_is_the_model_format(backend):
    x = x_of((7, 128), seed=2)
    codes, sf = ops.per_token_cast_to_fp4(x, backend=backend)
    want = reference.per_token_cast_to_fp4(x)
    assert codes.dtype == torch.int8 and same_bits(codes, want[0]) and same_bits(sf, want[1])
    decoded = dequantize_fp4(codes, sf.to(torch.float8_e8m0fnu))
    assert torch.equal(decoded.view(torch.int32), fake_quant_fp4(x.float()).view(torch.int32))


@pytest.mark.parametrize("op", [ops.per_token_cast_to_fp8, ops.per_token_cast_to_fp4])
def test_empty_inputs_give_empty_results(op):
    data, sf = op(torch.empty(0, 256, dtype=torch.bfloat16))
    assert data.shape[0] == 0 and sf.shape[0] == 0
    data, sf = op(torch.empty(3, 0, dtype=torch.bfloat16))
    assert data.shape == (3, 0) and sf.shape == (3, 0)
    data, sf = ops.per_block_cast_to_fp8(torch.empty(0, 4, 256))
    assert data.shape == (0, 4, 256) and sf.shape == (0, 1, 2)


def test_one_row():
    x = x_of((1, 128), seed=3)
    assert same_bits(ops.per_token_cast_to_fp8(x)[1], reference.per_token_cast_to_fp8(x)[1])


@pytest.mark.parametrize("op", [ops.per_token_cast_to_fp8, ops.per_block_cast_to_fp8, ops.per_token_cast_to_fp4])
def test_bad_inputs_raise_typed_errors_naming_the_argument(op):
    with pytest.raises(ops.QuantTypeError, match="x must be bfloat16 or float32"):
        op(torch.zeros(4, 128, dtype=torch.float16))
    with pytest.raises(ops.QuantTypeError, match="x must be a torch.Tensor"):
        op([[1.0]])
    with pytest.raises(ops.QuantValueError, match="x must be contiguous"):
        op(torch.zeros(128, 8).t())
    with pytest.raises(TypeError):  # QuantTypeError is a TypeError too
        op(torch.zeros(4, 128, dtype=torch.int32))


def test_shape_errors():
    with pytest.raises(ops.QuantValueError, match="x must be 2-D to 3-D"):
        ops.per_block_cast_to_fp8(torch.zeros(128))
    with pytest.raises(ops.QuantValueError, match="last dim must be even"):
        ops.per_token_cast_to_fp4(torch.zeros(2, 33))
