"""TileLang's remaining spellings, for ``kernforge.tilelang.language`` (TileLang programs run
unchanged, docs/tilelang.md).

They live in the DSL package, not in the compat layer, for one reason: errors must carry the
kernel author's file and line, and :func:`kernforge.codegen.ir.caller_loc` skips the DSL's
own frames only.  They are not part of ``kernforge.dsl``'s own vocabulary (``__all__``):
each is either a different spelling of a DSL call, a performance hint that is recorded, or
a construct kernforge cannot run, which raises :class:`UnsupportedError` naming it and why.
"""
from __future__ import annotations

from typing import Optional

from kernforge import dtypes
from kernforge.codegen import ir
from kernforge.dsl import alloc as _alloc
from kernforge.dsl import builder as B
from kernforge.dsl import loop as _loop
from kernforge.dsl import math as _math
from kernforge.dsl import reduce as _reduce
from kernforge.dsl.handles import TensorHandle, VarHandle
from kernforge.dsl.types import TensorType
from kernforge.dsl.types import Tensor as _tensor
from kernforge.dsl.types import dtype_arg


class UnsupportedError(ir.KernelError, NotImplementedError):
    """A TileLang construct kernforge cannot run; the message names it and says why, at
    the author's line."""


def unsupported(name: str, why: str):
    """A stand-in for TileLang's ``name``: calling it raises :class:`UnsupportedError`."""
    def f(*args, **kwargs):
        raise UnsupportedError(f"T.{name} is not supported by kernforge: {why}", ir.caller_loc())
    f.__name__ = f.__qualname__ = name
    f.__doc__ = f"Not supported: {why}"
    return f


# ---------------------------------------------------------------- dtypes

float = dtypes.float32  # noqa: A001 - TileLang's T.float is float32
tfloat32 = dtypes.float32
"""TF32 is a tensor-core compute mode, not a storage type: tensors are float32 and
kernforge's gemms compute float32 products (at least as precise as TF32)."""
float8_e4m3fn = dtypes.float8_e4m3


class _DTypeMeta(type):
    def __instancecheck__(cls, x):
        return isinstance(x, dtypes.DType)


class dtype(metaclass=_DTypeMeta):  # noqa: N801 - TileLang spelling
    """``T.dtype``: the type of dtypes (``dtype: T.dtype = T.float16`` in a signature) and
    the conversion ``T.dtype("float16")`` -> the DType."""

    def __new__(cls, x):
        return dtype_arg(x, "T.dtype")


class _TensorSpelling:
    """``T.Tensor((M, K), dtype)`` and TileLang's subscript ``T.Tensor[(M, K), dtype]``."""

    def __call__(self, shape, dtype="float32") -> TensorType:
        return _tensor(shape, dtype)

    def __getitem__(self, key) -> TensorType:
        if not isinstance(key, tuple) or len(key) != 2:
            raise ir.KernelError(f"T.Tensor[shape, dtype] takes a shape and a dtype, got {key!r}",
                                 ir.caller_loc())
        return _tensor(*key)

    def __repr__(self) -> str:
        return "T.Tensor"


Tensor = _TensorSpelling()


# ---------------------------------------------------------------- math


def Cast(dtype, x):  # noqa: N802 - TVM's spelling, dtype first
    """``T.Cast(dtype, x)`` = ``T.cast(x, dtype)``."""
    return _math.cast(x, dtype)


def clamp(x, lo, hi):
    """``min(max(x, lo), hi)`` (NaN propagates, as ``T.max``/``T.min`` do)."""
    return _math.min(_math.max(x, lo), hi)


def floordiv(a, b):
    """``a // b`` rounding toward minus infinity (Python's ``//``; the IR's FLOORDIV)."""
    return ir.binary(ir.Op.FLOORDIV, a, b)


def floormod(a, b):
    """``a % b`` with the divisor's sign (Python's ``%``)."""
    return ir.binary(ir.Op.MOD, a, b)


def reinterpret(a, b):
    """``T.reinterpret``, either argument order: TileLang's ``(value, dtype)`` and kernforge's
    ``(dtype, value)``: the bits of the value read as the dtype of the same width."""
    a_is_dtype = isinstance(a, (str, dtypes.DType)) or type(a).__module__.startswith("torch") and not hasattr(a, "shape")
    return _math.reinterpret(a, b) if a_is_dtype else _math.reinterpret(b, a)


def reduce_absmax(buffer, out, dim: int = -1, clear: bool = True) -> None:
    """``out = max(|buffer|)`` along ``dim`` (an FP8 scale's amax): ``|buffer|`` is formed in a
    float32 fragment of ``buffer``'s shape, then reduced with ``T.reduce_max``."""
    if not isinstance(buffer, TensorHandle):
        raise B.error(f"T.reduce_absmax source must be a tile, got {buffer!r}")
    shape = buffer.buffer.static_shape()
    tmp = _alloc._alloc(shape, dtypes.float32, ir.Scope.FRAGMENT, "absbuf")
    b = B.current()
    vars_ = tuple(b.new_var(f"i{k}") for k in range(len(shape)))
    loc = B.user_loc(2)
    with b.frame("parallel") as f:
        tmp[vars_] = _math.abs(buffer[vars_])
    b.emit(ir.Parallel(vars_, tuple(shape), ir.seq(f.stmts, loc), loc))
    _reduce._reduce(ir.Op.REDUCE_MAX, tmp, out, dim, clear)


# ---------------------------------------------------------------- allocation


def alloc_global(shape, dtype):
    """A global scratch tensor of a ``@tilelang.jit`` function, allocated per call (the
    eager style's ``T.empty`` that is not returned).  Create it outside ``with T.Kernel``."""
    from kernforge.dsl import eager

    if not eager._STATE:
        raise UnsupportedError("T.alloc_global in a @T.prim_func is not supported: a traced-once "
                               "prim_func has no call to allocate it at; pass the buffer as a T.Tensor "
                               "parameter, or write the function in the eager @tilelang.jit style",
                               ir.caller_loc())
    return eager.empty(shape, dtype)


def alloc_buffer(shape, dtype, scope: str = "global"):
    """TVM's ``T.alloc_buffer(shape, dtype, scope=)``: the allocation its scope names."""
    loc = ir.caller_loc()
    if scope in ("shared", "shared.dyn"):
        return _alloc._alloc(shape, dtype, ir.Scope.SHARED, "shared")
    if scope == "local.fragment":
        return _alloc._alloc(shape, dtype, ir.Scope.FRAGMENT, "frag")
    if scope == "local":
        return _alloc._alloc(shape, dtype, ir.Scope.LOCAL, "local")
    if scope == "global":
        return alloc_global(shape, dtype)
    raise UnsupportedError(f"T.alloc_buffer(scope={scope!r}): kernforge knows the scopes 'global', "
                           "'shared', 'shared.dyn', 'local.fragment' and 'local'", loc)


alloc_reducer = unsupported(
    "alloc_reducer", "a reducer is accumulated by many T.Parallel iterations into one element "
    "(`r[j] += x[i, j]`), which kernforge's T.Parallel forbids as a race; reduce the tile with "
    "T.reduce_sum/T.reduce_max into a fragment, or use T.atomic_add for cross-block sums")
finalize_reducer = unsupported("finalize_reducer", "T.alloc_reducer is not supported (see there)")


# ---------------------------------------------------------------- loops


def Pipelined(start, stop=None, num_stages: int = 2, order=None, stage=None, sync=None,  # noqa: N802
              group=None):
    """``T.Pipelined``; ``num_stages=0`` (TileLang: no software pipelining) is a
    ``T.serial`` loop.  ``order``/``stage``/``sync``/``group`` schedules are rejected, as
    ``kernforge.dsl.Pipelined`` rejects them (docs/tilelang-hints.md)."""
    if sync is not None or group is not None:
        return _loop.Pipelined(start, stop, num_stages, order or "sync/group", stage)
    if num_stages == 0 and order is None and stage is None:
        return _loop.serial(start, stop)
    return _loop.Pipelined(start, stop, num_stages, order, stage)


Serial = _loop.serial


# ---------------------------------------------------------------- hints


def _record(kind: str, value) -> None:
    B.current().hints.append((kind, value))


def use_swizzle(panel_size: int = 10, order: str = "row", enable: bool = True) -> None:
    """Block rasterisation for L2 locality: a performance hint that changes no result.
    Recorded in the kernel's ``attrs["tilelang_hints"]``; no backend reorders blocks today."""
    if not isinstance(panel_size, int) or panel_size <= 0:
        raise ir.KernelError(f"T.use_swizzle panel_size must be a positive int, got {panel_size!r}",
                             ir.caller_loc())
    if enable:
        _record("use_swizzle", f"panel_size={panel_size},order={order}")


def annotate_layout(layouts: dict) -> None:
    """Shared-memory layouts (swizzles) chosen by the author: a performance hint.  Recorded
    (the buffers' names) in ``attrs["tilelang_hints"]``; kernforge's CUDA layout planner
    picks its own swizzles, the CPU and interpreter have none."""
    names = sorted(k.name if isinstance(k, TensorHandle) else str(k) for k in dict(layouts))
    _record("annotate_layout", ",".join(names))


def annotate_l2_hit_ratio(*args, **kwargs) -> None:
    """An L2 persistence hint: recorded, not used."""
    _record("annotate_l2_hit_ratio", repr(args))


def no_set_max_nreg() -> None:
    """A register-allocation hint for warp-specialised kernels: recorded, not used."""
    _record("no_set_max_nreg", "")


# ---------------------------------------------------------------- thread level
#
# Thread-level code is lowered here, in the DSL, so that no backend changes: from
# ``tx = T.get_thread_binding()`` to the end of the ``with T.Kernel`` block, the statements
# form a ``T.Parallel`` over the block's threads (``tx`` its variable), split into one such
# loop per ``T.sync_threads()``.  Every backend already runs a ``T.Parallel`` with the
# semantics a barrier-separated thread region has: iterations independent, all of them done
# before the next statement.  So ``if tx < 32:`` is a per-thread (masked) branch, and a
# ``T.alloc_local``/``T.alloc_var`` made inside the region gets one copy per thread (a
# fragment indexed by ``tx``), which survives the barriers.


class DivergentBarrierError(ir.KernelError, ValueError):
    """``T.sync_threads()`` under control flow that depends on the thread (inside an ``if`` or
    loop of a thread region): some threads would wait for a barrier others never reach."""


def _region_error(what: str, loc):
    return UnsupportedError(f"{what} must be called at the top level of a `with T.Kernel` block: "
                            "kernforge lowers thread-level code as a loop over the block's threads "
                            "that starts there", loc)


def _open_region(b, var, extent, loc) -> None:
    f = B.Frame("parallel")
    b.frames.append(f)
    b.thread_region = {"var": var, "extent": extent, "loc": loc, "frame": f}


def close_thread_region(b) -> None:
    """End the open thread region: its statements become one ``T.Parallel`` over the threads."""
    region = b.thread_region
    if b.top is not region["frame"]:
        raise DivergentBarrierError("a thread region ends inside a loop or branch", region["loc"])
    b.frames.pop()
    b.thread_region = None
    stmts = region["frame"].stmts
    if stmts:
        loc = region["loc"]
        b.emit(ir.Parallel((region["var"],), (region["extent"],), ir.seq(stmts, loc), loc))


def get_thread_binding(dim: int = 0):
    """``tx = T.get_thread_binding()``: this thread's index in the block, 0 .. threads - 1.
    Opens the thread region (see above); only the x dimension exists (``dim=0``)."""
    loc = ir.caller_loc()
    b = B.current()
    if dim != 0:
        raise UnsupportedError(f"T.get_thread_binding({dim}): kernforge blocks are one-dimensional "
                               "(threads=n); only dim 0 exists", loc)
    if b.thread_region is not None:
        return b.thread_region["var"]
    if b.kernel is None or b.top.kind != "kernel":
        raise _region_error("T.get_thread_binding", loc)
    var = b.new_var("tx")
    _open_region(b, var, b.kernel["threads"], loc)
    return var


def get_thread_bindings():
    """``(tx, ty, tz)``: kernforge blocks are one-dimensional, so ``ty`` and ``tz`` are 0."""
    return get_thread_binding(0), ir.const(0), ir.const(0)


def thread_binding(start, stop=None, thread: str = "threadIdx.x"):
    """``for tx in T.thread_binding(0, threads, "threadIdx.x")``: a ``T.Parallel`` over the
    block's threads."""
    if stop is None:
        start, stop = 0, start
    if start != 0 or thread != "threadIdx.x":
        raise UnsupportedError(f"T.thread_binding({start}, {stop}, {thread!r}): only 0-based "
                               "threadIdx.x bindings exist in kernforge's one-dimensional blocks",
                               ir.caller_loc())
    return _loop.Parallel(stop)


def sync_threads() -> None:
    """``T.sync_threads()``: inside a thread region, ends one ``T.Parallel`` over the threads and
    starts the next (every thread's writes are visible after it).  Under a per-thread branch or
    loop it is a :class:`DivergentBarrierError`.  Outside thread-level code it does nothing:
    kernforge places the barriers its tile operations need itself."""
    loc = ir.caller_loc()
    b = B.current()
    region = b.thread_region
    if region is None:
        return
    if b.top is not region["frame"]:
        raise DivergentBarrierError("T.sync_threads() under a branch or loop of thread-level code: "
                                    "threads that skip it would never reach the barrier; move it out "
                                    "to the top level of the kernel block", loc)
    close_thread_region(b)
    _open_region(b, region["var"], region["extent"], region["loc"])


class _PerThread(TensorHandle):
    """A thread's own array: a fragment with one row per thread, indexed by the region's
    thread variable first."""

    __slots__ = ("tvar",)

    def _key(self, key):
        return (self.tvar,) + (key if isinstance(key, tuple) else (key,))

    def __getitem__(self, key):
        return TensorHandle.__getitem__(self, self._key(key))

    def __setitem__(self, key, value):
        TensorHandle.__setitem__(self, self._key(key), value)


class _PerThreadVar(VarHandle):
    """A thread's own scalar variable (``T.alloc_var`` in a thread region)."""

    __slots__ = ("tvar",)

    def __kf_expr__(self) -> ir.Expr:
        B.current().check_live(self.buffer, B.user_loc(2))
        return ir.Load(self.buffer, (self.tvar, ir.const(0)))

    def __setitem__(self, key, value):
        if key not in (0, ()):
            raise B.error(f"variable {self.name} holds one value: index it with 0")
        TensorHandle.__setitem__(self, (self.tvar, 0), value)


def _per_thread(shape, dtype, cls, base):
    region = B.current().thread_region
    shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    h = _alloc._alloc((region["extent"],) + shape, dtype, ir.Scope.FRAGMENT, base, cls)
    h.tvar = region["var"]
    return h


def alloc_local(shape, dtype, scope: str = "local"):
    """``T.alloc_local``: in a thread region, an array of each thread's own (one row per
    thread); elsewhere kernforge's block-uniform local (:func:`kernforge.dsl.alloc_local`)."""
    if B.current().thread_region is None:
        return _alloc.alloc_local(shape, dtype, scope)
    return _per_thread(shape, dtype, _PerThread, "local")


def alloc_var(dtype, init=None, scope: str = "local.var"):
    """``T.alloc_var``: in a thread region, a scalar of each thread's own; elsewhere
    :func:`kernforge.dsl.alloc_var`."""
    if B.current().thread_region is None:
        return _alloc.alloc_var(dtype, init, scope)
    v = _per_thread((1,), dtype, _PerThreadVar, "var")
    if init is not None:
        v.assign(init)
    return v


_WARPS = ("warp shuffles exchange registers between the lanes of a warp, which needs the lanes to "
          "run in lockstep; kernforge's thread regions are T.Parallel loops whose iterations share "
          "only memory: exchange through a T.alloc_shared buffer and T.sync_threads() instead")
sync_warp = unsupported("sync_warp", _WARPS)
shfl_xor = unsupported("shfl_xor", _WARPS)
shfl_down = unsupported("shfl_down", _WARPS)
shfl_up = unsupported("shfl_up", _WARPS)
shfl_sync = unsupported("shfl_sync", _WARPS)
print = unsupported("print", "kernels print nothing; read tiles back with T.copy to a global "  # noqa: A001
                    "output and print it on the host")
device_assert = unsupported("device_assert", "kernforge has no device-side asserts; the "
                            "interpreter and checked mode (KERNFORGE_CHECKS=1) report bad accesses")

