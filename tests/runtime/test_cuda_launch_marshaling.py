"""What the CUDA launcher hands the driver, checked against a recording stand-in.

No GPU here: the stand-in records cuFuncSetAttribute / cuLaunchKernelEx and
reads the kernel-parameter array back through its addresses, so the test sees
exactly the bytes a real driver would.
"""

import ctypes
import types

import pytest

from kernforge.runtime import cuda_module
from kernforge.runtime.errors import LaunchError


class FakeDriver:
    class CUresult:
        CUDA_SUCCESS = 0

    class CUfunction_attribute:
        CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8

    class CUlaunchAttributeID:
        CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4

    class CUlaunchConfig:
        attrs = ()
        numAttrs = 0

    class CUlaunchAttribute:
        def __init__(self):
            self.id = None
            self.value = types.SimpleNamespace(clusterDim=types.SimpleNamespace(x=0, y=0, z=0))

    @staticmethod
    def CUstream(handle):
        return ("stream", handle)

    def __init__(self):
        self.attributes, self.launches = [], []
        self.num_params = 1

    def cuFuncSetAttribute(self, func, attribute, value):
        self.attributes.append((func, attribute, value))
        return (0,)

    def cuLaunchKernelEx(self, config, func, params, extra):
        # Like the driver, read the parameters during the call: 8 bytes behind each pointer.
        array = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
        raw = [ctypes.string_at(array[i], 8) for i in range(self.num_params)]
        self.launches.append((config, func, raw))
        return (0,)


@pytest.fixture
def driver(monkeypatch):
    fake = FakeDriver()
    monkeypatch.setattr(cuda_module, "_driver", lambda: fake)
    return fake


def make_function(argtypes):
    module = object.__new__(cuda_module.CudaModule)
    return cuda_module.CudaFunction(module, "kf_k", "HANDLE", (argtypes, "void"))


def test_launch_passes_grid_block_smem_cluster_and_argument_bytes(driver):
    fn = make_function(("ptr", "i32", "f32", "u64"))
    driver.num_params = 4
    fn.launch((0xDEAD0000, -7, 1.5, 2**40), grid=(3, 2), block=128, smem_bytes=100_000, cluster=(2, 1, 1),
              stream=5)
    assert driver.attributes == [("HANDLE", 8, 100_000)]  # >48 KB raises the limit first
    config, func, params = driver.launches[0]
    assert func == "HANDLE"
    assert (config.gridDimX, config.gridDimY, config.gridDimZ) == (3, 2, 1)
    assert (config.blockDimX, config.blockDimY, config.blockDimZ) == (128, 1, 1)
    assert config.sharedMemBytes == 100_000 and config.hStream == ("stream", 5)
    assert config.numAttrs == 1 and config.attrs[0].id == 4
    assert (config.attrs[0].value.clusterDim.x, config.attrs[0].value.clusterDim.y) == (2, 1)
    assert ctypes.c_void_p.from_buffer_copy(params[0]).value == 0xDEAD0000
    assert ctypes.c_int32.from_buffer_copy(params[1][:4]).value == -7
    assert ctypes.c_float.from_buffer_copy(params[2][:4]).value == 1.5
    assert ctypes.c_uint64.from_buffer_copy(params[3]).value == 2**40


def test_small_smem_keeps_default_limit_and_subscript_form(driver):
    fn = make_function(("ptr",))
    fn[(1,), (32,)](0x1000)
    fn[(1,), (32,), 1024, 0](0x2000)
    assert driver.attributes == [] and len(driver.launches) == 2
    assert driver.launches[1][0].sharedMemBytes == 1024 and driver.launches[1][0].numAttrs == 0


@pytest.mark.parametrize("kwargs,match", [
    ({"grid": (0,), "block": 32}, "grid"),
    ({"grid": 1, "block": (32, 1, 1, 1)}, "block"),
    ({"grid": 1, "block": 32, "smem_bytes": -1}, "smem_bytes"),
    ({"grid": 1, "block": 32, "stream": "s"}, "stream"),
])
def test_bad_launch_configuration_is_refused(driver, kwargs, match):
    with pytest.raises(LaunchError, match=match):
        make_function(("ptr",)).launch((0x1000,), **kwargs)
    assert driver.launches == []


def test_host_arrays_are_refused_for_device_kernels(driver):
    np = pytest.importorskip("numpy")
    with pytest.raises(LaunchError, match="host memory"):
        make_function(("ptr",))[(1,), (1,)](np.zeros(4))
    assert driver.launches == []
