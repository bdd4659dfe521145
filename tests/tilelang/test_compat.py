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
                T.alloc_reducer((4,), "float32", op="prod")
    assert "T.alloc_reducer((4,)" in _line(e.value) and "'sum', 'max' and 'min'" in str(e.value)


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


# ---------------------------------------------------------------- host mapping of "cuda" tensors


def test_host_cuda_maps_cuda_tensors_to_host_and_does_not_leak():
    import torch

    from kernforge.tilelang.host_cuda import host_cuda

    sync = torch.cuda.synchronize
    with host_cuda():
        a = torch.randn(3, 4, device="cuda", dtype=torch.float16)
        b = torch.zeros(2, device=torch.device("cuda", 0))
        c = torch.arange(5, device="cuda:0").cuda().to("cuda", torch.float32)
        d = torch.empty(2, device=0)
        e = torch.ones(2).to(torch.device("cuda"))
        f = torch.ones(2).to(dtype=torch.float16, device="cuda")
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda.synchronize()
        end.record()
        assert end.elapsed_time(start) <= 0 <= start.elapsed_time(end)
        assert torch.cuda.synchronize is not sync
    for t in (a, b, c, d, e, f):
        assert t.device.type == "cpu"
    assert c.dtype == torch.float32 and f.dtype == torch.float16 and a.shape == (3, 4)
    assert torch.cuda.synchronize is sync
    if not torch.cuda.is_available():
        with pytest.raises((RuntimeError, AssertionError)):
            torch.zeros(1, device="cuda")  # outside the block nothing is mapped any more


def test_runner_maps_cuda_only_for_host_backends(monkeypatch, tmp_path):
    import torch

    from kernforge.tilelang.__main__ import run

    script = tmp_path / "s.py"
    (tmp_path / "helper_mod_kf.py").write_text("X = 1\n")
    script.write_text("import torch, helper_mod_kf\nt = torch.ones(2, device='cuda')\n")
    monkeypatch.setenv("KERNFORGE_TILELANG_BACKEND", "interp")
    g = run(str(script))
    assert g["t"].device.type == "cpu"
    import sys

    assert "helper_mod_kf" not in sys.modules  # the script's sibling modules are dropped again
    assert not torch.overrides._get_current_function_mode_stack()


def test_tilelang_helper_names():
    import kernforge.tilelang as tl

    assert tl.math.next_power_of_2(1) == 1 and tl.math.next_power_of_2(17) == 32
    assert tl.math.next_power_of_2(64) == 64 and tl.cdiv(65, 64) == 2
    assert tl.PassConfigKey.TL_DISABLE_TMA_LOWER == "tl.disable_tma_lower"
    assert tl.cuda.intrinsics.make_mma_swizzle_layout("s").kind == "mma_swizzle"
    import torch

    tl.utils.tensor.torch_assert_close(torch.ones(1000), torch.ones(1000).index_fill(0, torch.tensor([3]), 2.0))
    with pytest.raises(AssertionError, match="mismatch"):
        tl.utils.tensor.torch_assert_close(torch.ones(100), torch.zeros(100))


def test_boolean_ops_on_symbolic_if_tests_fill_elements_and_vectorized(monkeypatch):
    """`and`/`or`/`not` over symbolic comparisons in an `if` (per element, against numpy),
    T.fill / T.clear of one element or an alloc_var, T.vectorized, memory_order="relaxed"."""
    monkeypatch.setenv("KERNFORGE_TILELANG_BACKEND", "interp")

    @tilelang.jit
    def pick(X, Z, lo: int, hi: int):
        N = T.const("N")
        X: T.Tensor((N,), "float32")
        Z: T.Tensor((1,), "float32")
        Y = T.empty((N,), "float32")
        S = T.empty((2,), "float32")
        with T.Kernel(1, threads=32) as bx:
            acc = T.alloc_var("float32")
            cnt = T.alloc_shared((2,), "float32")
            T.clear(acc)
            T.fill(cnt[1], 7)
            T.fill(cnt[0], 0)
            for i in T.vectorized(N):
                if (X[i] > lo and X[i] < hi) or not X[i] > -hi:
                    Y[i] = X[i]
                else:
                    Y[i] = 0.0
            for i in T.serial(N):
                acc += X[i]
            T.atomic_add(Z[0], acc, memory_order="relaxed")
            S[0] = acc
            S[1] = cnt[1] + cnt[0]
        return Y, S

    x = torch.randn(64) * 3
    z = torch.full((1,), 0.5)
    y, s = pick(x, z, -1, 2)
    xn = x.numpy()
    want = np.where(((xn > -1) & (xn < 2)) | ~(xn > -2), xn, 0.0)
    np.testing.assert_array_equal(y.numpy(), want)
    assert s[1].item() == 7.0
    np.testing.assert_allclose(s[0].item(), xn.sum(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(z.item(), xn.sum() + 0.5, rtol=1e-5, atol=1e-5)

    @tilelang.jit
    def strong(X):
        N = T.const("N")
        X: T.Tensor((N,), "float32")
        with T.Kernel(1) as bx:
            T.atomic_add(X[0], 1.0, memory_order="seq_cst")

    with pytest.raises(ir.KernelError, match="memory_order"):
        strong(torch.zeros(4))
