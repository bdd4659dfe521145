"""Compiled kernels take any ``__dlpack__`` producer: zero-copy views (writes land in the
producer's memory), torch outputs; numpy and torch arguments keep their own fast path."""
import numpy as np
import pytest
import torch

import kernforge
from kernforge.jit.kernel import ArgumentError
from tests.conftest import host_backends
from tests.jit.kernels import axpy


class DLPackOnly:
    """Exposes nothing but the DLPack protocol (as a CuPy or JAX array would, to kernforge)."""

    def __init__(self, data):
        self._data = data

    def __dlpack__(self, **kwargs):
        return self._data.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._data.__dlpack_device__()


@pytest.mark.parametrize("backend", host_backends("interp", "cpu"))
def test_dlpack_only_inputs_are_viewed_in_place_and_outputs_are_torch(backend):
    k = kernforge.compile(axpy, backend=backend, out_idx=3)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(10, 16, generator=g), torch.randn(10, 16, generator=g)
    y0 = y.clone()
    z = k(DLPackOnly(x), 1.5, DLPackOnly(y))
    assert isinstance(z, torch.Tensor)
    torch.testing.assert_close(z.double(), x.double() * 1.5 + y0.double())
    torch.testing.assert_close(y, y0 + 1, rtol=0, atol=0)  # the kernel wrote the producer's memory


@pytest.mark.parametrize("backend", host_backends("interp", "cpu"))
def test_numpy_behind_dlpack_and_mixed_kinds(backend):
    k = kernforge.compile(axpy, backend=backend, out_idx=3)
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((7, 16), dtype=np.float32), rng.standard_normal((7, 16), dtype=np.float32)
    y0 = y.copy()
    z = k(x, -2.0, DLPackOnly(y))             # numpy + a DLPack producer: torch out
    assert isinstance(z, torch.Tensor)
    np.testing.assert_allclose(z.numpy(), x.astype(np.float64) * -2 + y0, rtol=1e-6)
    np.testing.assert_array_equal(y, y0 + 1)  # numpy's memory, written through the DLPack view
    z2 = k(x, -2.0, y.copy())                 # all numpy: the numpy fast path, numpy out
    assert isinstance(z2, np.ndarray)


def test_the_checks_apply_to_dlpack_inputs_and_other_objects_are_refused():
    k = kernforge.compile(axpy, backend="interp", out_idx=3)
    with pytest.raises(ArgumentError, match="'X' must be float32, got float64"):
        k(DLPackOnly(torch.randn(4, 16, dtype=torch.float64)), 1.0, torch.zeros(4, 16))
    with pytest.raises(ArgumentError, match="'Y' expects a torch tensor or numpy array, got list"):
        k(torch.zeros(4, 16), 1.0, [[0.0] * 16] * 4)
    with pytest.raises(ArgumentError, match="takes 3 arguments"):
        k(DLPackOnly(torch.zeros(4, 16)), 1.0)


def test_a_scalar_parameter_is_not_converted():
    """Only buffer parameters are DLPack-converted: a 0-d torch tensor for scalar ``a`` stays an error."""
    k = kernforge.compile(axpy, backend="interp", out_idx=3)
    with pytest.raises(ArgumentError, match="scalar parameter 'a' got an array"):
        k(DLPackOnly(torch.zeros(4, 16)), torch.tensor(1.0), torch.zeros(4, 16))
