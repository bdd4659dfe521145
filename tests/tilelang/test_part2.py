"""``T.alloc_global`` scratch in a ``@T.prim_func``, dtypes as strings, the host streams and
generator, autotune's "tunables given: no tuning" rule, and unknown dtypes named in errors."""
from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import torch

import kernforge.tilelang as tilelang
import kernforge.tilelang.language as T
from kernforge import dtypes
from kernforge.jit.kernel import ArgumentError


@pytest.fixture(autouse=True)
def interp(monkeypatch, tmp_path):
    monkeypatch.setenv("KERNFORGE_TILELANG_BACKEND", "interp")
    monkeypatch.setenv("KERNFORGE_TUNE_DB", str(tmp_path / "tune.sqlite"))


def split_sum(M, N, splits=4):
    """Row sums in two kernel blocks: partial sums of ``splits`` column chunks into a
    ``T.alloc_global`` scratch tensor, then their sum (TileLang's split + combine shape)."""
    chunk = N // splits

    @T.prim_func
    def main(X: T.Tensor((M, N), T.float32), Y: T.Tensor((M,), T.float32), Z: T.Tensor((M,), T.float32)):
        part = T.alloc_global((splits, M), T.float32)
        with T.Kernel(splits, threads=32) as s:
            for i in T.Parallel(M):
                part[s, i] = 0.0
                for j in T.serial(chunk):
                    part[s, i] = part[s, i] + X[i, s * chunk + j]
        with T.Kernel(1, threads=32) as bx:
            for i in T.Parallel(M):
                Y[i] = part[0, i] + part[1, i] + part[2, i] + part[3, i]
                Z[i] = Y[i] * 2.0
    return main


@pytest.mark.parametrize("name", ["interp", "cpu"])
def test_alloc_global_in_prim_func_is_per_call_scratch(name, monkeypatch):
    if name != "interp":
        from tests.conftest import host_backend_skip_reason

        if host_backend_skip_reason(name):
            pytest.skip(host_backend_skip_reason(name))
    monkeypatch.setenv("KERNFORGE_TILELANG_BACKEND", name)
    pf = split_sum(8, 16)
    assert pf.n_scratch == 1 and len(pf.kernels) == 2
    assert [p.name for p in pf.kernels[0].params][:3] == ["X", "Y", "Z"]
    x = torch.randn(8, 16)
    # out_idx counts the declared parameters: -1 is Z, never the scratch after it
    y, z = tilelang.compile(pf, out_idx=[1, -1])(x)
    want = x.double().sum(1)
    np.testing.assert_allclose(y.double().numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(z.double().numpy(), 2 * want.numpy(), rtol=1e-5, atol=1e-5)
    k = tilelang.compile(pf, out_idx=[2])
    assert [p.name for p in k.input_params] == ["X", "Y"]  # the scratch is not an input
    y = torch.full((8,), float("nan"))
    z2 = k(x, y)
    torch.testing.assert_close(z2, 2 * y)
    with pytest.raises(ArgumentError, match="out_idx 3 out of range for 3 parameters"):
        tilelang.compile(pf, out_idx=[3])(x)


def test_alloc_global_inside_a_kernel_block_is_refused():
    with pytest.raises(T.UnsupportedError, match="T.alloc_global inside `with T.Kernel`"):
        @T.prim_func
        def bad(X: T.Tensor((4,), T.float32)):
            with T.Kernel(1, threads=32) as bx:
                T.alloc_global((4,), T.float32)


def test_dtypes_are_their_names():
    f16 = T.float16
    assert isinstance(f16, str) and f16 == "float16" and hash(f16) == hash("float16")
    assert getattr(torch, f16) is torch.float16 and "".join(c for c in T.uint8 if c.isdigit()) == "8"
    assert json.loads(json.dumps({"dt": T.bfloat16})) == {"dt": "bfloat16"}
    assert pickle.loads(pickle.dumps(T.int32)) is dtypes.int32
    assert T.float16 != T.bfloat16 and dtypes.dtype("half") is T.float16
    with pytest.raises(AttributeError):
        T.float16.kind = "int"
    assert tilelang.DataType("float16").bits == 16 and tilelang.tvm.DataType(T.int8) is T.int8


def test_unknown_dtype_is_named():
    with pytest.raises(T.UnsupportedError, match="T.float4_e2m1fn is not supported.*no such dtype"):
        @T.prim_func
        def f(A: T.Tensor((4,), T.float4_e2m1fn)):
            with T.Kernel(1, threads=32) as bx:
                pass


def test_host_streams_and_generator():
    from kernforge.tilelang.host_cuda import host_cuda

    saved = torch.Generator, torch.cuda.Stream
    with host_cuda():
        g = torch.Generator(device="cuda").manual_seed(3)
        assert isinstance(g, saved[0]) and g.device.type == "cpu"
        a = torch.randn(4, generator=g, device="cuda")
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            b = a * 2
        s.wait_stream(torch.cuda.default_stream())
        torch.cuda.current_stream().synchronize()
    torch.testing.assert_close(a, torch.randn(4, generator=torch.Generator().manual_seed(3)))
    torch.testing.assert_close(b, a * 2)
    assert (torch.Generator, torch.cuda.Stream) == saved


CALLS = []


@tilelang.autotune(configs=[{"block": 16}, {"block": 32}])
@tilelang.jit
def doubled(X, block: int = 8):
    N = T.const("N")
    X: T.Tensor((N,), T.float32)
    Y = T.empty((N,), T.float32)
    CALLS.append(block)
    with T.Kernel(T.ceildiv(N, block), threads=32) as bx:
        for i in T.Parallel(block):
            Y[bx * block + i] = X[bx * block + i] * 2.0
    return Y


def test_autotune_is_skipped_when_a_tunable_is_given():
    x = torch.randn(40)
    CALLS.clear()
    torch.testing.assert_close(doubled(x, block=8), 2 * x)
    assert set(CALLS) == {8}  # traced for block=8 only: no sweep
    assert doubled.given_tunables((x,), {"block": 8}) == ["block"]
    CALLS.clear()
    torch.testing.assert_close(doubled(x), 2 * x)  # tuned: both configurations traced
    assert {16, 32} <= set(CALLS)
