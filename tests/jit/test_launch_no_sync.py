"""What CUDA-graph capture needs from a launch, without a GPU: a compiled kernel's call on the
"cuda" launch path (CompiledKernel -> CudaLauncher -> CudaFunction.launch) makes no
synchronising driver call and no host-syncing torch op, and launches on torch's current stream.

The driver is a recording stand-in for cuda-bindings' (every call it gets is logged, unknown
ones included) and the CUDA backend is registered under a test name that takes host tensors,
so the real launch code runs down to ``cuLaunchKernelEx``."""
from types import SimpleNamespace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import kernforge
from kernforge import backends
from kernforge.backends.cuda import backend as cuda_backend
from kernforge.backends import registry
from kernforge.codegen.renderer import Target
from kernforge.runtime import cuda_module
from tests.backends.test_cuda_semantics import gemm
from tests.jit.kernels import axpy

#: what a capturable launch may call: building the launch config and launching it
LAUNCH_CALLS = {"CUlaunchConfig", "CUstream", "cuLaunchKernelEx", "cuFuncSetAttribute", "cuTensorMapEncodeTiled"}


class RecordingDriver:
    CUresult = SimpleNamespace(CUDA_SUCCESS=0)

    def __init__(self):
        self.calls, self.configs = [], []

    def __getattr__(self, name):
        if name.startswith("CUtensorMap") or name == "CUfunction_attribute":
            return _Names()  # enum namespaces: their members' names stand for the values
        if name in ("cuuint64_t", "cuuint32_t"):
            return lambda v: v

        def call(*args):
            self.calls.append(name)
            if name == "CUlaunchConfig":
                return SimpleNamespace()
            if name == "CUstream":
                return ("stream", args[0])
            if name == "cuLaunchKernelEx":
                self.configs.append(args[0])
            if name == "cuTensorMapEncodeTiled":
                return 0, _Map()
            return (0,)
        return call


class _Names:
    def __getattr__(self, name):
        return name


class _Map:
    def __init__(self):
        import ctypes

        self.storage = (ctypes.c_ubyte * 128)()

    def getPtr(self):
        import ctypes

        return ctypes.addressof(self.storage)


class TorchOps(TorchDispatchMode):
    """Records every aten op run while active (``.item()``, ``.cpu()``, ``nonzero`` ... included)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


class HostTensorCuda(cuda_backend.CudaBackend):
    """The CUDA backend's real build and launcher over a module whose functions are real
    ``CudaFunction``s (no nvcc, no GPU); registered with device "cpu" to take host tensors."""

    def target(self, arch=None, launch=False):
        return Target("cuda", "sm_90a")

    def build(self, kernel, target=None):
        launcher = super().build(kernel, target)
        launcher.takes_torch = True  # CudaLauncher reads tensors' data pointers itself
        return launcher


class _Module:
    def get_function(self, name, argtypes, restype):
        return cuda_module.CudaFunction(None, name, "function-handle", (argtypes, restype))


@pytest.fixture
def recorded(monkeypatch):
    driver = RecordingDriver()
    monkeypatch.setattr(cuda_module, "_driver", lambda: driver)
    monkeypatch.setattr(cuda_backend, "_compile", lambda program, kernel, load: _Module())
    monkeypatch.setitem(registry._ENTRIES, "cuda-recorded",
                        backends.Entry("cuda-recorded", HostTensorCuda, "cpu", "cuda"))
    monkeypatch.delitem(registry._INSTANCES, "cuda-recorded", raising=False)
    yield driver
    registry._INSTANCES.pop("cuda-recorded", None)


@pytest.mark.parametrize("case", ["out_idx", "tma_gemm"])
def test_a_launch_makes_no_synchronising_call(recorded, case):
    if case == "out_idx":
        kernel = kernforge.compile(axpy, backend="cuda-recorded", out_idx=3)
        args = (torch.randn(40, 16), 2.0, torch.randn(40, 16))
    else:
        kernel = kernforge.compile(gemm(M=96, N=80, K=72), backend="cuda-recorded")
        args = (torch.randn(96, 72).bfloat16(), torch.randn(72, 80).bfloat16(), torch.empty(96, 80).bfloat16())
    for _ in range(3):  # the first call plans (checks, binds symbols); later ones hit the memo
        recorded.calls.clear()
        with TorchOps() as seen:
            kernel(*args)
        assert "cuLaunchKernelEx" in recorded.calls
        assert set(recorded.calls) <= LAUNCH_CALLS, recorded.calls
        # the only torch work: allocating out_idx outputs (the caching allocator; capture-safe)
        assert set(seen.ops) <= {"aten.empty.memory_format"}, seen.ops
        assert bool(seen.ops) == (case == "out_idx")
    assert kernel.launcher.last_variant == ("tma" if case == "tma_gemm" else "cp.async")


def test_launches_follow_torchs_current_stream(recorded, monkeypatch):
    kernel = kernforge.compile(axpy, backend="cuda-recorded", out_idx=3)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    for handle in (0xCAFE, 0xBEEF):  # e.g. a capture stream, then another
        monkeypatch.setattr(torch.cuda, "current_stream", lambda: SimpleNamespace(cuda_stream=handle))
        kernel(torch.randn(8, 16), 1.0, torch.randn(8, 16))
    assert [c.hStream for c in recorded.configs] == [("stream", 0xCAFE), ("stream", 0xBEEF)]
