"""The IR verifier: structural rules every pass and renderer may rely on.

The DSL already rejects most mistakes at the author's line while tracing; the
verifier re-checks the finished tree (and every pass's output) so that a
hand-built or transformed kernel can never reach a renderer malformed.
"""
from __future__ import annotations

from kernforge import dtypes
from kernforge.codegen import ir


class _Verifier:
    def __init__(self, kernel: ir.Kernel):
        self.k = kernel
        self.vars = set(kernel.symbols) | set(kernel.scalar_params) | set(kernel.block_vars)
        self.buffers = [set(kernel.buffer_params)]
        self.in_parallel = False
        self.map_top: tuple = ((), ())  # the current Parallel's vars and top-level statements
        self.shuffle_ok = None  # the one ir.Shuffle the statement being checked may hold
        # expressions already checked in the current (or an enclosing) scope: traced
        # kernels share subexpressions (``j = bx * BN + i`` used by many stores), and
        # re-walking each use made verification quadratic on large kernels
        self.checked: set = set()

    def fail(self, msg, node):
        raise ir.KernelError(msg, getattr(node, "loc", None) or self.k.loc)

    def live(self, buf, node):
        if not any(buf in s for s in self.buffers):
            self.fail(f"buffer {buf.name!r} used out of scope", node)

    def expr(self, e, node):
        if id(e) in self.checked:
            return
        self.checked.add(id(e))
        for n in ir.walk(e):
            if isinstance(n, ir.Shuffle) and n is not self.shuffle_ok:
                self.fail("a warp shuffle must be the value of a store at the top level of its "
                          "thread Parallel (every thread reaches it)", node)
            if isinstance(n, ir.Var) and n not in self.vars:
                self.fail(f"variable {n.name!r} used outside the loop or kernel that defines it", node)
            if isinstance(n, ir.Load):
                self.live(n.buffer, node)
                self.indices(n.buffer, n.indices, node)

    def indices(self, buf, idx, node):
        if len(idx) != buf.ndim:
            self.fail(f"{buf.name} has {buf.ndim} dims, indexed with {len(idx)}", node)
        for i in idx:
            if not i.dtype.is_int:
                self.fail(f"index {i} into {buf.name} is {i.dtype}, not an integer", node)

    def region(self, r, node):
        self.live(r.buffer, node)
        if len(r.starts) != r.buffer.ndim or len(r.extents) != r.buffer.ndim:
            self.fail(f"region {r!r} does not match {r.buffer.name}'s rank", node)
        for s in r.starts:
            self.expr(s, node)
        if r.buffer.scope != ir.Scope.GLOBAL:  # global tiles are masked at the edges
            for s, e, d in zip(r.starts, r.extents, r.buffer.static_shape()):
                if isinstance(s, ir.Const) and (s.value < 0 or s.value + e > d):
                    self.fail(f"region {r!r} is outside on-chip buffer {r.buffer.name}{r.buffer.static_shape()}", node)

    def fetch_result(self, s: ir.Atomic) -> None:
        """A fetch-and-op's previous value goes to a live on-chip element of the atomic's dtype,
        inside a parallel loop (a thread map: each thread gets its own value)."""
        r = s.result
        self.live(r, s)
        self.indices(r, s.result_indices, s)
        for i in s.result_indices:
            self.expr(i, s)
        if r.dtype != s.buffer.dtype:
            self.fail(f"fetch-and-op result {r.name} is {r.dtype}, the atomic's buffer {s.buffer.name} "
                      f"is {s.buffer.dtype}", s)
        if r.scope == ir.Scope.GLOBAL or not self.in_parallel:
            self.fail(f"fetch-and-op result {r.name} must be a thread's own on-chip element inside a "
                      "thread map", s)

    def stmt(self, s):
        if isinstance(s, ir.Seq):
            self.buffers.append(set())
            for x in s.body:
                self.stmt(x)
            self.buffers.pop()
            self.checked.clear()  # buffers allocated in this Seq are no longer live
        elif isinstance(s, ir.Allocate):
            if self.in_parallel:
                self.fail("allocation inside a parallel loop", s)
            if s.buffer.scope == ir.Scope.GLOBAL:
                self.fail(f"cannot allocate global buffer {s.buffer.name} inside a kernel", s)
            self.buffers[-1].add(s.buffer)
        elif isinstance(s, ir.For):
            self.expr(s.start, s)
            self.expr(s.extent, s)
            self.scoped([s.var], s.body)
        elif isinstance(s, ir.Parallel):
            if self.in_parallel:
                self.fail("nested parallel loop", s)
            self.in_parallel = True
            self.map_top = (s.vars, {id(x) for x in (s.body.body if isinstance(s.body, ir.Seq) else (s.body,))})
            self.scoped(list(s.vars), s.body)
            self.map_top = ((), ())
            self.in_parallel = False
        elif isinstance(s, ir.If):
            self.expr(s.cond, s)
            if not s.cond.dtype.is_bool:
                self.fail(f"if condition {s.cond} is {s.cond.dtype}, not bool", s)
            self.scoped([], s.then)
            if s.orelse is not None:
                self.scoped([], s.orelse)
        elif isinstance(s, (ir.Store, ir.Atomic)):
            self.live(s.buffer, s)
            self.indices(s.buffer, s.indices, s)
            vars_, top = self.map_top
            if isinstance(s.value, ir.Shuffle) and s.value.thread in vars_ and id(s) in top:
                self.shuffle_ok = s.value
            self.expr(s.value, s)
            self.shuffle_ok = None
            if s.value.dtype != s.buffer.dtype:
                self.fail(f"storing {s.value.dtype} into {s.buffer.dtype} buffer {s.buffer.name} "
                          "without a cast", s)
            if isinstance(s, ir.Atomic) and s.result is not None:
                self.fetch_result(s)
        elif isinstance(s, ir.Copy):
            self.region(s.src, s)
            self.region(s.dst, s)
            if s.src.squeezed() != s.dst.squeezed():
                self.fail(f"copy shape mismatch {s.src.extents} -> {s.dst.extents}", s)
        elif isinstance(s, ir.Fill):
            self.region(s.dst, s)
            self.expr(s.value, s)
        elif isinstance(s, ir.Gemm):
            for r in (s.a, s.b, s.c):
                self.region(r, s)
        elif isinstance(s, (ir.Reduce, ir.Cumsum)):
            self.live(s.src, s)
            self.live(s.dst, s)
        elif isinstance(s, ir.Check):
            for e in (s.cond,) + s.indices + s.shape:
                self.expr(e, s)
            if not s.cond.dtype.is_bool:
                self.fail(f"check condition {s.cond} is {s.cond.dtype}, not bool", s)
        elif isinstance(s, ir.Sync):
            if s.scope != "block":
                self.fail(f"unknown barrier scope {s.scope!r} (only 'block')", s)
        elif isinstance(s, ir.OnlineSoftmax):
            self.online_softmax(s)
        elif isinstance(s, ir.RadixFindBucket):
            self.radix_find_bucket(s)
        else:
            self.fail(f"unknown statement {type(s).__name__}", s)

    def online_softmax(self, s: ir.OnlineSoftmax):
        if self.in_parallel:
            self.fail("online_softmax inside a parallel loop (it is a whole-tile step)", s)
        bufs = (s.scores, s.row_max, s.row_sum, s.rescale)
        for b in bufs:
            self.live(b, s)
            if b.scope not in (ir.Scope.SHARED, ir.Scope.FRAGMENT) or b.dtype != dtypes.float32:
                self.fail(f"online_softmax operand {b.name} must be a float32 shared/fragment tile, "
                          f"is {b.scope.value} {b.dtype}", s)
        if s.scores.ndim != 2:
            self.fail(f"online_softmax scores {s.scores.name} must be 2-D, is {s.scores.static_shape()}", s)
        rows = s.scores.static_shape()[0]
        for b in bufs[1:]:
            if b.static_shape() != (rows,):
                self.fail(f"online_softmax row vector {b.name}{b.static_shape()} does not match the "
                          f"{rows} rows of {s.scores.name}", s)
        self.expr(s.scale_log2, s)
        if not s.scale_log2.dtype.is_float:
            self.fail(f"online_softmax scale_log2 {s.scale_log2} is {s.scale_log2.dtype}, not a float", s)

    def radix_find_bucket(self, s: ir.RadixFindBucket):
        if self.in_parallel:
            self.fail("radix_find_bucket inside a parallel loop (it is a whole-tile step)", s)
        for b in (s.hist, s.above, s.need, s.bucket):
            self.live(b, s)
            if b.dtype != dtypes.int32:
                self.fail(f"radix_find_bucket operand {b.name} must be int32, is {b.dtype}", s)
        for b in (s.hist, s.above):
            if b.scope not in (ir.Scope.SHARED, ir.Scope.FRAGMENT) or b.ndim != 1:
                self.fail(f"radix_find_bucket histogram {b.name} must be a 1-D shared/fragment tile", s)
        if s.hist.static_shape() != s.above.static_shape() or s.hist is s.above:
            self.fail(f"radix_find_bucket: {s.above.name} must be a distinct tile shaped like {s.hist.name}", s)
        for b in (s.need, s.bucket):
            if b.scope != ir.Scope.LOCAL or b.static_shape() != (1,):
                self.fail(f"radix_find_bucket: {b.name} must be a T.alloc_var", s)

    def scoped(self, vars_, body):
        self.vars.update(vars_)
        self.buffers.append(set())
        self.stmt(body)
        self.buffers.pop()
        self.vars.difference_update(vars_)
        self.checked.clear()  # leaving a scope: earlier checks may rely on its variables


def verify(kernel: ir.Kernel) -> ir.Kernel:
    """Raise :class:`ir.KernelError` (with the author's line) if ``kernel`` is malformed."""
    v = _Verifier(kernel)
    for g in kernel.grid:
        for n in ir.walk(g):
            if isinstance(n, ir.Var) and n not in set(kernel.symbols) | set(kernel.scalar_params):
                v.fail(f"grid dimension {g} depends on {n.name}, which is not known at launch", kernel)
            if isinstance(n, ir.Load):
                v.fail(f"grid dimension {g} reads memory", kernel)
    v.stmt(kernel.body)
    return kernel
