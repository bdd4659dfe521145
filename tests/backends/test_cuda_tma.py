"""The sm_90a TMA path without a GPU: which loops use it, the kernel ABI (tensor maps after the
symbols), cuTensorMapEncodeTiled's arguments and the launch marshalling through a recording
stand-in for cuda-bindings' driver, and the launch-time fallback to the cp.async variant."""
from __future__ import annotations

import ctypes
from types import SimpleNamespace

import torch

from kernforge.backends.cuda import backend as cuda_backend
from kernforge.runtime import cuda_module
from kernforge.backends.cuda.renderer import TENSOR_MAP_CTYPE, render_cuda
from kernforge.backends.cuda.tma import TensorMapSpec, encode_args
from tests.backends.test_cuda_semantics import gemm


def test_sm_90a_and_sm_100a_pipelines_load_through_tma():
    kernel = gemm().ir
    hopper = render_cuda(kernel, "sm_90a")
    assert hopper.variant == "tma"
    # A (64 x 32 bf16: 64-byte rows) keeps core-matrix boxes; B (32 x 64, MN-major, one warpgroup
    # column of 64) is 128B-swizzled and loads as one 32 x 64 box
    # ... and the epilogue stores C through TMA (64-row boxes of 128-byte swizzled slabs: kf/tma_store.cuh)
    assert [(t.buffer, t.box, t.swizzle) for t in hopper.tensor_maps] == [("A", (8, 8), 0), ("B", (32, 64), 128),
                                                                          ("C", (64, 64), 128)]
    assert hopper.params[-3:] == [("kf_tmap_A_0", TENSOR_MAP_CTYPE), ("kf_tmap_B_1", TENSOR_MAP_CTYPE),
                                  ("kf_tmap_store_C_0", TENSOR_MAP_CTYPE)]
    src = hopper.source
    assert "kf::tma_load_2d(" in src and "kf::mbarrier_wait_parity(" in src and "cp_async_cg_16" not in src
    assert f"{TENSOR_MAP_CTYPE} kf_tmap_A_0" in src
    # sm_100a: the same copy engine, the same whole-tile boxes (its tcgen05.mma reads the same layouts)
    # and the same TMA-store epilogue
    blackwell = render_cuda(kernel, "sm_100a")
    assert [(t.buffer, t.box, t.swizzle) for t in blackwell.tensor_maps] == [("A", (8, 8), 0), ("B", (32, 64), 128),
                                                                             ("C", (64, 64), 128)]
    assert "kf::tma_load_2d(" in blackwell.source and "cp_async_cg_16" not in blackwell.source
    for program in (render_cuda(kernel, "sm_80"), render_cuda(kernel, "sm_90a", tma=False),
                    render_cuda(kernel, "sm_100a", tma=False)):
        assert program.variant == "cp.async" and "CUtensorMap" not in program.source
        assert "kf::cp_async_cg_16" in program.source


def test_a_strided_inner_axis_keeps_cp_async():
    import kernforge.dsl as T

    M, K, sk = T.symbolic("M"), T.symbolic("K"), T.symbolic("sk")

    @T.prim_func
    def strided(A: T.StridedTensor((M, K), (sk, 2), "bfloat16"), C: T.Tensor((M, 64), "float32")):
        with T.Kernel(T.ceildiv(M, 64), threads=128) as bx:
            A_s = T.alloc_shared((64, 64), "bfloat16")
            for k in T.Pipelined(T.ceildiv(K, 64), num_stages=2):
                T.copy(A[bx * 64, k * 64], A_s)
                for i, j in T.Parallel(64, 64):
                    C[bx * 64 + i, j] = C[bx * 64 + i, j] + A_s[i, j]

    assert render_cuda(strided.ir, "sm_90a").variant == "cp.async"


def test_encode_args_reverse_the_axes_and_check_16_byte_rules():
    spec = TensorMapSpec("kf_tmap_B_0", 1, "B", (1, 8, 8), 2)
    b = torch.randn(3, 40, 64).bfloat16()
    args = encode_args(spec, b)
    assert (args.rank, args.elem_bytes, args.address) == (3, 2, b.data_ptr())
    assert args.dims == (64, 40, 3) and args.strides_bytes == (128, 40 * 128) and args.box == (8, 8, 1)
    assert list(args.packed()) == [3, 2, b.data_ptr(), 64, 40, 3, 128, 5120, 8, 8, 1, 0]
    swizzled = encode_args(TensorMapSpec("kf_tmap_B_0", 1, "B", (1, 8, 64), 2, 128), b)
    assert swizzled.swizzle == 128 and list(swizzled.packed())[-4:] == [64, 8, 1, 128]
    assert "stride of 36 elements" in encode_args(spec, torch.randn(3, 40, 36).bfloat16())
    assert "innermost stride is 2" in encode_args(spec, torch.randn(3, 40, 128).bfloat16()[:, :, ::2])
    off = torch.randn(3 * 40 * 64 + 1).bfloat16()[1:].view(3, 40, 64)
    assert "not 16-byte aligned" in encode_args(spec, off)
    assert "empty" in encode_args(spec, torch.empty(0, 40, 64).bfloat16())


class _Map:
    """A stand-in CUtensorMap: 128 bytes whose address the launch must pass."""

    def __init__(self, args):
        self.args = args
        self.storage = (ctypes.c_ubyte * 128)()

    def getPtr(self):
        return ctypes.addressof(self.storage)


class _Names:
    def __getattr__(self, name):
        return name


class _RecordingDriver:
    CUresult = SimpleNamespace(CUDA_SUCCESS=0)
    CUtensorMapDataType = CUtensorMapInterleave = CUtensorMapSwizzle = _Names()
    CUtensorMapL2promotion = CUtensorMapFloatOOBfill = CUfunction_attribute = _Names()
    cuuint64_t = staticmethod(lambda v: ("u64", v))
    cuuint32_t = staticmethod(lambda v: ("u32", v))

    def __init__(self, n_params):
        self.n_params = n_params
        self.encoded, self.maps, self.launches, self.attributes = [], [], [], []

    def cuTensorMapEncodeTiled(self, *args):
        self.encoded.append(args)
        self.maps.append(_Map(args))
        return 0, self.maps[-1]

    def cuFuncSetAttribute(self, *args):
        self.attributes.append(args)
        return (0,)

    def CUlaunchConfig(self):
        return SimpleNamespace()

    def CUstream(self, handle):
        return ("stream", handle)

    def cuLaunchKernelEx(self, config, handle, params, extra):
        """Records the kernelParams slots (their storage lives only during the call)."""
        slots = list((ctypes.c_void_p * self.n_params).from_address(params))
        self.launches.append((config, handle, slots, [ctypes.c_void_p.from_address(p).value for p in slots]))
        return (0,)


def _launcher(monkeypatch, kernel, fallback=None):
    """The real launcher and the runtime's real CudaFunction, over a recording driver."""
    program = render_cuda(kernel, "sm_90a")
    kinds = tuple("ptr" for _, t in program.params if t != TENSOR_MAP_CTYPE)
    driver = _RecordingDriver(len(program.params))
    monkeypatch.setattr(cuda_module, "_driver", lambda: driver)
    function = cuda_module.CudaFunction(None, "kf_kf_test_gemm", "function-handle", (kinds, "void"))
    return cuda_backend.CudaLauncher(kernel, program, function, fallback), driver


def test_launch_encodes_one_map_per_tma_buffer_and_passes_them_after_the_plain_params(monkeypatch):
    kernel = gemm(M=96, N=80, K=72).ir
    launch, driver = _launcher(monkeypatch, kernel)
    a, b, c = torch.randn(96, 72).bfloat16(), torch.randn(72, 80).bfloat16(), torch.empty(96, 80).bfloat16()
    launch([a, b, c], [], [2, 2])
    assert launch.last_variant == "tma"
    u64 = lambda *v: [("u64", x) for x in v]  # noqa: E731
    u32 = lambda *v: [("u32", x) for x in v]  # noqa: E731
    tail = ("CU_TENSOR_MAP_L2_PROMOTION_L2_128B", "CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE")
    assert driver.encoded == [
        ("CU_TENSOR_MAP_DATA_TYPE_UINT16", 2, a.data_ptr(), u64(72, 96), u64(144), u32(8, 8), u32(1, 1),
         "CU_TENSOR_MAP_INTERLEAVE_NONE", "CU_TENSOR_MAP_SWIZZLE_NONE", *tail),
        ("CU_TENSOR_MAP_DATA_TYPE_UINT16", 2, b.data_ptr(), u64(80, 72), u64(160), u32(64, 32), u32(1, 1),
         "CU_TENSOR_MAP_INTERLEAVE_NONE", "CU_TENSOR_MAP_SWIZZLE_128B", *tail),
        # the STSM + TMA-store epilogue's output map: 64 rows x 64 columns (128 bytes) per box
        ("CU_TENSOR_MAP_DATA_TYPE_UINT16", 2, c.data_ptr(), u64(80, 96), u64(160), u32(64, 64), u32(1, 1),
         "CU_TENSOR_MAP_INTERLEAVE_NONE", "CU_TENSOR_MAP_SWIZZLE_128B", *tail),
    ]
    (config, handle, slots, values), = driver.launches
    assert handle == "function-handle"
    assert (config.gridDimX, config.gridDimY, config.gridDimZ) == (2, 2, 1)
    assert (config.blockDimX, config.sharedMemBytes) == (128, render_cuda(kernel, "sm_90a").dynamic_smem)
    assert values[:3] == [a.data_ptr(), b.data_ptr(), c.data_ptr()]
    # the kernel's three CUtensorMap parameters point at the encoded maps' 128 bytes, in order
    assert slots[3:] == [ctypes.addressof(m.storage) for m in driver.maps] and driver.attributes == []


def test_a_misaligned_tensor_runs_the_cp_async_variant(monkeypatch):
    kernel = gemm(M=96, N=80, K=72).ir
    calls = []

    def fallback():
        return lambda args, dims, grid: calls.append((args, list(dims), list(grid)))

    launch, driver = _launcher(monkeypatch, kernel, fallback)
    a = torch.randn(96 * 72 + 1).bfloat16()[1:].view(96, 72)  # data address 2 bytes past alignment
    args = [a, torch.randn(72, 80).bfloat16(), torch.empty(96, 80).bfloat16()]
    launch(args, [], [2, 2])
    assert launch.last_variant == "cp.async" and "A's data address is not 16-byte aligned" in launch.last_fallback_reason
    assert calls == [(args, [], [2, 2])] and driver.encoded == [] and driver.launches == []


def test_empty_grid_launches_nothing(monkeypatch):
    launch, driver = _launcher(monkeypatch, gemm(M=96, N=80, K=72).ir)
    launch([torch.empty(0, 72).bfloat16(), torch.randn(72, 80).bfloat16(), torch.empty(0, 80).bfloat16()], [], [2, 0])
    assert driver.encoded == [] and driver.launches == []


def test_the_installed_cuda_bindings_accepts_the_encode_arguments():
    """Argument conversion happens before the driver is reached: without the driver library the
    call fails for want of it (cuda-pathfinder's DynamicLibNotFoundError naming "cuda"), never on
    the types of its arguments; with a driver and a device it returns the encoded map."""
    import pytest

    driver = pytest.importorskip("cuda.bindings.driver")
    t = torch.randn(96, 72).bfloat16()
    a = encode_args(TensorMapSpec("kf_tmap_A_0", 0, "A", (8, 8), 2), t)

    def encode():
        return cuda_module.encode_tensor_map(rank=a.rank, elem_bytes=a.elem_bytes, address=a.address, dims=a.dims,
                                             strides_bytes=a.strides_bytes, box=a.box)

    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        from cuda.pathfinder import DynamicLibNotFoundError

        with pytest.raises(DynamicLibNotFoundError, match='"cuda" is an NVIDIA driver library'):
            encode()
        return
    (err,) = driver.cuInit(0)
    if err != driver.CUresult.CUDA_SUCCESS:
        pytest.skip(f"a driver library but no usable device: cuInit gives {err}")
    assert isinstance(encode(), driver.CUtensorMap)


def test_launches_go_to_torchs_current_stream(monkeypatch):
    kernel = gemm(M=96, N=80, K=72).ir
    launch, driver = _launcher(monkeypatch, kernel)
    args = [torch.randn(96, 72).bfloat16(), torch.randn(72, 80).bfloat16(), torch.empty(96, 80).bfloat16()]
    launch(args, [], [2, 2])  # torch CUDA never initialised here: the legacy default stream
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: SimpleNamespace(cuda_stream=0xBEEF))
    launch(args, [], [2, 2])
    assert [config.hStream for config, *_ in driver.launches] == [("stream", 0), ("stream", 0xBEEF)]
