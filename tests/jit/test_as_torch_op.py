"""``CompiledKernel.as_torch_op``: the schema inferred from the parameters (outputs returned,
written arguments mutated), eager and compiled calls, fake shapes from the bound symbols."""
import pytest
import torch

import kernforge
import kernforge.dsl as T
from kernforge.jit.kernel import AutogradError, ShapeError
from tests.jit.kernels import axpy

N = T.symbolic("N")


@T.prim_func
def split_rows(X: T.Tensor((N, 8), "bfloat16"), scale: T.int32, flag: T.bool_,
               Lo: T.Tensor((N, 4), "float32"), Hi: T.Tensor((N, 4), "float32")):
    with T.Kernel(N, threads=32) as bx:
        for j in T.Parallel(4):
            if flag:
                Lo[bx, j] = X[bx, j] * scale
                Hi[bx, j] = X[bx, j + 4] * scale


@T.prim_func
def bump(Y: T.Tensor((N,), "float32")):
    with T.Kernel(1, threads=32) as bx:
        for i in T.serial(N):
            Y[i] = Y[i] + 1.0


def test_schema_follows_params_out_idx_and_writes():
    op = kernforge.compile(axpy, backend="interp", out_idx=3).as_torch_op("kftest::axpy")
    assert str(op._opoverload._schema) == "kftest::axpy(Tensor X, float a, Tensor(a0!) Y) -> Tensor"
    op2 = kernforge.compile(split_rows, backend="interp", out_idx=[3, 4]).as_torch_op("kftest::split")
    assert str(op2._opoverload._schema) == "kftest::split(Tensor X, int scale, bool flag) -> (Tensor, Tensor)"
    op3 = kernforge.compile(split_rows, backend="interp").as_torch_op("kftest::split_inplace")
    assert str(op3._opoverload._schema) == ("kftest::split_inplace(Tensor X, int scale, bool flag, "
                                            "Tensor(a0!) Lo, Tensor(a1!) Hi) -> ()")


@pytest.mark.parametrize("backend", ["interp", "cpu"])
def test_eager_compiled_and_opcheck(backend):
    kernel = kernforge.compile(axpy, backend=backend, out_idx=3)
    kernel.as_torch_op(f"kftest::axpy_{backend.replace('-', '_')}")
    op = getattr(torch.ops.kftest, f"axpy_{backend.replace('-', '_')}")
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(10, 16, generator=g), torch.randn(10, 16, generator=g)

    def f(x, y):
        return op(x * 2, 0.5, y).sum(1)

    y_eager, y_compiled = y.clone(), y.clone()
    eager = f(x, y_eager)
    torch.testing.assert_close(eager.double(), (x.double() + y.double()).sum(1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y_eager, y + 1, rtol=0, atol=0)
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")(x, y_compiled)
    assert torch.equal(eager, compiled) and torch.equal(y_eager, y_compiled)
    assert torch._dynamo.explain(f)(x, y.clone()).graph_break_count == 0
    result = torch.library.opcheck(op.default, (x, 0.5, y.clone()))
    assert set(result.values()) == {"SUCCESS"}


def test_fake_shapes_bind_symbols_and_check_like_the_kernel():
    kernel = kernforge.compile(split_rows, backend="interp", out_idx=[3, 4])
    op = kernel.as_torch_op("kftest::split_fake")
    from torch._subclasses.fake_tensor import FakeTensorMode

    x = torch.randn(6, 8).bfloat16()
    lo, hi = op(x, 3, True)
    torch.testing.assert_close(lo, x[:, :4].float() * 3, rtol=0, atol=0)
    torch.testing.assert_close(hi, x[:, 4:].float() * 3, rtol=0, atol=0)
    with FakeTensorMode() as mode:
        flo, fhi = op(mode.from_tensor(x), 3, True)
        assert (flo.shape, flo.dtype, fhi.shape) == (lo.shape, lo.dtype, hi.shape)
        with pytest.raises(ShapeError, match="'X' dim 1 must be 8"):
            op(mode.from_tensor(torch.randn(6, 9).bfloat16()), 3, True)
    # dynamic shapes: N is a symbol while tracing, bound from X
    torch._dynamo.reset()
    f = torch.compile(lambda x: op(x, 2, True)[0] + 1, fullgraph=True, dynamic=True, backend="aot_eager")
    for rows in (3, 11):
        x = torch.randn(rows, 8).bfloat16()
        torch.testing.assert_close(f(x), x[:, :4].float() * 2 + 1, rtol=0, atol=0)


def test_a_kernel_without_outputs_mutates_and_returns_none():
    op = kernforge.compile(bump, backend="interp").as_torch_op("kftest::bump")
    assert str(op._opoverload._schema) == "kftest::bump(Tensor(a0!) Y) -> ()"
    y = torch.zeros(5)
    assert op(y) is None and torch.equal(y, torch.ones(5))
    torch._dynamo.reset()
    y2 = torch.zeros(5)
    torch.compile(lambda t: op(t), fullgraph=True, backend="aot_eager")(y2)
    assert torch.equal(y2, torch.ones(5))


def test_requires_grad_is_refused_with_the_argument_name():
    op = kernforge.compile(axpy, backend="interp", out_idx=3).as_torch_op("kftest::axpy_grad")
    y = torch.zeros(4, 16)
    with pytest.raises(AutogradError, match="kftest::axpy_grad: argument 'X' requires grad"):
        op(torch.zeros(4, 16, requires_grad=True), 1.0, y)
    assert torch.equal(y, torch.zeros(4, 16)), "refused before the kernel ran"
    with torch.inference_mode():
        op(torch.zeros(4, 16, requires_grad=True), 1.0, y)
    assert torch.equal(y, torch.ones(4, 16))
