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
from kernforge.dsl import thread_branches as _branches
from kernforge.dsl import thread_breaks as _breaks
from kernforge.dsl.handles import TensorHandle, VarHandle
from kernforge.dsl.thread_sync import thread_maps
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
    f.__kf_unsupported__ = True  # used as a dtype, it raises the same error (types.dtype_arg)
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


def sigmoid(x):
    """``1 / (1 + exp(-x))``, in float32 for narrower inputs (mHC's mixes)."""
    e = ir.as_expr(x)
    if not e.dtype.is_float or e.dtype.is_low_precision:
        e = ir.cast(e, dtypes.float32)
    return 1.0 / (1.0 + _math.exp(-e))


def floordiv(a, b):
    """``a // b`` rounding toward minus infinity (Python's ``//``; the IR's FLOORDIV)."""
    return ir.binary(ir.Op.FLOORDIV, a, b)


def floormod(a, b):
    """``a % b`` with the divisor's sign (Python's ``%``)."""
    return ir.binary(ir.Op.MOD, a, b)


def reinterpret(a, b=None, dtype=None):
    """``T.reinterpret``, either argument order: TileLang's ``(value, dtype)`` and kernforge's
    ``(dtype, value)``: the bits of the value read as the dtype of the same width.  TVM's
    ``T.reinterpret(T.uint64(0), dtype="handle")`` (a null handle, the value of a
    ``T.attr(..., "reduce_scope", ...)``) gives an opaque :class:`kernforge.dsl.reducer.Handle`."""
    if dtype is not None:
        if dtype == "handle":
            from kernforge.dsl.reducer import Handle

            return Handle()
        a, b = a, dtype
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
    """A global scratch tensor, allocated per call, as TileLang allocates it.  In a
    ``@tilelang.jit`` eager function it is a ``T.empty`` that is not returned.  In a
    ``@T.prim_func`` it becomes a trailing kernel parameter after the declared ones, which
    :class:`kernforge.dsl.eager.Launch` allocates at each call and never returns (``out_idx``
    keeps counting the declared parameters only).  Create it outside ``with T.Kernel``; its
    shape may use the parameters' symbolic sizes."""
    from kernforge.dsl import eager

    if eager._STATE:
        return eager.empty(shape, dtype)
    b = B.current()
    if b.inside("kernel"):
        raise UnsupportedError("T.alloc_global inside `with T.Kernel`: allocate global scratch before the "
                               "kernel block, so every block of the function shares it", ir.caller_loc())
    buf = TensorType(tuple(shape) if isinstance(shape, (tuple, list)) else (shape,),
                     dtype_arg(dtype, "T.alloc_global")).make_buffer(b.unique("scratch"))
    b.add_global(buf)
    b.scratch.append(buf)
    return TensorHandle(buf, auto_named=True)


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


def vectorized(start, stop=None):
    """``T.vectorized(n)``: a loop whose iterations are independent by contract, so running
    them in order (``T.serial``) gives TileLang's result; kernforge's backends vectorise
    loops themselves."""
    return _loop.serial(start, stop)


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


def _uniform(b, frame) -> bool:
    """``frame`` is a ``T.serial``/``T.Pipelined``/``T.unroll`` loop whose bounds every thread
    of the block sees alike: no thread index and no loaded (possibly per-thread) value in them."""
    if frame.kind != "loop" or not frame.loop:
        return False
    var = b.thread_region["var"]
    return not any(n is var or isinstance(n, ir.Load) for e in frame.loop for n in ir.nodes(e))


def _hoist(b, name: str, loc, arrive_count: Optional[int] = None, barrier: bool = False) -> None:
    """Make a barrier or shuffle under uniform loops of a thread region legal, by lifting the
    loops out of the region: ``for tx: ...; for k: body`` becomes ``for tx: ...`` then
    ``for k: (for tx: body)``, the inner map split where the barrier or shuffle stands.  Every
    thread runs the same iterations, so all of them reach it; the interchange keeps each
    thread's results because a thread region's iterations are independent between barriers
    (per-thread state lives in per-thread arrays indexed by the thread).  A branch or a loop
    whose bounds depend on the thread is a :class:`DivergentBarrierError`, except that a named
    partial barrier (``arrive_count`` given) may stand under branches on the thread index alone,
    which are then distributed over the split (:mod:`kernforge.dsl.thread_branches`).  Under a
    ``barrier``, a loop whose trip count reads per-thread values runs the largest trip count of
    the block, each thread's own iterations guarded (:func:`kernforge.dsl.thread_breaks.lift_bounds`)."""
    region = b.thread_region
    at = b.frames.index(region["frame"])
    loops = b.frames[at + 1:]
    branches = [f for f in loops if arrive_count is not None and b.subset is None
                and _branches.distributable(f, region["var"])]
    bounded = [f for f in loops if barrier and not _uniform(b, f) and _breaks.liftable(f, region["var"])]
    if not all(_uniform(b, f) or f in branches or f in bounded for f in loops):
        raise DivergentBarrierError(f"{name} under a branch, or a loop whose trip count depends on the "
                                    "thread, in thread-level code: threads that skip it would never "
                                    "reach it; move it out to the top level of the kernel block or into "
                                    "a loop with uniform bounds", loc)
    if arrive_count is not None:
        _branches.check_count(name, arrive_count, _distributed(b) + branches, region["var"],
                              region["extent"], loc, DivergentBarrierError)
    for f in bounded:
        _breaks.lift_bounds(b, f, region, loc)
    close_thread_region(b, frames_above=len(loops))
    for f in loops:
        f.hoisted = True
        if f.stmts:
            f.stmts[:] = thread_maps(f.stmts, region["var"], region["extent"], loc)
    _open_region(b, region["var"], region["extent"], region["loc"])


def _distributed(b) -> list:
    """The open thread-index branches already distributed over barriers (their threads are the
    ones that reach a barrier inside them)."""
    return [f for f in b.frames if f.kind == "branch" and f.hoisted]


def reached_by_all(b, name: str, loc) -> None:
    """A block barrier, shuffle or allreduce needs every thread (of the block or warp): inside a
    branch distributed over named partial barriers only some threads reach it."""
    if _distributed(b):
        raise DivergentBarrierError(f"{name} under a branch of thread-level code: the threads that skip "
                                    "it would never reach it (only a named partial barrier "
                                    "T.sync_threads(barrier_id, arrive_count) may stand there)", loc)


def leave_hoisted_loop(b) -> None:
    """End the body of a loop (or thread-index branch) :func:`_hoist` lifted: its last map
    closes into it."""
    close_thread_region(b)


def distributed_branch(b, f, loc) -> None:
    """A thread-index branch that :func:`_hoist` lifted has closed: its maps, each guarded by the
    branch's condition, go where the ``if`` would have gone, and the thread region goes on."""
    for st in _branches.guard_maps(f.stmts, f.cond, b.last_region["var"]):
        b.emit(st)
    reopen_region(b)


def reopen_region(b) -> None:
    """After a lifted loop, the thread region goes on in the frame that holds the loop."""
    region = b.last_region
    _open_region(b, region["var"], region["extent"], region["loc"])


def close_thread_region(b, frames_above: int = 0) -> None:
    """End the open thread region: its statements become a ``T.Parallel`` over the threads, split
    where TileLang would place a barrier itself (:mod:`kernforge.dsl.thread_sync`)."""
    region = b.thread_region
    at = len(b.frames) - 1 - frames_above
    if b.frames[at] is not region["frame"]:
        raise DivergentBarrierError("a thread region ends inside a loop or branch", region["loc"])
    del b.frames[at]
    b.thread_region = None
    b.last_region = region
    below = b.frames[at - 1]
    stmts = region["frame"].stmts
    if stmts:
        loc = region["loc"]
        below.stmts.extend(thread_maps(stmts, region["var"], region["extent"], loc))


def subset_tile_code(b) -> None:
    """Tile-level code (an allocation, ``T.Parallel``, a tile op) starts inside a branch at the top
    level of a thread region, as mHC's ``if T.get_thread_binding() < 32:`` writes it: in TileLang
    the threads that take the branch run its tile operations together.  If the condition reads
    only the thread index, and the branch has no per-thread statement yet, the branch becomes
    block-level tile code: the thread region closes before it, the branch runs when any thread of
    the block takes it (decided now, the condition being a function of the thread index alone),
    its ``else`` when any thread does not (one after the other: as on a GPU, where the two sides
    run at once, they must not depend on each other), and the region reopens after it
    (:func:`end_subset`).  Otherwise nothing changes (and tile code there stays an error)."""
    region = b.thread_region
    f = b.top
    at = b.frames.index(region["frame"])
    tvar = region["var"]
    if (len(b.frames) != at + 2 or f.cond is None or not _branches.thread_only(f.cond, tvar)
            or any(n is tvar for st in f.stmts for n in ir.nodes(st))):
        return
    taken = _branches.taken(f.cond, tvar, region["extent"])
    b.frames.pop()
    close_thread_region(b)
    b.frames.append(f)
    b.subset = {"frame": f, "region": region, "then": bool(taken.any()), "else": bool((~taken).any())}


def end_subset(b) -> None:
    """After a thread-subset branch of tile code, the thread region goes on."""
    region = b.subset["region"]
    b.subset = None
    _open_region(b, region["var"], region["extent"], region["loc"])


def get_thread_binding(dim: int = 0):
    """``tx = T.get_thread_binding()``: this thread's index along block dimension ``dim`` (0, 1
    or 2 for threadIdx.x/y/z; a block of ``threads=n`` has only x).  The first call opens the
    thread region (see above).  Its variable is the linear thread id (``tx`` of a 1-D block);
    with ``threads=(x, y, z)`` the indices are derived from it as CUDA numbers threads
    (x fastest), so warps are the same 32 consecutive linear ids on every backend."""
    loc = ir.caller_loc()
    b = B.current()
    if dim not in (0, 1, 2):
        raise UnsupportedError(f"T.get_thread_binding({dim!r}): a block has dimensions 0, 1 and 2 "
                               "(threadIdx.x, y, z)", loc)
    if b.thread_region is None:
        if b.kernel is None or b.top.kind != "kernel":
            raise _region_error("T.get_thread_binding", loc)
        var = b.new_var("tx" if len(b.kernel["thread_dims"]) == 1 else "tid")
        b.thread_vars.append(var.name)
        _open_region(b, var, b.kernel["threads"], loc)
        _localize_early(b)
    return _thread_index(b, dim)


def _thread_index(b, dim: int) -> ir.Expr:
    """Index ``dim`` of the thread whose linear id is the region's variable."""
    cache = b.kernel.setdefault("thread_index", {})  # one expression per dimension (reducer.py)
    if dim in cache:
        return cache[dim]
    var = b.thread_region["var"]
    dims = b.kernel["thread_dims"] + (1, 1)
    inner = 1
    for d in dims[:dim]:
        inner *= d
    if dims[dim] == 1:
        e = ir.const(0)
    else:
        e = var if inner == 1 else ir.binary(ir.Op.FLOORDIV, var, inner)
        e = e if inner * dims[dim] == b.kernel["threads"] else ir.binary(ir.Op.MOD, e, dims[dim])
    cache[dim] = e
    return e


def get_thread_bindings():
    """``(tx, ty, tz)`` (see :func:`get_thread_binding`); 0 along a dimension the block lacks."""
    return get_thread_binding(0), get_thread_binding(1), get_thread_binding(2)


def thread_binding(start, stop=None, thread: str = "threadIdx.x"):
    """``for tx in T.thread_binding(0, n, "threadIdx.x")`` (or ``.y``/``.z``): a ``T.Parallel``
    over ``n`` iterations, an element-wise map (not a thread region: no barriers or shuffles
    inside it)."""
    if stop is None:
        start, stop = 0, start
    if start != 0 or thread not in ("threadIdx.x", "threadIdx.y", "threadIdx.z"):
        raise UnsupportedError(f"T.thread_binding({start}, {stop}, {thread!r}): only 0-based "
                               "threadIdx.x/y/z bindings exist", ir.caller_loc())
    return _loop.Parallel(stop)


def sync_threads(barrier_id: Optional[int] = None, arrive_count: Optional[int] = None) -> None:
    """``T.sync_threads()``: a block barrier in thread-level code (see :func:`_barrier`).
    ``T.sync_threads(barrier_id, arrive_count)``: TileLang's named partial barrier, which only
    ``arrive_count`` threads reach; it may stand under ``if``\\ s on the thread index alone
    (:mod:`kernforge.dsl.thread_branches`).  A ``barrier_id`` alone is a block barrier."""
    if arrive_count is None:
        _barrier("T.sync_threads()")
        return
    if isinstance(arrive_count, bool) or not isinstance(arrive_count, int) or arrive_count <= 0:
        raise ir.KernelError(f"T.sync_threads: arrive_count must be a positive int, got {arrive_count!r}",
                             ir.caller_loc())
    _barrier(f"T.sync_threads({barrier_id}, {arrive_count})", arrive_count)


def _barrier(name: str, arrive_count: Optional[int] = None) -> None:
    """``name``: inside a thread region, ends one ``T.Parallel`` over the threads and
    starts the next (every thread's writes are visible after it).  Under a per-thread branch or
    loop it is a :class:`DivergentBarrierError`.  Outside thread-level code it does nothing:
    kernforge places the barriers its tile operations need itself."""
    loc = ir.caller_loc()
    b = B.current()
    region = b.thread_region
    if region is None:
        return
    if arrive_count is None:
        reached_by_all(b, name, loc)
    if b.top is not region["frame"]:
        _hoist(b, name, loc, arrive_count, barrier=True)
    elif arrive_count is not None:
        _branches.check_count(name, arrive_count, _distributed(b), region["var"], region["extent"], loc,
                              DivergentBarrierError)
    close_thread_region(b)
    _open_region(b, region["var"], region["extent"], region["loc"])


class _PerThread(TensorHandle):
    """A thread's own array: a fragment with one row per thread, indexed by the region's
    thread variable first."""

    __slots__ = ("tvar",)

    def _key(self, key):
        if self.tvar is None:  # a block-uniform local (see alloc_local)
            return key
        return (self.tvar,) + (key if isinstance(key, tuple) else (key,))

    def __getitem__(self, key):
        return TensorHandle.__getitem__(self, self._key(key))

    def __setitem__(self, key, value):
        TensorHandle.__setitem__(self, self._key(key), value)

    @property
    def owns_fill(self) -> bool:
        return self.tvar is not None

    def fill_own(self, value, loc) -> None:
        """``T.fill``/``T.clear`` of a thread's own array: this thread's row only, as element
        stores in loops (a tile op over the whole buffer would clear every thread's row, and
        a tile whose start is the thread index is not a tile op every backend can run)."""
        b = B.current()
        shape = self.buffer.static_shape()[1:]
        v = ir.cast(value, self.buffer.dtype)
        idx = tuple(b.new_var(f"e{d}") for d in range(len(shape)))
        body: ir.Stmt = ir.Store(self.buffer, (self.tvar,) + idx, v, loc)
        for var, n in reversed(list(zip(idx, shape))):
            body = ir.For(var, ir.const(n), body, loc=loc)
        b.emit(body)


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


def per_thread_var(dtype, base: str) -> ir.Buffer:
    """A fresh scalar (one element per thread) of each thread's own in the open thread region, for a value a statement
    hands to every thread (a fetch-and-op's result).  Unlike ``T.alloc_var`` it may be made under
    the region's branches and loops: its ``Allocate`` goes just before the region, as
    :meth:`kernforge.dsl.builder.Builder.declare` places the region's own allocations."""
    b = B.current()
    region = b.thread_region
    buf = ir.Buffer(b.unique(base), (ir.const(region["extent"]), ir.const(1)), dtype, ir.Scope.FRAGMENT)
    below = b.frames[b.frames.index(region["frame"]) - 1]
    below.buffers.add(buf)
    below.stmts.append(ir.Allocate(buf, region["loc"]))
    return buf


def alloc_local(shape, dtype, scope: str = "local"):
    """``T.alloc_local``: in a thread region, an array of each thread's own (one row per
    thread); elsewhere kernforge's block-uniform local (:func:`kernforge.dsl.alloc_local`),
    unless the thread region opens later in the block before anything used it: TileLang's
    locals are always per thread, so such a local becomes per-thread then (:func:`_localize_early`)."""
    b = B.current()
    if b.thread_region is None:
        h = _alloc._alloc(shape, dtype, ir.Scope.LOCAL, "local", _PerThread)
        h.tvar = None
        if b.kernel is not None and b.top.kind == "kernel":
            b.early_locals.append(h)
        return h
    return _per_thread(shape, dtype, _PerThread, "local")


def _localize_early(b) -> None:
    """The thread region opens: each ``T.alloc_local`` made before it at the block's top level and
    not used since becomes one row per thread (its ``Allocate`` moves to the region's start)."""
    kernel_frame = b.frames[-2]
    used = {n.buffer for st in kernel_frame.stmts if not isinstance(st, ir.Allocate)
            for n in ir.nodes(st) if isinstance(n, (ir.Load, ir.Store, ir.Region))}
    for h in b.early_locals:
        old = h.buffer
        if old in used or old not in kernel_frame.buffers:
            continue
        kernel_frame.stmts[:] = [st for st in kernel_frame.stmts
                                 if not (isinstance(st, ir.Allocate) and st.buffer is old)]
        kernel_frame.buffers.discard(old)
        new = ir.Buffer(old.name, (ir.const(b.thread_region["extent"]),) + tuple(old.shape), old.dtype,
                        ir.Scope.FRAGMENT)
        kernel_frame.buffers.add(new)
        kernel_frame.stmts.append(ir.Allocate(new, b.thread_region["loc"]))
        h.buffer, h.tvar = new, b.thread_region["var"]
    b.early_locals = []


def alloc_var(dtype, init=None, scope: str = "local.var"):
    """``T.alloc_var``: in a thread region, a scalar of each thread's own; elsewhere
    :func:`kernforge.dsl.alloc_var`."""
    if B.current().thread_region is None:
        return _alloc.alloc_var(dtype, init, scope)
    v = _per_thread((1,), dtype, _PerThreadVar, "var")
    if init is not None:
        v.assign(init)
    return v


# ---------------------------------------------------------------- warp level
#
# A shuffle is an ``ir.Shuffle`` stored into a per-thread variable at the top level of the
# thread region (the value returned reads it back): CUDA renders ``__shfl_*_sync``, the
# interpreter evaluates it in lockstep, the CPU splits the region's loop there
# (:mod:`kernforge.codegen.passes.warps`).  Every thread must reach it, as a barrier.

_FULL_MASK = 0xFFFFFFFF


class WarpLaneError(ir.KernelError, ValueError):
    """A warp shuffle's ``width`` or constant lane argument is out of range."""


def _shuffle(name: str, kind: str, value, arg, width, mask):
    loc = ir.caller_loc()
    b = B._stack[-1] if B._stack else None
    region = b.thread_region if b is not None else None
    if region is None:
        raise UnsupportedError(f"T.{name} outside thread-level code is not supported: a shuffle exchanges "
                               "values between the threads of a warp; call tx = T.get_thread_binding() "
                               "first (kernforge's tile code has no per-thread values to exchange)", loc)
    reached_by_all(b, f"T.{name}()", loc)
    if b.top is not region["frame"]:
        _hoist(b, f"T.{name}()", loc)
        region = b.thread_region
    if not isinstance(width, int) or isinstance(width, bool) or not 1 <= width <= 32 or width & (width - 1):
        raise WarpLaneError(f"T.{name} width must be a power of two from 1 to 32, got {width!r}", loc)
    n = region["extent"]
    if n % 32 and not (n < 32 and n % width == 0):
        # a block of fewer than 32 threads is one partial warp: whole segments of `width` lanes keep
        # every source lane of the PTX rule among the block's threads (a later segment's lane gives
        # the caller its own value, an earlier one exists)
        raise UnsupportedError(f"T.{name} in a block of {n} threads with width={width}: warp shuffles need "
                               "whole warps (threads a multiple of 32), or a block of fewer than 32 threads "
                               "made of whole segments of `width` lanes", loc)
    if not (isinstance(mask, int) and mask == _FULL_MASK):
        raise UnsupportedError(f"T.{name}(mask={mask!r}): only the full-warp mask 0xFFFFFFFF is supported "
                               "(every lane of the warp takes part)", loc)
    try:
        v, a = ir.as_expr(value), ir.as_expr(arg)
    except ir.KernelError as e:  # a tile or a Python object where a scalar goes
        raise ir.KernelError(f"T.{name}: {e.message}", loc) from None
    if v.dtype.is_bool:
        raise ir.KernelError(f"T.{name} of a bool value: cast it to int32 first", loc)
    if v.dtype.is_low_precision:  # arithmetic on narrow floats is float32 (ir module docstring)
        v = ir.cast(v, dtypes.float32)
    if not a.dtype.is_int:
        raise ir.KernelError(f"T.{name} lane argument must be an integer, got {a} ({a.dtype})", loc)
    if isinstance(a, ir.Const):
        hi, what = (32, "lane mask") if kind == "xor" else (width, "lane distance" if kind != "idx" else "source lane")
        if not 0 <= a.value < hi:
            raise WarpLaneError(f"T.{name} {what} {a.value} is outside 0 .. {hi - 1}"
                                + ("" if kind == "xor" else f" (width={width})"), loc)
    res = _per_thread((1,), v.dtype, _PerThreadVar, "shfl")
    idx = (region["var"], ir.const(0))
    b.emit(ir.Store(res.buffer, idx, ir.Shuffle(kind, v, a, width, region["var"]), loc))
    return ir.Load(res.buffer, idx)


def shfl_xor(value, delta, width: int = 32, mask=_FULL_MASK):
    """``value`` of the lane ``lane ^ delta`` (``__shfl_xor_sync``): butterfly reductions."""
    return _shuffle("shfl_xor", "xor", value, delta, width, mask)


def shfl_down(value, delta, width: int = 32, mask=_FULL_MASK):
    """``value`` of the lane ``delta`` above (``__shfl_down_sync``); the top ``delta`` lanes of
    each ``width`` segment keep their own."""
    return _shuffle("shfl_down", "down", value, delta, width, mask)


def shfl_up(value, delta, width: int = 32, mask=_FULL_MASK):
    """``value`` of the lane ``delta`` below (``__shfl_up_sync``); the bottom ``delta`` lanes of
    each ``width`` segment keep their own (scans)."""
    return _shuffle("shfl_up", "up", value, delta, width, mask)


def shfl_sync(*args, **kwargs):
    """``value`` of lane ``srcLane`` of the caller's ``width`` segment (``__shfl_sync``, a broadcast).
    TileLang spells it ``T.shfl_sync(value, srcLane, width=32, mask=...)``; its older spelling
    ``T.shfl_sync(mask, value, srcLane)`` (an int mask first, then an expression) is accepted too."""
    if len(args) >= 3 and isinstance(args[0], int) and not isinstance(args[1], int):
        kwargs["mask"], args = args[0], args[1:]
    return _shuffle_idx(*args, **kwargs)


def _shuffle_idx(value, srcLane, width: int = 32, mask=_FULL_MASK):  # noqa: N803 - TileLang's name
    return _shuffle("shfl_sync", "idx", value, srcLane, width, mask)


def tvm_warp_shuffle(mask, value, lane, width: int = 32, warp_size: int = 32):
    """TVM's ``T.tvm_warp_shuffle(mask, value, lane, width, warp_size)``: ``__shfl_sync(mask, value,
    lane, width)``, the value of lane ``lane`` of the caller's ``width`` segment (only warps of 32)."""
    region = B.current().thread_region if B._stack else None
    partial = region is not None and region["extent"] < 32 and warp_size == region["extent"]
    if warp_size != 32 and not partial:  # a block of fewer than 32 threads is one warp of that size
        raise UnsupportedError(f"T.tvm_warp_shuffle(warp_size={warp_size!r}): warps have 32 lanes (or, in a "
                               "block of fewer than 32 threads, as many as the block)", ir.caller_loc())
    return _shuffle("tvm_warp_shuffle", "idx", value, lane, width, mask)


def sync_warp(mask=None) -> None:
    """``T.sync_warp()``: in a thread region, a barrier like :func:`sync_threads` (a block barrier
    orders at least what a warp barrier does), with the same rule: every thread must reach it.
    Outside thread-level code it does nothing."""
    if mask is not None and mask != _FULL_MASK:
        raise UnsupportedError(f"T.sync_warp(mask={mask!r}): only the full-warp mask is supported",
                               ir.caller_loc())
    _barrier("T.sync_warp()")


print = unsupported("print", "kernels print nothing; read tiles back with T.copy to a global "  # noqa: A001
                    "output and print it on the host")
device_assert = unsupported("device_assert", "kernforge has no device-side asserts; the "
                            "interpreter and checked mode (KERNFORGE_CHECKS=1) report bad accesses")

