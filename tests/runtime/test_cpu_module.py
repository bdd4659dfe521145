"""CPU compile, load and checked calls against numpy/torch references."""

import ctypes
import os

import numpy as np
import pytest
import torch

from kernforge import runtime
from rt_sources import AXPY, THREADS


@pytest.fixture
def headers(tmp_path):
    inc = tmp_path / "inc"
    (inc / "kf_test").mkdir(parents=True)
    (inc / "kf_test" / "scale.h").write_text("#define KF_ALPHA 2.5f\n")
    return inc


@pytest.fixture
def axpy(headers):
    module = runtime.compile("axpy", AXPY, include_dirs=(headers,))
    return module.get_function("kf_axpy", argtypes=("ptr", "ptr"), restype="i32")


@pytest.mark.parametrize("n", [1, 7, 1000, 4097])
def test_axpy_matches_numpy(axpy, n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    out = np.full(n, np.nan, np.float32)  # poison: unwritten elements stay NaN
    status = axpy(runtime.pack_pointers([x, y, out]), runtime.pack_dims([n]))
    assert status == 0
    np.testing.assert_allclose(out, np.float32(2.5) * x + y, rtol=1e-6, atol=1e-6)


def test_axpy_accepts_torch_tensors_and_reports_kernel_errors(axpy):
    x, y = torch.randn(333), torch.randn(333)
    out = torch.full((333,), float("nan"))
    assert axpy(runtime.pack_pointers([x, y, out]), runtime.pack_dims([333])) == 0
    torch.testing.assert_close(out.double(), 2.5 * x.double() + y.double(), rtol=1e-6, atol=1e-6)
    assert axpy(runtime.pack_pointers([x, y, out]), runtime.pack_dims([-1])) == 2


def test_raw_cfunc_is_a_ctypes_function_pointer(headers):
    module = runtime.compile("axpy", AXPY, include_dirs=(headers,))
    fn = module.get_function("kf_axpy")
    x = np.arange(5, dtype=np.float32) + 1
    y = np.ones(5, np.float32)
    out = np.full(5, np.nan, np.float32)
    fn.cfunc.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    fn.cfunc(ctypes.cast(runtime.pack_pointers([x, y, out]), ctypes.c_void_p),
             ctypes.cast(runtime.pack_dims([5]), ctypes.c_void_p))
    np.testing.assert_allclose(out, 2.5 * x + y)
    with pytest.raises(runtime.LoadError, match="no declared signature"):
        fn(1, 2)


def test_bad_arguments_raise_before_the_call(axpy):
    arr = np.zeros(4, np.float32)
    with pytest.raises(runtime.LaunchError, match="takes 2 arguments"):
        axpy(runtime.pack_pointers([arr]))
    with pytest.raises(runtime.LaunchError, match="expected a pointer"):
        axpy(1.5, runtime.pack_dims([1]))
    with pytest.raises(runtime.LaunchError, match="bool"):
        axpy(True, runtime.pack_dims([1]))
    with pytest.raises(runtime.LaunchError, match="not C-contiguous"):
        runtime.pack_pointers([np.zeros((4, 4), np.float32)[:, 1]])
    with pytest.raises(runtime.LaunchError, match="not contiguous"):
        runtime.pack_pointers([torch.zeros(4, 4).t()])
    with pytest.raises(runtime.LaunchError, match="does not fit i64"):
        runtime.pack_dims([1 << 70])
    with pytest.raises(runtime.LaunchError, match="out of range"):
        runtime.pack_pointers([-5])


def test_signature_kinds_are_validated(headers):
    module = runtime.compile("axpy", AXPY, include_dirs=(headers,))
    with pytest.raises(runtime.ConfigError, match="unknown argument kind"):
        module.get_function("kf_axpy", argtypes=("pointer",))
    with pytest.raises(runtime.ConfigError, match="not a string"):
        module.get_function("kf_axpy", argtypes="ptr")
    with pytest.raises(runtime.LoadError, match="not found"):
        module.get_function("kf_missing")


def test_scalar_kinds_round_trip():
    source = r'''
    #include <cstdint>
    extern "C" double mix(int32_t a, int64_t b, uint32_t c, float d, double e) { return a + b + c + d + e; }
    '''
    fn = runtime.compile("mix", source).get_function("mix", argtypes=("i32", "i64", "u32", "f32", "f64"),
                                                       restype="f64")
    assert fn(-3, 1 << 40, 7, 0.5, np.float64(0.25)) == pytest.approx(-3 + (1 << 40) + 7 + 0.75)
    with pytest.raises(runtime.LaunchError, match="does not fit u32"):
        fn(0, 0, -1, 0.0, 0.0)
    with pytest.raises(runtime.LaunchError, match="expected integer"):
        fn(0.5, 0, 0, 0.0, 0.0)


def test_openmp_runs_more_than_one_thread():
    fn = runtime.compile("threads", THREADS).get_function("kf_threads", argtypes=("ptr", "ptr"))
    out = np.full(1, -1, np.int64)
    assert fn(runtime.pack_pointers([out]), runtime.pack_dims([0])) == 0
    assert out[0] == 2


def test_default_flags_and_native_arch_are_resolved_in_the_key():
    module = runtime.compile("threads", THREADS)
    inputs = module.manifest["inputs"]
    for flag in ("-O3", "-std=c++17", "-fPIC", "-shared", "-fopenmp", "-march=native", "-ffp-contract=off"):
        assert flag in inputs["options"]
    machine = inputs["compiler"]["machine"]
    assert machine and not any(tok == "-march=native" for tok in machine)
    assert all(not os.path.isabs(part) for part in inputs["options"])


def test_compile_error_carries_command_and_diagnostics():
    with pytest.raises(runtime.CompileError, match="exit code") as info:
        runtime.compile("broken", "extern \"C\" int f() { return undefined_name; }\n")
    assert "undefined_name" in str(info.value)


def test_toolchain_not_found(monkeypatch, tmp_path):
    monkeypatch.setenv("KERNFORGE_JIT_CXX", str(tmp_path / "no-such-g++"))
    runtime.reset()
    with pytest.raises(runtime.ToolchainNotFoundError, match="toolchain not found"):
        runtime.compile("t", THREADS)
    monkeypatch.delenv("KERNFORGE_JIT_CXX")
    monkeypatch.setenv("PATH", str(tmp_path))
    runtime.reset()
    with pytest.raises(runtime.ToolchainNotFoundError, match="toolchain not found: no C\\+\\+ compiler"):
        runtime.compile("t", THREADS)


@pytest.mark.parametrize("kwargs,match", [
    ({"tag": "bad tag"}, "letters, digits"),
    ({"source": ""}, "non-empty"),
    ({"backend": "tpu"}, "unknown backend"),
    ({"options": "-O2"}, "not a single string"),
    ({"include_dirs": ("/no/such/dir",)}, "does not exist"),
    ({"dependency_signature": 3}, "must be a string"),
])
def test_bad_requests_are_rejected_before_work(kwargs, match, cache_root):
    args = dict(tag="ok", source=THREADS)
    args.update(kwargs)
    tag, source = args.pop("tag"), args.pop("source")
    with pytest.raises(runtime.ConfigError, match=match):
        runtime.compile(tag, source, **args)
    assert not os.path.exists(cache_root / "cache")


def test_tag_is_not_part_of_the_key():
    a = runtime.compile_without_load("first", THREADS)
    b = runtime.compile_without_load("second", THREADS)
    assert a.key == b.key and a.path != b.path


def test_no_fma_contraction_so_rounding_matches_numpy():
    source = r'''
    #include <cstdint>
    extern "C" int kf_mix(void** args, const int64_t* dims) {
      const float* x = static_cast<const float*>(args[0]);
      float* out = static_cast<float*>(args[1]);
      for (int64_t i = 0; i < dims[0]; ++i) out[i] = x[i] / 3.0f - x[i] * x[i];
      return 0;
    }
    '''
    fn = runtime.compile("mix_round", source).get_function("kf_mix", argtypes=("ptr", "ptr"))
    x = (np.random.default_rng(7).standard_normal(4096) * 4).astype(np.float32)
    out = np.full_like(x, np.nan)
    assert fn(runtime.pack_pointers([x, out]), runtime.pack_dims([x.size])) == 0
    np.testing.assert_array_equal(out.view(np.uint32), (x / np.float32(3) - x * x).view(np.uint32))
