"""CUDA (nvcc -> cubin, resource usage) and Ascend (bisheng -> object) builds."""

import os
import shutil
import stat

import pytest

from conftest import GXX
from kernforge import runtime
from kernforge.runtime.compilers.nvcc import parse_ptxas_report

NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH")

CUDA_SRC = r"""
#include "kf_test/cfg.cuh"
extern "C" __global__ void kf_scale(float* out, const float* in, int n) {
  __shared__ float tile[KF_TILE];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  tile[threadIdx.x % KF_TILE] = i < n ? in[i] : 0.f;
  __syncthreads();
  if (i < n) out[i] = 2.f * tile[threadIdx.x % KF_TILE];
}
extern "C" __global__ void kf_stack(float* out, int k) {
  float local[64];  // runtime-indexed writes force it onto the stack
  for (int j = 0; j < 64; ++j) local[(j * k) & 63] = out[j];
  out[threadIdx.x] = local[(threadIdx.x * 3) & 63];
}
"""


@pytest.fixture
def cuda_inc(tmp_path):
    inc = tmp_path / "inc"
    (inc / "kf_test").mkdir(parents=True)
    (inc / "kf_test" / "cfg.cuh").write_text("#define KF_TILE 256\n")
    return inc


@pytest.mark.nvcc
@needs_nvcc
def test_nvcc_builds_cubin_with_resource_usage(cuda_inc):
    result = runtime.compile_without_load("scale", CUDA_SRC, backend="cuda", options=("-arch=sm_90a",),
                                          include_dirs=(cuda_inc,))
    with open(result.binary_path, "rb") as f:
        assert f.read(4) == b"\x7fELF"
    usage = result.resource_usage
    assert set(usage) == {"kf_scale", "kf_stack"}
    assert usage["kf_scale"]["shared_bytes"] == 256 * 4
    assert usage["kf_scale"]["registers"] > 0 and usage["kf_scale"]["arch"] == "sm_90a"
    assert usage["kf_stack"]["stack_bytes"] >= 64 * 4
    assert usage["kf_scale"]["spill_store_bytes"] == 0
    closure = {r["path"] for r in result.manifest["closure"] if r["anchor"] == "inc0"}
    assert closure == {"kf_test/cfg.cuh"}
    assert any(r["anchor"].startswith("sys") for r in result.manifest["closure"])
    assert all(not os.path.isabs(o) for o in result.manifest["inputs"]["options"])


@pytest.mark.nvcc
@needs_nvcc
def test_nvcc_header_change_and_arch_change_rebuild(cuda_inc):
    first = runtime.compile_without_load("scale", CUDA_SRC, backend="cuda", options=("-arch=sm_90a",),
                                         include_dirs=(cuda_inc,))
    (cuda_inc / "kf_test" / "cfg.cuh").write_text("#define KF_TILE 128\n")
    runtime.reset()
    second = runtime.compile_without_load("scale", CUDA_SRC, backend="cuda", options=("-arch=sm_90a",),
                                          include_dirs=(cuda_inc,))
    assert second.key != first.key and "cfg.cuh changed" in second.miss_reason
    assert second.resource_usage["kf_scale"]["shared_bytes"] == 128 * 4
    third = runtime.compile_without_load("scale", CUDA_SRC, backend="cuda", options=("-arch=sm_80",),
                                         include_dirs=(cuda_inc,))
    assert third.resource_usage["kf_scale"]["arch"] == "sm_80" and "options" in third.miss_reason


@pytest.mark.nvcc
@needs_nvcc
def test_nvcc_fatbin_and_missing_arch(cuda_inc):
    fat = runtime.compile_without_load("scale", CUDA_SRC, backend="cuda", include_dirs=(cuda_inc,),
                                       options=("-fatbin", "-gencode", "arch=compute_90a,code=sm_90a"))
    assert fat.binary_path.endswith("kernel.fatbin") and os.path.getsize(fat.binary_path) > 0
    with pytest.raises(runtime.ConfigError, match="architecture"):
        runtime.compile_without_load("scale", CUDA_SRC, backend="cuda", include_dirs=(cuda_inc,))


def test_ptxas_report_parser_reads_each_kernel():
    log = ("ptxas info    : Compiling entry function 'a' for 'sm_90a'\n"
           "ptxas info    : Function properties for a\n"
           "    16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n"
           "ptxas info    : Used 40 registers, used 1 barriers, 2048 bytes smem, 380 bytes cmem[0]\n"
           "ptxas info    : Compiling entry function 'b' for 'sm_90a'\n"
           "ptxas info    : Function properties for b\n"
           "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
           "ptxas info    : Used 8 registers, used 0 barriers, 360 bytes cmem[0]\n")
    usage = parse_ptxas_report(log)
    assert usage["a"] == {"arch": "sm_90a", "stack_bytes": 16, "spill_store_bytes": 8, "spill_load_bytes": 4,
                          "registers": 40, "shared_bytes": 2048}
    assert usage["b"]["registers"] == 8 and usage["b"]["shared_bytes"] == 0


def test_cuda_launch_without_driver_is_a_clear_error(cuda_inc):
    if NVCC is None:
        pytest.skip("nvcc not on PATH")
    module = runtime.compile("scale", CUDA_SRC, backend="cuda", options=("-arch=sm_90a",), include_dirs=(cuda_inc,))
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if has_gpu:
        pytest.skip("a GPU is present; covered by test_cuda_launch_on_gpu")
    with pytest.raises(runtime.LoadError, match="cuda-bindings|CUDA driver"):
        module.get_function("kf_scale", argtypes=("ptr", "ptr", "i32"))


@pytest.mark.gpu
def test_cuda_launch_on_gpu(cuda_inc):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    pytest.importorskip("cuda.bindings")
    module = runtime.compile("scale", CUDA_SRC, backend="cuda", options=("-arch=sm_90a",), include_dirs=(cuda_inc,))
    fn = module.get_function("kf_scale", argtypes=("ptr", "ptr", "i32"), restype="void")
    x = torch.randn(1000, device="cuda")
    out = torch.full_like(x, float("nan"))
    fn[(4,), (256,)](out, x, 1000)
    torch.cuda.synchronize()
    torch.testing.assert_close(out, 2 * x)
    with pytest.raises(runtime.LaunchError):
        fn[(4,), (256,)](out, x.cpu(), 1000)


def test_ascend_build_through_bisheng(tmp_path, monkeypatch):
    fake = tmp_path / "bisheng"  # stands in for CANN's compiler: same driver interface
    fake.write_text(f'#!/bin/sh\nexec {GXX} "$@"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("ASCEND_HOME_PATH", str(tmp_path / "cann"))
    (tmp_path / "cann" / "bin").mkdir(parents=True)
    os.symlink(fake, tmp_path / "cann" / "bin" / "bisheng")
    runtime.reset()
    src = 'extern "C" int kf_ascend_stub(int x) { return x + 1; }\n'
    result = runtime.compile_without_load("asc", src, backend="ascend", options=("-DKF_ASCEND",))
    with open(result.binary_path, "rb") as f:
        assert f.read(4) == b"\x7fELF"
    assert result.manifest["inputs"]["compiler"]["kind"] == "bisheng"
    with pytest.raises(runtime.LoadError, match="compile_without_load"):
        runtime.compile("asc", src, backend="ascend", options=("-DKF_ASCEND",))


def test_ascend_without_toolchain(monkeypatch, tmp_path):
    monkeypatch.delenv("ASCEND_HOME_PATH", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    runtime.reset()
    with pytest.raises(runtime.ToolchainNotFoundError, match="toolchain not found.*bisheng"):
        runtime.compile_without_load("asc", "int x;\n", backend="ascend")


def _has_nvrtc():
    try:
        from cuda.bindings import nvrtc

        return nvrtc.nvrtcVersion()[0] == nvrtc.nvrtcResult.NVRTC_SUCCESS
    except Exception:
        return False


@pytest.mark.skipif(not _has_nvrtc(), reason="cuda-bindings with NVRTC not installed")
def test_nvrtc_builds_cubin_and_tracks_include_dirs(cuda_inc, monkeypatch, tmp_path):
    monkeypatch.setenv("KERNFORGE_JIT_USE_NVRTC", "1")
    runtime.reset()
    first = runtime.compile_without_load("rtc", CUDA_SRC, backend="cuda", options=("-arch=sm_90a",),
                                         include_dirs=(cuda_inc,))
    with open(first.binary_path, "rb") as f:
        assert f.read(4) == b"\x7fELF"
    assert first.manifest["inputs"]["compiler"]["kind"] == "nvrtc"
    assert first.resource_usage["kf_scale"]["shared_bytes"] == 256 * 4
    (cuda_inc / "kf_test" / "cfg.cuh").write_text("#define KF_TILE 64\n")
    second = runtime.compile_without_load("rtc", CUDA_SRC, backend="cuda", options=("-arch=sm_90a",),
                                          include_dirs=(cuda_inc,))
    assert second.key != first.key and second.resource_usage["kf_scale"]["shared_bytes"] == 64 * 4
    with pytest.raises(runtime.ConfigError, match="include_dirs"):
        runtime.compile_without_load("rtc", CUDA_SRC, backend="cuda", options=("-arch=sm_90a", f"-I{cuda_inc}"))
    outside = tmp_path / "abs.cuh"
    outside.write_text("#define KF_TILE 32\n")
    with pytest.raises(runtime.ConfigError, match="absolute path"):
        runtime.compile_without_load("rtc", f'#include "{outside}"\n' + CUDA_SRC.split("\n", 2)[2],
                                     backend="cuda", options=("-arch=sm_90a",))
