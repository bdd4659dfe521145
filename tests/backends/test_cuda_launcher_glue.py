"""The CUDA launch glue without a GPU: what reaches cuLaunchKernelEx, in which order and kinds."""
from __future__ import annotations

import torch

import kernforge.dsl as T
from kernforge.backends.cuda import backend as cuda_backend
from kernforge.backends.cuda.renderer import render_cuda


class _RecordingFunction:
    def __init__(self):
        self.calls = []

    def launch(self, values, **config):
        self.calls.append((list(values), config))


def _kernel():
    M = T.symbolic("M")

    @T.prim_func
    def k(X: T.Tensor((M, 8), "bfloat16"), n: T.int32, flag: T.bool_, s: T.float32, Y: T.Tensor((M, 8), "float32")):
        with T.Kernel(T.ceildiv(M, 4), threads=64) as bx:
            S = T.alloc_shared((64 * 1024 // 4,), "float32")
            for i, j in T.Parallel(4, 8):
                if (bx * 4 + i < M) & flag:
                    S[i * 8 + j] = X[bx * 4 + i, j] * s + n
                    Y[bx * 4 + i, j] = S[i * 8 + j]
    return k.ir


def test_launcher_passes_pointers_scalars_then_symbols_with_the_ir_sized_smem():
    kernel = _kernel()
    program = render_cuda(kernel, "sm_90a")
    fn = _RecordingFunction()
    launch = cuda_backend.CudaLauncher(kernel, program, fn)
    x, y = torch.randn(10, 8).bfloat16(), torch.empty(10, 8)
    launch([x, 3, True, 0.5, y], [10], [3])
    (values, config), = fn.calls
    assert values == [x.data_ptr(), 3, 1, 0.5, y.data_ptr(), 10]
    assert config == {"grid": (3,), "block": (64,), "smem_bytes": program.dynamic_smem}
    assert program.dynamic_smem > 48 * 1024  # the runtime raises the limit with cuFuncSetAttribute


class _RecordingModule:
    def __init__(self):
        self.requests = []

    def get_function(self, name, argtypes, restype):
        self.requests.append((name, argtypes, restype))
        return _RecordingFunction()


def _built_argtypes(monkeypatch, kernel, arch="sm_90a"):
    """The (entry, argtypes, restype) that CudaBackend.build asks the loaded module for
    (compilation replaced by a recording module: no nvcc, no GPU)."""
    from kernforge.codegen.renderer import Target

    module = _RecordingModule()
    monkeypatch.setattr(cuda_backend, "_compile", lambda program, kernel, load: module)
    cuda_backend.CudaBackend().build(kernel, Target("cuda", arch))
    (request,) = module.requests
    return request


def test_argument_kinds_follow_the_abi_types(monkeypatch):
    entry, argtypes, restype = _built_argtypes(monkeypatch, _kernel())
    assert entry == render_cuda(_kernel(), "sm_90a").entry and restype == "void"
    # X: bf16 pointer, n: int32, flag: bool passed as a 32-bit int, s: float32, Y: float pointer,
    # then the symbol M as int64
    assert argtypes == ("ptr", "i32", "i32", "f32", "ptr", "i64")


def test_tensor_maps_are_not_plain_arguments(monkeypatch):
    """The TMA variant's CUtensorMap parameters travel by value beside the plain ones, so they
    are not in the function's argtypes: the A, B and C pointers only (static shapes, no symbols)."""
    from tests.backends.test_cuda_semantics import gemm

    kernel = gemm().ir
    assert len(render_cuda(kernel, "sm_90a").tensor_maps) == 3  # A and B load through TMA, C stores through it
    _, argtypes, _ = _built_argtypes(monkeypatch, kernel)
    assert argtypes == ("ptr", "ptr", "ptr")


def test_an_empty_grid_launches_nothing():
    kernel = _kernel()
    fn = _RecordingFunction()
    cuda_backend.CudaLauncher(kernel, render_cuda(kernel, "sm_80"), fn)(
        [torch.empty(0, 8).bfloat16(), 1, False, 1.0, torch.empty(0, 8)], [0], [0])
    assert fn.calls == []


def test_building_without_a_gpu_is_a_clear_error():
    import pytest

    from kernforge.backends import BackendError

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(BackendError, match="needs an NVIDIA GPU"):
        cuda_backend.CudaBackend().build(_kernel())
