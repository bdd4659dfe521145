"""The CPU launch a compiled kernel binds with its memoised argument plan
(``CompiledKernel.bind``, ``CpuLauncher.bind``): it must read each call's own buffers and
scalar values, and never let a call past the checks that its signature has not passed."""
import pytest
import torch

import kernforge
from kernforge.backends.cpu.backend import CpuBackend
from kernforge.jit.kernel import ArgumentError, ShapeError
from tests.jit.kernels import axpy


def reference(x, a, y):
    """Z = X * a + Y in float64, and the new Y (Y + 1, in float32 as the kernel rounds it)."""
    return x.double() * a + y.double(), y + 1


@pytest.fixture(scope="module")
def kern():
    return kernforge.compile(axpy, backend="cpu", out_idx=3)


def test_repeated_calls_read_their_own_buffers_and_scalars(kern):
    g = torch.Generator().manual_seed(0)
    for m, a in ((5, 2.0), (5, -0.5), (5, 3), (9, 2.0), (5, 2.0)):
        x, y = torch.randn(m, 16, generator=g), torch.randn(m, 16, generator=g)
        want_z, want_y = reference(x, float(a), y)
        z = kern(x, a, y)
        torch.testing.assert_close(z.double(), want_z, rtol=1e-6, atol=1e-6)
        assert torch.equal(y, want_y)
    assert kern._plans and all(plan[4] is not None for plan in kern._plans.values())


def test_a_view_with_a_storage_offset_is_written_where_it_lies(kern):
    x = torch.ones(4, 16)
    base = torch.zeros(8, 16)
    kern(x, 1.0, base[:4].clone())  # same signature as the view below: the bound launch
    view = base[4:]
    kern(x, 1.0, view)
    assert torch.equal(base[:4], torch.zeros(4, 16)) and torch.equal(base[4:], torch.ones(4, 16))


@pytest.mark.parametrize("bad, error, match", [
    (dict(x=torch.ones(4, 16, dtype=torch.float64)), ArgumentError, "'X' must be float32"),
    (dict(y=torch.full((3, 16), float("nan"))), ShapeError, "M = 3 here but 4"),
    (dict(y=torch.full((4, 32), float("nan"))[:, ::2]), ShapeError, "stride"),
    (dict(a=1.5j), ArgumentError, "scalar parameter 'a'"),
])
def test_a_new_signature_after_a_bound_call_is_checked(kern, bad, error, match):
    args = dict(x=torch.ones(4, 16), a=1.0, y=torch.full((4, 16), float("nan")))
    kern(args["x"], 1.0, torch.zeros(4, 16))  # the good signature is bound
    args.update(bad)
    y = args["y"]
    with pytest.raises(error, match=match):
        kern(args["x"], args["a"], y)
    assert torch.isnan(y).all(), "nothing may run before the checks pass"


def test_checked_builds_do_not_bind():
    kern = kernforge.compile(axpy, backend="cpu", out_idx=3, checks=True)
    x, y = torch.ones(4, 16), torch.zeros(4, 16)
    z = kern(x, 2.0, y)
    assert torch.equal(z, torch.full((4, 16), 2.0)) and torch.equal(y, torch.ones(4, 16))
    assert all(plan[4] is None for plan in kern._plans.values())
    assert kern.bind(x, 2.0, y) is None  # out_idx kernels never hand out a bound launch


def test_the_launcher_checks_what_it_binds():
    launcher = CpuBackend().build(kernforge.compile(axpy, backend="cpu").ir)
    with pytest.raises(TypeError, match="scalar a"):
        launcher.bind([4], {1: True})
    with pytest.raises(TypeError, match="symbol values"):
        launcher.bind([], {1: 1.0})


def test_numpy_arguments_launch_unbound_and_return_numpy(kern):
    import numpy as np

    x, y = np.ones((4, 16), np.float32), np.zeros((4, 16), np.float32)
    z = kern(x, 2.0, y)
    assert isinstance(z, np.ndarray) and (z == 2.0).all() and (y == 1.0).all()
    key = next(k for k in kern._plans if isinstance(k[0][0], np.dtype))
    assert kern._plans[key][4] is None
