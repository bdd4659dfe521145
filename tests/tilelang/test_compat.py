"""kernforge.tilelang's surface: eager-style specialisation and its cache, backend choice,
the aliases of ``python -m kernforge.tilelang``, and typed errors (never AttributeError) at
the author's line for what kernforge cannot run."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import kernforge.dsl as KT
import kernforge.tilelang as tilelang
import kernforge.tilelang.language as T
from kernforge.codegen import ir
from kernforge.jit.kernel import ArgumentError, ShapeError
from kernforge.tilelang.jit import BackendChoiceError, select_backend


@tilelang.jit
def scale_add(X, Y, alpha: float = 2.0, block: int = 16):
    N = T.const("N")
    X: T.Tensor((N,), T.float32)
    Y: T.Tensor((N,), T.float32)
    Z = T.empty((N,), T.float32)
    with T.Kernel(T.ceildiv(N, block), threads=32) as bx:
        for i in T.Parallel(block):
            if bx * block + i < N:
                Z[bx * block + i] = X[bx * block + i] * alpha + Y[bx * block + i]
    return Z


@pytest.fixture(autouse=True)
def interp(monkeypatch):
    monkeypatch.setenv("KERNFORGE_TILELANG_BACKEND", "interp")


def test_eager_specialises_per_shape_and_caches():
    x, y = torch.randn(37, dtype=torch.float64).float(), torch.randn(37).float()
    z = scale_add(x, y)
    torch.testing.assert_close(z.double(), x.double() * 2 + y.double(), rtol=1e-6, atol=1e-6)
    n_specs = len(scale_add._specs)
    scale_add(torch.randn(37), torch.randn(37))
    assert len(scale_add._specs) == n_specs  # same shape: cached
    x5, y5 = torch.randn(5), torch.randn(5)
    torch.testing.assert_close(scale_add(x5, y5, 3.0), x5 * 3 + y5)
    assert len(scale_add._specs) == n_specs + 1
    tir = scale_add.get_tir(N=8)
    assert tir.ir.params[0].shape[0].value == 8 and tir.ir.attrs["N"] == 8


def test_eager_errors_are_typed():
    with pytest.raises(ShapeError, match="'X' must have 1 dimensions"):
        scale_add(torch.randn(3, 3), torch.randn(3))
    with pytest.raises(ArgumentError, match="must be float32"):
        scale_add(torch.randn(4, dtype=torch.float64), torch.randn(4, dtype=torch.float64))
    with pytest.raises(KT.JITError, match="neither a parameter nor a T.const"):
        scale_add.compile(N=8, Q=3)
    with pytest.raises(KT.JITError, match="missing tensor argument"):
        scale_add(torch.randn(4))


def test_unsupported_names_raise_at_author_line():
    with pytest.raises(T.UnsupportedError) as e:
        T.shfl_xor(1, 2)  # the author's line
    assert not isinstance(e.value, AttributeError)
    assert e.value.loc.file == __file__ and "shfl_xor" in str(e.value)
    with pytest.raises(T.UnsupportedError, match="T.no_such_thing"):
        T.no_such_thing(1)
    with pytest.raises(tilelang.UnsupportedError, match="tilelang.carver"):
        tilelang.carver()
    assert not hasattr(T, "__no_dunder__")  # protocol names stay AttributeError


def _line(err) -> str:
    assert err.loc.file == __file__
    return open(__file__).read().splitlines()[err.loc.line - 1]


def test_unsupported_inside_kernel_points_at_kernel_line():
    with pytest.raises(T.UnsupportedError) as e:
        @T.prim_func
        def k(A: T.Tensor((4,), "float32")):
            with T.Kernel(1, threads=32):
                T.alloc_reducer((4,), "float32")
    assert "T.alloc_reducer((4,)" in _line(e.value) and "race" in str(e.value)


def test_barrier_under_divergent_control_flow_is_typed():
    with pytest.raises(T.DivergentBarrierError) as e:
        @T.prim_func
        def k(A: T.Tensor((32,), "float32")):
            with T.Kernel(1, threads=32):
                tx = T.get_thread_binding()
                if tx < 16:
                    T.sync_threads()
                A[tx] = 0
    assert "T.sync_threads()" in _line(e.value)
    with pytest.raises(T.UnsupportedError) as e:
        @T.prim_func
        def k2(A: T.Tensor((32,), "float32")):
            with T.Kernel(1, threads=32):
                for i in T.serial(2):
                    tx = T.get_thread_binding()
                    A[tx] = i
    assert "T.get_thread_binding()" in _line(e.value)


def test_thread_region_lowering():
    """A thread region is one T.Parallel over the block's threads per barrier; a per-thread
    local is a fragment with a row per thread."""
    @T.prim_func
    def k(A: T.Tensor((32,), "float32"), B: T.Tensor((32,), "float32")):
        with T.Kernel(1, threads=32):
            s = T.alloc_shared((32,), "float32")
            tx = T.get_thread_binding()
            r = T.alloc_local((2,), "float32")
            r[1] = A[tx] * 2
            s[tx] = r[1]
            T.sync_threads()
            B[tx] = s[31 - tx] + r[1]
    body = k.ir.body.body
    par = [x for x in body if isinstance(x, ir.Parallel)]
    assert len(par) == 2 and all(p.extents == (32,) for p in par)
    frag = [x.buffer for x in body if isinstance(x, ir.Allocate) and x.buffer.name == "r"][0]
    assert frag.scope == ir.Scope.FRAGMENT and frag.static_shape() == (32, 2)
    out = tilelang.compile(k, out_idx=[1])(a := torch.randn(32))
    torch.testing.assert_close(out, a.flip(0) * 2 + a * 2)


def test_spellings():
    assert T.float is KT.float32 and T.tfloat32 is KT.float32 and T.float8_e4m3fn is KT.float8_e4m3
    assert T.dtype("float16") is KT.float16 and isinstance(KT.bfloat16, T.dtype)
    assert T.Tensor[(4, 8), "float16"] == T.Tensor((4, 8), "float16")
    v = ir.Var("v", KT.float32)
    assert repr(T.reinterpret(v, "uint32")) == repr(T.reinterpret("uint32", v))
    assert repr(v.astype("int32")) == repr(KT.cast(v, "int32"))
    assert tilelang.tvm.tir.const(3, "int8").dtype is KT.int8


def test_hints_are_recorded():
    @T.prim_func
    def k(A: T.Tensor((16,), "float32"), B: T.Tensor((16,), "float32")):
        with T.Kernel(1, threads=32):
            s = T.alloc_shared((16,), "float32")
            T.use_swizzle(panel_size=8)
            T.annotate_layout({s: None})
            T.copy(A, s)
            T.copy(s, B)
    assert k.ir.attrs["tilelang_hints"] == "use_swizzle(panel_size=8,order=row);annotate_layout(s)"


def test_backend_choice(monkeypatch):
    monkeypatch.delenv("KERNFORGE_TILELANG_BACKEND")
    assert select_backend("auto", [torch.zeros(1)]) == "cpu"
    assert select_backend("auto", [np.zeros(1)]) == "cpu"
    assert select_backend("cuda") == "cuda" and select_backend("cpu") == "cpu"
    assert select_backend("cuda-emu -arch=sm_90") == "cuda-emu"
    with pytest.raises(tilelang.UnsupportedError, match="no hip backend"):
        select_backend("hip")
    monkeypatch.setenv("KERNFORGE_TILELANG_BACKEND", "nope")
    with pytest.raises(BackendChoiceError, match="KERNFORGE_TILELANG_BACKEND='nope'"):
        select_backend("cuda")
    monkeypatch.setenv("KERNFORGE_TILELANG_BACKEND", "interp")
    assert select_backend("cuda", [torch.zeros(1)]) == "interp"


def test_module_runner_aliases_for_the_script_only(tmp_path):
    script = tmp_path / "s.py"
    script.write_text(textwrap.dedent("""
        import sys, tilelang, tvm
        import tilelang.language as T
        from tvm import tir
        assert tilelang.__name__ == "kernforge.tilelang" and tir.const(1, "int32").value == 1
        print("argv", sys.argv[1:])
    """))
    out = subprocess.run([sys.executable, "-m", "kernforge.tilelang", str(script), "--x", "1"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "argv ['--x', '1']" in out.stdout
    assert "tilelang" not in sys.modules


def test_profiler_assert_allclose_catches_a_wrong_reference():
    @T.prim_func
    def copy(A: T.Tensor((8,), "float32"), B: T.Tensor((8,), "float32")):
        with T.Kernel(1, threads=32):
            f = T.alloc_fragment((8,), "float32")
            T.copy(A, f)
            T.copy(f, B)
    kernel = tilelang.compile(copy, out_idx=[1])
    prof = kernel.get_profiler()
    prof.assert_allclose(lambda a: a.clone())
    with pytest.raises(AssertionError, match="mismatch"):
        prof.assert_allclose(lambda a: a + 1)
    assert prof.do_bench(warmup=0, rep=1) > 0
