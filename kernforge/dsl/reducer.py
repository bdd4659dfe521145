"""TileLang's reductions across threads: ``T.alloc_reducer`` / ``T.finalize_reducer`` and TVM's
``T.tvm_thread_allreduce`` (inside ``with T.attr(T.comm_reducer(...), "reduce_scope", ...)``).

**Reducers.**  In TileLang a reducer is a fragment that many ``T.Parallel`` iterations update
(``r[i] += x[i, j]``): each thread keeps private partials, and ``T.finalize_reducer(r)``
combines the partials of the threads that share an element into it.  kernforge's ``T.Parallel``
forbids two iterations storing to one element, so the private partials are made explicit: the
first update inside a ``T.Parallel`` allocates a *partials* fragment with the loop's shape
(one slot per iteration, filled with the operation's identity, just after the reducer's own
allocation, so it lives as long as the reducer), each update combines into its own slot, and
``T.finalize_reducer`` reduces the partials over the loop dimension the reducer is not indexed by
(``T.reduce_*`` with ``clear=False``, so the reducer's value before the updates is kept) and
resets them.  Every backend runs it as the plain DSL it is.

**Thread allreduce.**  ``T.tvm_thread_allreduce(1, value, True, dest, *reduce_threads)`` in a
thread region combines ``value`` over the threads that differ only in the given thread indices
and stores the result in every such thread's ``dest``.  It is lowered to thread-level code: each
thread writes its value into a shared slot, and (after the barrier TileLang's sync pass places,
:mod:`kernforge.dsl.thread_sync`) combines its group's slots in index order with the
``T.comm_reducer`` function.
"""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from kernforge import dtypes
from kernforge.codegen import ir
from kernforge.dsl import alloc as _alloc
from kernforge.dsl import builder as B
from kernforge.dsl import compat
from kernforge.dsl.handles import TensorHandle

_OPS = {"sum": (ir.Op.ADD, ir.Op.REDUCE_SUM), "max": (ir.Op.MAX, ir.Op.REDUCE_MAX),
        "min": (ir.Op.MIN, ir.Op.REDUCE_MIN)}


def _identity(op: str, dt) -> ir.Expr:
    """The value ``op`` leaves unchanged: 0, or the lowest/highest value of ``dt``."""
    if op == "sum":
        return ir.cast(0, dt)
    if dt.is_float:
        return ir.const(float("-inf") if op == "max" else float("inf"), dt)
    info = np.iinfo(dt.np_dtype)
    return ir.const(int(info.min if op == "max" else info.max), dt)


class _Reducer(TensorHandle):
    """A reducer fragment: reads and plain stores as a fragment; an update inside ``T.Parallel``
    goes to the partials (module docstring)."""

    __slots__ = ("op", "frame", "alloc", "partials", "key")
    owns_fill = True

    def __setitem__(self, key, value):
        b = B.current()
        par = next((f for f in reversed(b.frames) if f.kind == "parallel"), None)
        if par is None:
            TensorHandle.__setitem__(self, key, value)
            return
        loc = B.user_loc(2)
        key = key if isinstance(key, tuple) else (key,)
        if not par.parallel:
            raise compat.UnsupportedError(f"a T.alloc_reducer update of {self.name} in thread-level code: "
                                          "update it inside T.Parallel", loc)
        pvars, extents = par.parallel
        kexpr = tuple(ir.as_expr(k) for k in key)
        if not all(any(k is v for v in pvars) for k in kexpr) or len(set(map(id, kexpr))) != len(kexpr):
            raise compat.UnsupportedError(f"reducer {self.name} indexed by {list(kexpr)}: index it with "
                                          "distinct variables of the enclosing T.Parallel", loc)
        contrib = self._contribution(value, kexpr, loc)
        if self.partials is None:
            self._make_partials(b, pvars, extents, kexpr, loc)
        elif tuple(extents) != self.partials.static_shape() or \
                [d for d, v in enumerate(pvars) if not any(v is k for k in kexpr)] != [self.key]:
            raise compat.UnsupportedError(f"reducer {self.name} updated in T.Parallel loops of different "
                                          "shapes, or at different positions, before T.finalize_reducer", loc)
        binop = _OPS[self.op][0]
        slot = tuple(pvars)
        old = ir.Load(self.partials, slot)
        b.emit(ir.Store(self.partials, slot, ir.cast(ir.binary(binop, old, contrib), self.partials.dtype),
                        loc))

    def _contribution(self, value, key, loc) -> ir.Expr:
        """``v`` of ``r[key] + v`` (sum) or ``T.max(r[key], v)`` (max/min)."""
        want = _OPS[self.op][0]
        e = ir.as_expr(value)

        def is_self(x):
            x = x.value if isinstance(x, ir.Cast) else x
            return (isinstance(x, ir.Load) and x.buffer is self.buffer
                    and all(ir.structural_equal(a, c) for a, c in zip(x.indices, key)))

        if isinstance(e, ir.Binary) and e.op == want:
            if is_self(e.a):
                return e.b
            if is_self(e.b):
                return e.a
        spell = "r[i] += v" if self.op == "sum" else f"r[i] = T.{self.op}(r[i], v)"
        raise compat.UnsupportedError(f"reducer {self.name} (op={self.op!r}) is updated as `{spell}` inside "
                                      f"T.Parallel, got {self.name}[...] = {e}", loc)

    def _make_partials(self, b, pvars, extents, key, loc) -> None:
        if self.frame not in b.frames:
            raise compat.UnsupportedError(f"reducer {self.name} updated after the scope that allocated it "
                                          "closed", loc)
        reduced = [d for d, v in enumerate(pvars) if not any(v is k for k in key)]
        kept = tuple(e for d, e in enumerate(extents) if d not in reduced)
        if len(reduced) != 1 or [v for v in pvars if any(v is k for k in key)] != list(key) \
                or tuple(x for x in self.buffer.static_shape() if x != 1) != tuple(x for x in kept if x != 1):
            raise compat.UnsupportedError(
                f"reducer {self.name} of shape {self.buffer.static_shape()} updated at {[str(k) for k in key]} in "
                f"T.Parallel{tuple(extents)}: kernforge combines a reducer over exactly one loop dimension, "
                "indexing it with the other loop variables in order", loc)
        buf = ir.Buffer(b.unique(f"{self.name}_partials"), tuple(ir.const(e) for e in extents), self.buffer.dtype,
                        ir.Scope.FRAGMENT)
        at = self.frame.stmts.index(self.alloc) + 1
        self.frame.stmts[at:at] = [ir.Allocate(buf, loc),
                                   ir.Fill(ir.whole(buf), _identity(self.op, buf.dtype), loc)]
        self.frame.buffers.add(buf)
        self.partials, self.key = buf, reduced[0]

    def fill_own(self, value, loc) -> None:
        """``T.fill``/``T.clear`` of a reducer: the reducer, and its partials (a new start)."""
        b = B.current()
        b.emit(ir.Fill(ir.whole(self.buffer), ir.cast(value, self.buffer.dtype), loc))
        if self.partials is not None:
            b.emit(ir.Fill(ir.whole(self.partials), _identity(self.op, self.buffer.dtype), loc))


def alloc_reducer(shape, dtype, op: str = "sum", replication=None):
    """``T.alloc_reducer(shape, dtype, op="sum"|"max"|"min", replication=)``: a reducer fragment
    (module docstring).  ``replication`` chooses TileLang's partials layout: a performance
    choice that changes no result, accepted and unused."""
    loc = ir.caller_loc()
    if op not in _OPS:
        raise compat.UnsupportedError(f"T.alloc_reducer(op={op!r}): the ops are 'sum', 'max' and 'min'", loc)
    if replication not in (None, "all", "none"):
        raise ir.KernelError(f"T.alloc_reducer(replication={replication!r}): 'all' or 'none'", loc)
    b = B.current()
    if b.thread_region is not None:
        raise compat.UnsupportedError("T.alloc_reducer in thread-level code: a reducer's partials belong to "
                                      "T.Parallel iterations; use T.tvm_thread_allreduce or shared memory", loc)
    h = _alloc._alloc(shape, dtype, ir.Scope.FRAGMENT, "reducer", _Reducer)
    h.op, h.frame, h.partials, h.key = op, b.top, None, None
    h.alloc = next(s for s in reversed(b.top.stmts) if isinstance(s, ir.Allocate) and s.buffer is h.buffer)
    return h


def finalize_reducer(reducer) -> None:
    """``T.finalize_reducer(r)``: ``r = op(r, partials combined over the reduced loop dimension)``,
    then the partials start again from the identity.  A reducer never updated is left as it is."""
    loc = ir.caller_loc()
    if not isinstance(reducer, _Reducer):
        raise ir.KernelError(f"T.finalize_reducer takes a T.alloc_reducer buffer, got {reducer!r}", loc)
    if reducer.partials is None:
        return
    b = B.current()
    red = ir.Reduce(_OPS[reducer.op][1], reducer.partials, reducer.buffer, reducer.key, False, loc)
    b.emit(red)
    b.emit(ir.Fill(ir.whole(reducer.partials), _identity(reducer.op, reducer.buffer.dtype), loc))


# ---------------------------------------------------------------- TVM's thread allreduce


class CommReducer:
    """``T.comm_reducer(fn, [identity])``: a commutative combiner and its identity."""

    def __init__(self, fn, identity):
        self.fn = fn
        self.identity = list(identity) if isinstance(identity, (list, tuple)) else [identity]


def comm_reducer(fn, identity) -> CommReducer:
    """``T.comm_reducer(lambda x, y: x + y, [T.cast(0, dtype)])``: the combiner of the
    ``T.tvm_thread_allreduce`` calls in the ``with T.attr(...)`` it is given to."""
    if not callable(fn):
        raise ir.KernelError(f"T.comm_reducer takes a function, got {fn!r}", ir.caller_loc())
    return CommReducer(fn, identity)


_SCOPES: list = []


@contextmanager
def attr(node, key, value):
    """``with T.attr(T.comm_reducer(...), "reduce_scope", ...)``: the combiner of the thread
    allreduces inside.  Other TVM attributes are unsupported."""
    if key != "reduce_scope" or not isinstance(node, CommReducer):
        raise compat.UnsupportedError(f"T.attr(..., {key!r}, ...): kernforge knows only "
                                      "T.attr(T.comm_reducer(...), 'reduce_scope', ...)", ir.caller_loc())
    _SCOPES.append(node)
    try:
        yield
    finally:
        _SCOPES.pop()


def evaluate(value=None) -> None:
    """``T.evaluate(expr)``: an expression evaluated for its effect.  kernforge's expressions have
    none; ``T.tvm_thread_allreduce`` has done its work when ``T.evaluate`` receives it."""


class Handle:
    """``T.reinterpret(T.uint64(0), dtype="handle")``: an opaque handle, only meaningful as the
    value of ``T.attr``."""


def tvm_thread_allreduce(*args, dtype=None):
    """``T.tvm_thread_allreduce(1, value, True, dest, *thread_indices)``: module docstring.
    Returns nothing to evaluate (``T.evaluate`` accepts it)."""
    loc = ir.caller_loc()
    b = B._stack[-1] if B._stack else None
    region = b.thread_region if b is not None else None
    if region is None:
        raise compat.UnsupportedError("T.tvm_thread_allreduce outside thread-level code: call "
                                      "T.get_thread_binding() first", loc)
    if not _SCOPES:
        raise compat.UnsupportedError("T.tvm_thread_allreduce outside `with T.attr(T.comm_reducer(...), "
                                      "'reduce_scope', ...)`: its combiner is unknown", loc)
    if len(args) < 5 or not isinstance(args[0], (int, ir.Const)) or int(getattr(args[0], "value", args[0])) != 1:
        raise compat.UnsupportedError("T.tvm_thread_allreduce: only one value per call "
                                      "(size 1, value, condition, destination, thread indices...)", loc)
    value, cond, dest, rvars = args[1], args[2], args[3], args[4:]
    if not (cond is True or isinstance(cond, ir.Const) and bool(cond.value)):
        raise compat.UnsupportedError(f"T.tvm_thread_allreduce with condition {cond!r}: only True", loc)
    tvar = region["var"]
    if not (isinstance(dest, ir.Load) and dest.indices and dest.indices[0] is tvar):
        raise ir.KernelError("T.tvm_thread_allreduce destination must be an element of a T.alloc_local "
                             f"made in thread-level code, got {dest!r}", loc)
    index = b.kernel.get("thread_index", {})
    dims = []
    for r in rvars:
        d = next((d for d, e in index.items() if e is r), None)
        if d is None:
            raise compat.UnsupportedError(f"T.tvm_thread_allreduce over {r!r}: give thread indices returned "
                                          "by T.get_thread_binding(dim)", loc)
        dims.append(d)
    compat.reached_by_all(b, "T.tvm_thread_allreduce", loc)
    if b.top is not region["frame"]:
        compat._hoist(b, "T.tvm_thread_allreduce", loc)
        region = b.thread_region
    reducer = _SCOPES[-1]
    acc = dest.buffer.dtype
    extent = region["extent"]
    slots = _alloc._alloc((extent,), acc, ir.Scope.SHARED, "allreduce")
    b.emit(ir.Store(slots.buffer, (tvar,), ir.cast(value, acc), loc))
    b.emit(ir.Store(dest.buffer, dest.indices, ir.cast(reducer.identity[0], acc), loc))
    # the group's slots: tvar with each reduced index replaced by k_d (linear id = sum idx_d * inner_d)
    thread_dims = b.kernel["thread_dims"] + (1, 1)
    base: ir.Expr = tvar
    ks = []
    for d in dims:
        inner = 1
        for x in thread_dims[:d]:
            inner *= x
        k = b.new_var(f"r{d}")
        ks.append((k, thread_dims[d]))
        base = ir.binary(ir.Op.ADD, ir.binary(ir.Op.SUB, base, ir.binary(ir.Op.MUL, index[d], inner)),
                         ir.binary(ir.Op.MUL, k, inner))
    combined = ir.cast(reducer.fn(ir.Load(dest.buffer, dest.indices), ir.Load(slots.buffer, (base,))), acc)
    body: ir.Stmt = ir.Store(dest.buffer, dest.indices, combined, loc)
    for k, n in reversed(ks):
        body = ir.For(k, ir.const(n), body, loc=loc)
    b.emit(body)
