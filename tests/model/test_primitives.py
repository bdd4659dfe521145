"""RoPE/YaRN, Hadamard, fake quantization and weight dequantization against independent references."""

import math

import ml_dtypes
import numpy as np
import pytest
import torch

from kernforge.model.primitives import RopeTable, hadamard, rope_frequencies, yarn_correction_range
from kernforge.model.quant import (dequantize_fp4, dequantize_fp8, fake_quant_fp4, fake_quant_fp8,
                                   round_e2m1)

from ._helpers import rope_reference


def test_yarn_range_for_v4_flash():
    # Spec §2.2: base 160000, original length 65536, rope dim 64 -> ramp from 15 to 25.
    assert yarn_correction_range(64, 160000.0, 65536, 32, 1) == (15, 25)


def test_yarn_frequencies_follow_the_ramp():
    plain = 160000.0 ** (-np.arange(0, 64, 2) / 64)
    got = rope_frequencies(64, 160000.0, 65536, 16.0, 32, 1).numpy()
    ramp = np.clip((np.arange(32) - 15) / 10, 0, 1)
    np.testing.assert_allclose(got, plain * (1 - ramp) + plain / 16 * ramp, rtol=1e-15)
    np.testing.assert_allclose(rope_frequencies(64, 10000.0).numpy(), 10000.0 ** (-np.arange(0, 64, 2) / 64))


@pytest.mark.parametrize("shape", [(2, 7, 48), (2, 7, 3, 48)])
def test_rope_matches_complex_rotation_and_inverts(shape):
    freqs = rope_frequencies(16, 160000.0, 65536, 16.0, 32, 1)
    table = RopeTable(16, 64, freqs).double()
    x = torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    pos = torch.tensor([0, 1, 5, 17, 31, 40, 63])
    got = table.rotate(x, pos)
    torch.testing.assert_close(got, rope_reference(x, pos, freqs), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(table.rotate(got, pos, inverse=True), x, rtol=1e-12, atol=1e-12)
    assert torch.equal(got[..., :-16], x[..., :-16])


def _sylvester(n: int) -> np.ndarray:
    h = np.array([[1.0]])
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


@pytest.mark.parametrize("n", [1, 2, 32, 128])
def test_hadamard_matches_sylvester_matrix(n):
    x = torch.randn(3, 5, n, dtype=torch.float64, generator=torch.Generator().manual_seed(n))
    before = x.clone()
    expect = x.numpy() @ _sylvester(n).T / math.sqrt(n)
    np.testing.assert_allclose(hadamard(x).numpy(), expect, rtol=1e-12, atol=1e-12)
    assert torch.equal(x, before)  # the butterfly works in scratch buffers, never in its input
    strided = x.transpose(0, 1)  # non-contiguous input
    np.testing.assert_allclose(hadamard(strided).numpy(), expect.transpose(1, 0, 2), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="power of two"):
        hadamard(torch.zeros(4, 24))


def _pow2_scale(amax, qmax, floor):
    return 2.0 ** np.ceil(np.log2(np.maximum(amax, floor) / qmax))


def test_fake_quant_fp8_matches_ml_dtypes():
    g = np.random.default_rng(0)
    x = (g.standard_normal((6, 256)) * np.exp(g.uniform(-8, 8, (6, 1)))).astype(np.float32)
    x[0, :64] = 0.0  # all-zero block uses the 1e-4 floor
    blocks = x.reshape(6, 4, 64)
    s = _pow2_scale(np.abs(blocks).max(-1, keepdims=True), 448.0, 1e-4)
    expect = ((blocks / s).astype(ml_dtypes.float8_e4m3fn).astype(np.float32) * s).reshape(6, 256)
    np.testing.assert_array_equal(fake_quant_fp8(torch.from_numpy(x)).numpy(), expect)


def test_fake_quant_fp4_matches_ml_dtypes():
    g = np.random.default_rng(1)
    x = (g.standard_normal((5, 128)) * np.exp(g.uniform(-6, 6, (5, 1)))).astype(np.float32)
    blocks = x.reshape(5, 4, 32)
    s = _pow2_scale(np.abs(blocks).max(-1, keepdims=True), 6.0, 6.0 * 2.0 ** -126)
    expect = ((blocks / s).astype(ml_dtypes.float4_e2m1fn).astype(np.float32) * s).reshape(5, 128)
    np.testing.assert_array_equal(fake_quant_fp4(torch.from_numpy(x)).numpy(), expect)


def test_round_e2m1_ties_match_ml_dtypes():
    v = np.arange(-6.0, 6.0001, 0.125, dtype=np.float32)
    expect = v.astype(ml_dtypes.float4_e2m1fn).astype(np.float32)
    np.testing.assert_array_equal(round_e2m1(torch.from_numpy(v)).numpy(), expect)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_round_e2m1_matches_ml_dtypes_on_random_and_tiny_values(dtype):
    g = np.random.default_rng(4)
    v = np.concatenate([g.uniform(-6, 6, 20000), g.uniform(-6, 6, 200) * 1e-30,  # incl. float32 subnormals
                        np.nextafter([2.0, 4.0, 1.75, 3.5, 5.0], 0), np.nextafter([2.0, 4.0, 1.75, 3.5, 5.0], 9),
                        [0.0, -0.0, 0.25, 6.0, -6.0]]).astype(dtype)
    grid = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    dist = np.abs(np.abs(v.astype(np.float64))[:, None] - grid)
    nearest = dist == dist.min(1, keepdims=True)
    code = np.where(nearest.sum(1) > 1, np.argmax(nearest & (np.arange(8) % 2 == 0), 1), np.argmax(nearest, 1))
    expect = np.copysign(grid[code], v).astype(dtype)  # nearest grid point, ties to the even code
    if dtype == np.float32:  # ml_dtypes agrees (it rounds float64 input via float32, so only here)
        np.testing.assert_array_equal(v.astype(ml_dtypes.float4_e2m1fn).astype(dtype), expect)
    got = round_e2m1(torch.from_numpy(v)).numpy()
    np.testing.assert_array_equal(got, expect)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(expect))
    with pytest.raises(TypeError, match="float32 and float64"):
        round_e2m1(torch.ones(3, dtype=torch.bfloat16))


def test_dequantize_fp8_uses_one_scale_per_128_tile():
    g = np.random.default_rng(2)
    q = g.standard_normal((200, 300)).astype(ml_dtypes.float8_e4m3fn)
    exps = g.integers(-10, 10, (2, 3))
    expect = q.astype(np.float32) * np.kron(2.0 ** exps, np.ones((128, 128)))[:200, :300]
    scale = torch.from_numpy((exps + 127).astype(np.uint8))
    got = dequantize_fp8(torch.from_numpy(q.view(np.uint8)).view(torch.float8_e4m3fn), scale)
    np.testing.assert_array_equal(got.numpy(), expect.astype(np.float32))
    with pytest.raises(ValueError, match="scale shape"):
        dequantize_fp8(torch.from_numpy(q.view(np.uint8)).view(torch.float8_e4m3fn), scale[:1])


def test_dequantize_fp4_unpacks_low_nibble_first():
    g = np.random.default_rng(3)
    codes = g.integers(0, 16, (4, 64)).astype(np.uint8)
    values = codes.view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).view(np.int8)
    exps = g.integers(-5, 5, (4, 2))
    expect = values * np.repeat(2.0 ** exps, 32, axis=1)
    got = dequantize_fp4(torch.from_numpy(packed), torch.from_numpy((exps + 127).astype(np.uint8)))
    np.testing.assert_array_equal(got.numpy(), expect.astype(np.float32))
