"""Loading and launching CUDA binaries through cuda-bindings' driver API.

This module is the only place in kernforge that calls the CUDA driver:
loading, launching, and encoding TMA tensor maps.  cuda-bindings is imported
here only, and only when a function of a CUDA module is first requested, so
compiling (and ``compile_without_load``) needs neither a GPU nor cuda-bindings.

A launch reads ``fn[grid, block](*args)`` or
``fn[grid, block, smem_bytes, stream](*args)``, or spelled out with
:meth:`CudaFunction.launch` (cluster dims and tensor maps too).  Arguments are
checked against the declared kinds (see :mod:`kernforge.runtime.args`);
tensors must be contiguous and on a CUDA device.  Dynamic shared memory above
48 KB raises the function's limit with ``cuFuncSetAttribute`` before the launch.

Launches go to torch's *current* CUDA stream unless a stream is given, so they
order with the surrounding torch work and are captured by CUDA graphs.
"""

from __future__ import annotations

import ctypes
import threading

from .args import convert
from .errors import LaunchError, LoadError
from .module import Module

_DEFAULT_SMEM_LIMIT = 48 * 1024


def _has_gpu() -> bool:
    """Whether an NVIDIA GPU is visible: torch's answer if torch is loaded, else the driver's device nodes."""
    import glob
    import sys

    torch = sys.modules.get("torch")
    if torch is not None:
        return bool(torch.cuda.is_available())
    return bool(glob.glob("/dev/nvidia[0-9]*"))


def _driver():
    try:
        from cuda.bindings import driver
    except ImportError as exc:
        if not _has_gpu():  # installing cuda-bindings cannot help: there is no device to load onto
            raise LoadError(
                "cannot load CUDA modules: this machine has no NVIDIA GPU or CUDA driver; they still compile "
                "(kernforge build, compile_without_load) and the cuda-emu backend emulates them"
            ) from exc
        raise LoadError(
            "loading CUDA modules needs cuda-bindings: pip install 'kernforge[cuda]' "
            "(compile_without_load works without it)"
        ) from exc
    return driver


def _check(result, what: str):
    """Unpack a cuda-bindings result tuple, raising on a non-success code."""
    driver = _driver()
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(err)
        raise LoadError(f"{what} failed: {name.decode() if isinstance(name, bytes) else name}")
    return values[0] if len(values) == 1 else values


_context_lock = threading.Lock()


def _ensure_context():
    """Use the current context (e.g. PyTorch's), else device 0's primary one."""
    driver = _driver()
    with _context_lock:
        try:
            _check(driver.cuInit(0), "cuInit")
        except Exception as exc:
            raise LoadError(f"no usable CUDA driver/GPU: {exc}") from exc
        ctx = _check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
        if int(ctx) == 0:
            device = _check(driver.cuDeviceGet(0), "cuDeviceGet")
            ctx = _check(driver.cuDevicePrimaryCtxRetain(device), "cuDevicePrimaryCtxRetain")
            _check(driver.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")


class CudaModule(Module):
    device = "cuda"

    def __init__(self, entry_dir, manifest, miss_reason):
        super().__init__(entry_dir, manifest, miss_reason)
        # Read now: the driver loads lazily, and the entry may be evicted meanwhile.
        with open(self.binary_path, "rb") as f:
            self._image = f.read()
        self._handle = None

    def _module_handle(self):
        if self._handle is None:
            _ensure_context()
            self._handle = _check(_driver().cuModuleLoadData(self._image), f"cuModuleLoadData({self.binary_path})")
        return self._handle

    def _function(self, name, signature):
        if signature is None:
            raise LoadError(f"declare the kernel's argument kinds: get_function({name!r}, argtypes=(...))")
        handle = _check(_driver().cuModuleGetFunction(self._module_handle(), name.encode()),
                        f"cuModuleGetFunction({name})")
        return CudaFunction(self, name, handle, signature)


class CudaFunction:
    def __init__(self, module: CudaModule, name: str, handle, signature):
        argtypes, restype = signature
        if restype not in ("void", "i32"):
            raise LoadError("CUDA kernels return void")
        self.module = module
        self.name = name
        self.handle = handle
        self.argtypes = argtypes
        self._smem_limit = _DEFAULT_SMEM_LIMIT

    def __getitem__(self, config):
        if not isinstance(config, tuple) or not 2 <= len(config) <= 4:
            raise LaunchError("use fn[grid, block] or fn[grid, block, smem_bytes, stream]")
        grid, block, *rest = config
        smem = rest[0] if rest else 0
        stream = rest[1] if len(rest) > 1 else 0
        return lambda *args: self.launch(args, grid=grid, block=block, smem_bytes=smem, stream=stream)

    def launch(self, args, *, grid, block, smem_bytes=0, stream=None, cluster=(1, 1, 1), tensor_maps=()):
        """Launch on ``stream`` (None: torch's current stream).  ``tensor_maps`` (from
        :func:`encode_tensor_map`) are passed as 128-byte ``CUtensorMap`` parameters after
        the plain ones."""
        grid, block, cluster = _dims(grid, "grid"), _dims(block, "block"), _dims(cluster, "cluster")
        if not isinstance(smem_bytes, int) or smem_bytes < 0:
            raise LaunchError(f"smem_bytes must be a non-negative int, got {smem_bytes!r}")
        values = convert(self.argtypes, tuple(args), "cuda", self.name)
        driver = _driver()
        if smem_bytes > self._smem_limit:
            attribute = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            _check(driver.cuFuncSetAttribute(self.handle, attribute, smem_bytes), "cuFuncSetAttribute")
            self._smem_limit = smem_bytes
        config = driver.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = grid
        config.blockDimX, config.blockDimY, config.blockDimZ = block
        config.sharedMemBytes = smem_bytes
        config.hStream = _stream_handle(stream)
        if cluster != (1, 1, 1):
            attr = driver.CUlaunchAttribute()
            attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = cluster
            config.attrs = [attr]
            config.numAttrs = 1
        addresses = [ctypes.addressof(v) for v in values] + [int(m.getPtr()) for m in tensor_maps]
        pointers = (ctypes.c_void_p * max(len(addresses), 1))(*addresses)
        _check(driver.cuLaunchKernelEx(config, self.handle, ctypes.addressof(pointers), 0), f"launch {self.name}")

    def __repr__(self) -> str:
        return f"CudaFunction({self.name!r}, argtypes={self.argtypes})"


def _dims(value, what: str) -> tuple[int, int, int]:
    dims = (value,) if isinstance(value, int) else tuple(value)
    if not 1 <= len(dims) <= 3 or any(not isinstance(d, int) or isinstance(d, bool) or d <= 0 for d in dims):
        raise LaunchError(f"{what} must be 1-3 positive ints, got {value!r}")
    return dims + (1,) * (3 - len(dims))


def _current_stream() -> int:
    """The handle of torch's current CUDA stream (0, the legacy default stream, without torch CUDA)."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return 0
    return int(torch.cuda.current_stream().cuda_stream)


def _stream_handle(stream):
    """None: torch's current stream; 0: the legacy default stream; an int handle; or a torch.cuda.Stream."""
    driver = _driver()
    if stream is None:
        return driver.CUstream(_current_stream())
    if stream == 0:
        return driver.CUstream(0)
    if isinstance(stream, int):
        return driver.CUstream(stream)
    if hasattr(stream, "cuda_stream"):
        return driver.CUstream(stream.cuda_stream)
    raise LaunchError(f"unsupported stream {stream!r}: give an int handle or a torch.cuda.Stream")


_TENSOR_MAP_DATA_TYPE = {1: "CU_TENSOR_MAP_DATA_TYPE_UINT8", 2: "CU_TENSOR_MAP_DATA_TYPE_UINT16",
                         4: "CU_TENSOR_MAP_DATA_TYPE_UINT32", 8: "CU_TENSOR_MAP_DATA_TYPE_UINT64"}


def encode_tensor_map(*, rank: int, elem_bytes: int, address: int, dims, strides_bytes, box, swizzle: int = 0):
    """``cuTensorMapEncodeTiled`` for one tiled map (dimension 0 innermost): no interleave,
    ``swizzle`` bytes 0 (none) or 128 (``SWIZZLE_128B``), 128-byte L2 promotion, out-of-bounds
    elements read as zero (``FLOAT_OOB_FILL_NONE``); the data type only sets the element size
    (the copy moves bits)."""
    d = _driver()
    mode = {0: d.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE, 128: d.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B}
    if swizzle not in mode:
        raise LaunchError(f"tensor map swizzle of {swizzle} bytes: kernforge uses 0 or 128")
    u64, u32 = d.cuuint64_t, d.cuuint32_t  # cuda-bindings takes its own integer wrappers in these lists
    return _check(d.cuTensorMapEncodeTiled(
        getattr(d.CUtensorMapDataType, _TENSOR_MAP_DATA_TYPE[elem_bytes]), rank, address,
        [u64(x) for x in dims], [u64(x) for x in strides_bytes], [u32(x) for x in box], [u32(1)] * rank,
        d.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, mode[swizzle],
        d.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        d.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE), "cuTensorMapEncodeTiled")
