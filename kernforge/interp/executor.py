"""The reference interpreter: runs tile IR with numpy, block by block.

It is the semantic oracle every backend is checked against, so it is written
for clarity and for catching kernel bugs rather than for speed:

* every load and store is bounds-checked (numpy would silently wrap negative
  indices), and masked-off lanes of a parallel loop never touch memory;
* on-chip buffers start poisoned (NaN for floats, a sentinel for integers), so
  reading an element before writing it shows up in the results;
* two iterations of a ``Parallel`` loop storing to the same element is reported
  as the race it is (in thread-level code, threads may store one value to one element);
* in thread-level code, two threads touching one shared element between the same two
  barriers, one of them writing, is reported too (:mod:`kernforge.interp.races`), although
  the lockstep run would give the answer of a barrier that is not there.

A ``Parallel`` loop runs vectorised: its variables are index arrays broadcast
over the iteration space, and ``If`` inside it narrows a lane mask.
"""
from __future__ import annotations

import itertools

import numpy as np

from kernforge import dtypes
from kernforge.codegen import ir
from kernforge.codegen.passes.composites import expand
from kernforge.interp.races import SharedAccessLog, same_bits
from kernforge.interp.values import Evaluator, convert

_INT_POISON = 0x5A


def _poison(buf: ir.Buffer) -> np.ndarray:
    shape = buf.static_shape()
    if buf.dtype.is_float:
        return np.full(shape, np.nan, dtype=np.float32).astype(buf.dtype.np_dtype)
    if buf.dtype.is_bool:
        return np.ones(shape, dtype=np.bool_)
    return np.full(shape, _INT_POISON, dtype=buf.dtype.np_dtype)


def _all_equal(vals: np.ndarray, first, inverse) -> bool:
    """Every value stored to one element equals the first one stored there (bit for bit, so
    equal NaNs count as equal): the benign race of threads that all store the same value."""
    bits = same_bits(vals)
    return bool(np.all(bits == bits[first][inverse.reshape(-1)]))


def _previous(ufunc, arr: np.ndarray, idx: tuple, vals: np.ndarray) -> np.ndarray:
    """The value each lane's update finds, when the lanes (in thread order) update ``arr[idx]``
    one after another: deterministic, as the CPU's serial thread loop numbers them.  Integer
    adds are an exclusive prefix sum within each element's group of lanes (wrapping as the
    dtype does); float adds and maxima are replayed lane by lane (each rounding step matters)."""
    flat = np.ravel_multi_index(idx, arr.shape) if idx else np.zeros(len(vals), np.int64)
    flat = np.asarray(flat, np.int64).reshape(-1)
    vals = np.asarray(vals).reshape(-1)
    cur = arr.reshape(-1)[flat] if arr.flags.c_contiguous else arr[idx].reshape(-1)
    if ufunc is np.add and arr.dtype.kind in "iu":
        order = np.argsort(flat, kind="stable")
        f, v = flat[order], vals[order].astype(np.int64)
        total = np.cumsum(v)
        first = np.maximum.accumulate(np.where(np.r_[True, f[1:] != f[:-1]], np.arange(len(f)), 0))
        before = total - v - (total[first] - v[first])  # what earlier lanes of the group added
        prev = np.empty(len(f), np.int64)
        prev[order] = cur[order].astype(np.int64) + before
        with np.errstate(over="ignore"):
            return prev.astype(arr.dtype)
    prev = np.empty(len(flat), arr.dtype)
    seen: dict = {}
    for k, (e, x) in enumerate(zip(flat.tolist(), vals)):
        old = seen.get(e, cur[k])
        prev[k] = old
        seen[e] = ufunc(old, x).astype(arr.dtype)
    return prev


class Interpreter:
    """Executes one kernel over its grid on host numpy arrays."""

    def __init__(self, kernel: ir.Kernel):
        self.kernel = kernel
        self.eval = Evaluator(self)
        self.env: dict = {}
        self.storage: dict = {}
        self.expansions: dict = {}
        # thread-level code (kernforge.dsl.compat): the T.Parallel loops over these variables run
        # the block's threads, between two barriers; ``thread_map`` is the one running now
        self.thread_vars = set(filter(None, str(kernel.attrs.get("thread_maps", "")).split(",")))
        self.thread_map = None
        self.races = None  # the shared accesses of the running thread map (kernforge.interp.races)

    # ------------------------------------------------------------------ entry
    def run(self, args, dims, grid) -> None:
        k = self.kernel
        self.env = dict(zip(k.symbols, (int(d) for d in dims)))
        self.storage = {}
        for p, a in zip(k.params, args):
            if isinstance(p, ir.Buffer):
                self.storage[p] = a
            else:
                self.env[p] = np.asarray(a, dtype=p.dtype.np_dtype)
        for idx in itertools.product(*(range(g) for g in grid)):
            for v, i in zip(k.block_vars, idx):
                self.env[v] = np.int32(i)
            self.stmt(k.body, None)

    # ------------------------------------------------------------------ memory
    def _indices(self, buf: ir.Buffer, indices, mask, what: str):
        arr = self.storage.get(buf)
        if arr is None:
            raise ir.KernelError(f"{what} of buffer {buf.name} outside its scope")
        idx = [np.asarray(self.eval(i, mask)).astype(np.int64) for i in indices]
        shape = arr.shape
        bad = np.zeros(np.broadcast(*idx).shape if idx else (), dtype=bool)
        for i, n in zip(idx, shape):
            bad = bad | (i < 0) | (i >= n)
        if mask is not None:
            bad = bad & mask
        if np.any(bad):
            where = tuple(int(np.broadcast_to(i, bad.shape)[bad].flat[0]) for i in idx)
            raise ir.KernelError(f"out-of-bounds {what} {buf.name}{list(where)} (shape {shape})")
        if mask is not None:
            idx = [np.where(mask, i, 0) for i in idx]
        return arr, tuple(idx)

    def _tracked(self, buf: ir.Buffer, mask) -> bool:
        return self.races is not None and mask is not None and buf.scope == ir.Scope.SHARED

    def _lanes(self, arr, idx, mask, masked: bool = False):
        """The flat element index and the thread of every active lane of a thread map
        (``masked``: ``idx`` holds the active lanes' indices already)."""
        tid = np.broadcast_to(self.env[self.thread_map.vars[0]], mask.shape)[mask].astype(np.int64)
        if not masked:
            idx = tuple(np.broadcast_to(i, mask.shape)[mask] for i in idx)
        flat = np.ravel_multi_index(idx, arr.shape) if idx else np.zeros(len(tid), np.int64)
        return np.asarray(flat, np.int64).reshape(-1), tid.reshape(-1)

    def load(self, e: ir.Load, mask):
        arr, idx = self._indices(e.buffer, e.indices, mask, "read")
        if self._tracked(e.buffer, mask):
            self.races.read(e.buffer, arr, *self._lanes(arr, idx, mask))
        return arr[idx]

    def store(self, s: ir.Store, mask) -> None:
        arr, idx = self._indices(s.buffer, s.indices, mask, "write")
        value = convert(self.eval(s.value, mask), s.buffer.dtype)
        if mask is None:
            arr[idx] = value
            return
        shape = mask.shape
        idx = tuple(np.broadcast_to(i, shape)[mask] for i in idx)
        vals = np.broadcast_to(value, shape)[mask]
        flat = np.ravel_multi_index(idx, arr.shape) if idx else np.zeros(0)
        uniq, first, inverse = np.unique(flat, return_index=True, return_inverse=True)
        if len(uniq) != len(flat) and not (self.thread_map is not None and _all_equal(vals, first, inverse)):
            raise ir.KernelError(f"T.Parallel iterations store to the same element of "
                                 f"{s.buffer.name} (a race); use a reduction or an atomic"
                                 + (" (threads may store only the same value to one element)"
                                    if self.thread_map is not None else ""), s.loc)
        if self._tracked(s.buffer, mask):
            self.races.write(s.buffer, arr, *self._lanes(arr, idx, mask, True), np.asarray(vals).reshape(-1))
        arr[idx] = vals

    def atomic(self, s: ir.Atomic, mask) -> None:
        arr, idx = self._indices(s.buffer, s.indices, mask, "atomic")
        value = convert(self.eval(s.value, mask), s.buffer.dtype)
        shape = mask.shape if mask is not None else np.broadcast(*idx, value).shape
        m = mask if mask is not None else np.ones(shape, dtype=bool)
        idx = tuple(np.broadcast_to(i, shape)[m] for i in idx)
        vals = np.broadcast_to(value, shape)[m]
        if self._tracked(s.buffer, mask):
            self.races.write(s.buffer, arr, *self._lanes(arr, idx, m, True), vals, atomic=True)
        ufunc = np.add if s.op == ir.Op.ATOMIC_ADD else np.fmax if s.buffer.dtype.is_float else np.maximum
        if s.result is not None:
            self.fetched(s, m, _previous(ufunc, arr, idx, vals))
        ufunc.at(arr, idx, vals)

    def fetched(self, s: ir.Atomic, m, prev) -> None:
        """A fetch-and-op's previous values (one per active lane) go to its result elements."""
        rarr, ridx = self._indices(s.result, s.result_indices, m, "write")
        rarr[tuple(np.broadcast_to(i, m.shape)[m] for i in ridx)] = prev

    # ------------------------------------------------------------------ statements
    def stmt(self, s: ir.Stmt, mask) -> None:
        try:
            getattr(self, "s_" + type(s).__name__)(s, mask)
        except ir.KernelError as e:
            if e.loc is None and getattr(s, "loc", None) is not None:
                e.loc = s.loc  # the statement's line, keeping the error's type (ThreadRaceError...)
                e.args = (f"{s.loc}: {e.message}",)
            raise

    def s_Seq(self, s, mask):
        for x in s.body:
            self.stmt(x, mask)

    def s_Allocate(self, s, mask):
        self.storage[s.buffer] = _poison(s.buffer)

    def s_For(self, s, mask):
        start = np.asarray(self.eval(s.start, mask))
        extent = np.asarray(self.eval(s.extent, mask))
        if start.ndim or extent.ndim:
            self.lane_loop(s, mask, start, extent)
            return
        for i in range(int(start), int(start) + int(extent)):
            self.env[s.var] = np.asarray(i, dtype=s.var.dtype.np_dtype)
            self.stmt(s.body, mask)

    def lane_loop(self, s: ir.For, mask, start, extent) -> None:
        """A loop whose bounds differ between the lanes of a thread map (a trip count read from
        each thread's own variable): iteration ``i`` runs for the lanes whose range holds it."""
        stop = start.astype(np.int64) + extent.astype(np.int64)
        base = mask if mask is not None else np.ones(np.broadcast(start, stop).shape, dtype=bool)
        lo, hi = np.broadcast_to(start, base.shape)[base], np.broadcast_to(stop, base.shape)[base]
        if not len(lo):
            return
        for i in range(int(lo.min()), int(hi.max())):
            m = base & (start <= i) & (i < stop)
            if m.any():
                self.env[s.var] = np.asarray(i, dtype=s.var.dtype.np_dtype)
                self.stmt(s.body, m)

    def s_Parallel(self, s, mask):
        grids = np.indices(s.extents, dtype=np.int32)
        for v, g in zip(s.vars, grids):
            self.env[v] = g
        outer = self.thread_map, self.races
        if len(s.vars) == 1 and s.vars[0].name in self.thread_vars:
            self.thread_map, self.races = s, SharedAccessLog()  # a barrier before: a fresh log
        try:
            self.stmt(s.body, np.ones(s.extents, dtype=bool))
        finally:
            self.thread_map, self.races = outer
        for v in s.vars:
            del self.env[v]

    def s_If(self, s, mask):
        c = np.asarray(self.eval(s.cond, mask)).astype(bool)
        if mask is None and c.ndim == 0:
            if c:
                self.stmt(s.then, None)
            elif s.orelse is not None:
                self.stmt(s.orelse, None)
            return
        base = mask if mask is not None else np.ones(c.shape, dtype=bool)
        then_mask = base & c
        if then_mask.any():
            self.stmt(s.then, then_mask)
        if s.orelse is not None:
            else_mask = base & ~c
            if else_mask.any():
                self.stmt(s.orelse, else_mask)

    def s_Sync(self, s, mask):
        """A barrier orders threads; the interpreter runs the block as one, so it has no effect."""

    def s_Check(self, s: ir.Check, mask):
        """Checked mode's bounds test: the first lane where it fails is the violation."""
        ok = np.asarray(self.eval(s.cond, mask)).astype(bool)
        bad = ~ok if mask is None else mask & ~ok
        if not np.any(bad):
            return
        lane = tuple(int(x[0]) for x in np.nonzero(bad)) if bad.ndim else ()
        index = [int(np.broadcast_to(self.eval(i, mask), bad.shape)[lane]) for i in s.indices]
        shape = [int(self.eval(d)) for d in s.shape]
        raise ir.CheckError(s.kind, s.name, index, shape, s.loc, s.extents)

    def s_Store(self, s, mask):
        self.store(s, mask)

    def s_Atomic(self, s, mask):
        self.atomic(s, mask)

    # tile ops ------------------------------------------------------------------
    def _window(self, r: ir.Region):
        """Slices of the in-bounds part of region ``r`` in the buffer and in the tile."""
        arr = self.storage[r.buffer]
        buf_sl, tile_sl = [], []
        for start, ext, n in zip(r.starts, r.extents, arr.shape):
            s0 = int(self.eval(start))
            lo, hi = max(s0, 0), min(s0 + ext, n)
            hi = max(hi, lo)
            buf_sl.append(slice(lo, hi))
            tile_sl.append(slice(lo - s0, hi - s0))
        return arr, tuple(buf_sl), tuple(tile_sl)

    def read_tile(self, r: ir.Region) -> np.ndarray:
        arr, bs, ts = self._window(r)
        tile = np.zeros(r.extents, dtype=arr.dtype)
        tile[ts] = arr[bs]
        return tile

    def s_Copy(self, s, mask):
        tile = self.read_tile(s.src).reshape(s.dst.extents)
        arr, bs, ts = self._window(s.dst)
        arr[bs] = convert(tile[ts], s.dst.buffer.dtype)

    def s_Fill(self, s, mask):
        arr, bs, _ = self._window(s.dst)
        arr[bs] = convert(self.eval(s.value), s.dst.buffer.dtype)

    def s_Gemm(self, s, mask):
        a = self.read_tile(s.a)
        b = self.read_tile(s.b)
        a = a.reshape([e for e in s.a.extents if e != 1] or [1, 1]) if a.ndim > 2 else a
        b = b.reshape([e for e in s.b.extents if e != 1] or [1, 1]) if b.ndim > 2 else b
        if s.trans_a:
            a = a.T
        if s.trans_b:
            b = b.T
        cdt = s.c.buffer.dtype
        acc = np.int64 if cdt.is_int else (np.float64 if cdt == dtypes.float64 else np.float32)
        prod = a.astype(acc) @ b.astype(acc)
        arr, bs, ts = self._window(s.c)
        c_old = arr[bs].astype(acc)
        prod = prod.reshape(s.c.extents)[ts]
        arr[bs] = convert(prod if s.clear_accum else c_old + prod, cdt)

    def s_Reduce(self, s, mask):
        src = self.storage[s.src]
        cdt = s.dst.dtype
        work_dt = dtypes.float32 if cdt.is_low_precision or s.src.dtype.is_low_precision else cdt
        work = convert(src, work_dt)
        if s.op == ir.Op.REDUCE_SUM:
            r = np.sum(work, axis=s.dim)
        elif s.op == ir.Op.REDUCE_MAX:
            r = np.max(work, axis=s.dim)
        else:
            r = np.min(work, axis=s.dim)
        dst = self.storage[s.dst]
        r = r.reshape(dst.shape)
        if not s.clear:
            old = convert(dst, work_dt)
            r = {ir.Op.REDUCE_SUM: np.add, ir.Op.REDUCE_MAX: np.maximum,
                 ir.Op.REDUCE_MIN: np.minimum}[s.op](old, r)
        dst[...] = convert(r, cdt)

    def s_composite(self, s, mask):
        # the oracle runs the op's definition: the same primitive statements every
        # backend without a native lowering runs (passes.composites)
        expanded = self.expansions.get(s)
        if expanded is None:
            expanded = self.expansions[s] = expand(s)
        self.stmt(expanded, mask)

    s_OnlineSoftmax = s_RadixFindBucket = s_composite

    def s_Cumsum(self, s, mask):
        src = self.storage[s.src]
        work = convert(src, dtypes.float32 if s.dst.dtype.is_low_precision else s.dst.dtype)
        if s.reverse:
            r = np.flip(np.cumsum(np.flip(work, s.dim), axis=s.dim, dtype=work.dtype), s.dim)
        else:
            r = np.cumsum(work, axis=s.dim, dtype=work.dtype)
        self.storage[s.dst][...] = convert(r, s.dst.dtype)
