"""Where the CUDA renderer needs ``__syncthreads()``: the barrier pass, with CUDA's memory model.

The generic analysis (:mod:`kernforge.codegen.passes.barriers`) inserts an
``ir.Sync`` before every statement that races an earlier one on shared memory;
the renderer emits ``__syncthreads();`` for it (``kf::fence_proxy_async();
__syncthreads();`` in a kernel with wgmma, whose operands the async proxy reads)
and decides no barrier itself.  What is shared, and how each statement touches
it, depends on CUDA's plans, so this model reads them:

* a buffer is in shared memory when its scope is ``SHARED`` or the layout plan
  staged it (``LayoutPlan.staged``); register fragments are private;
* statements are charged with what their lowering does: a tensor-core gemm reads
  its operand tiles (its accumulator is in registers); a ``cp.async`` copy
  writes its tile (its source is global); an accumulator's paired stores to
  global, a register row reduction and the register online-softmax step touch
  no shared memory; a map whose element runs in every thread (a map into
  thread-local storage with no register fragment to drive it) is a loop, with
  barriers inside it where its own statements race;
* a ``T.Pipelined`` ring (:mod:`kernforge.backends.cuda.pipeline_plan`) is
  synchronised before the loop like any access to everything; inside it, each
  iteration starts at the ring's own barrier, so its body (the statements other
  than the prefetched copies) is walked from a clean state, except that a
  stage filled by plain stores (rows too short for cp.async) leaves writes
  pending; after the loop everything is pending.

Why a transform before the analyses, not after them: the renderer's plans are
keyed by node identity (``ir.For``, ``ir.Gemm``, ``ir.Buffer``), and inserting a
``Sync`` rebuilds the ``Seq`` (and enclosing ``If``/``For``) nodes around it.
So the pass runs last among the transforms, computes the layout, pipeline and
TMA plans of its input itself, and the pipeline's analyses then plan the output
afresh.  A ``Sync`` touches no buffer and the pipeline planner only takes a
prefix of copies (a ``Sync`` never lands inside it), so both plans of a kernel
agree (``tests/codegen/test_sync_pass.py`` checks it on every library kernel).

Barriers that stay in the renderer, because they are part of one lowering's
protocol rather than an ordering of IR statements:

* the ring's per-iteration barrier (after ``cp_async_wait``, or the mbarrier
  wait of a TMA ring): it publishes the stage just landed and frees the stage
  the iteration refills; the TMA ring's init and invalidate barriers; and the
  barriers between plain (non-cp.async) stage fills in the ring's issue code,
  which the IR does not contain (the renderer moves prefetched copies there);
* a row reduction across warps (``cuda/reduce.py``): scratch written, barrier,
  read, barrier;
* device helpers that synchronise internally (``kf::block_inclusive_scan``,
  ``kf::radix_find_bucket``, ``kf::online_softmax_step`` with a scratch): they
  are charged here as ending with a barrier, or as touching no IR-visible
  shared memory.
"""
from __future__ import annotations

from dataclasses import replace

from kernforge.codegen import ir
from kernforge.codegen.passes.barriers import BarrierInsertion, Effect
from kernforge.backends.cuda.layout_plan import LayoutPlan, plan_layouts
from kernforge.backends.cuda.pipeline_plan import PipelinePlan, plan_pipelines
from kernforge.backends.cuda import ops as cuda_ops, radix as cuda_radix, reduce as cuda_reduce
from kernforge.backends.cuda import softmax as cuda_softmax, tma as cuda_tma


class CudaBarriers(BarrierInsertion):
    """The barrier walk with CUDA's placement (also a planning view: ``plan``, ``k`` and
    ``is_smem`` are what the lowering helpers of ``cuda/ops.py`` read to pick a path)."""

    def __init__(self, kernel: ir.Kernel, plan: LayoutPlan, pipes: PipelinePlan, tma_loops: dict):
        super().__init__(kernel)
        self.plan, self.pipes, self.tma_loops = plan, pipes, tma_loops

    def is_smem(self, b: ir.Buffer) -> bool:
        return b.scope == ir.Scope.SHARED or b in self.plan.staged

    shared = is_smem

    def effect(self, s: ir.Stmt) -> Effect:
        if isinstance(s, ir.Copy):
            if cuda_ops._async_ok(self, s):
                return Effect(writes=True)
            if cuda_ops._pair_layout(self, s) is not None:
                return Effect()
        elif isinstance(s, ir.Gemm):
            if self.plan.gemm_kind[s] != "scalar":
                return Effect(reads=True)
        elif isinstance(s, ir.Reduce):
            if cuda_reduce._warp_path(self, s):
                return Effect(synced_after=cuda_reduce._cross_warp(self.plan.registers[s.src]))
        elif isinstance(s, ir.Cumsum):
            if cuda_reduce.block_scan_ok(self, s):
                return Effect(True, True, synced_after=True)
        elif isinstance(s, ir.OnlineSoftmax):
            return Effect() if cuda_softmax.native(self, s) is not None else Effect(True, True)
        elif isinstance(s, ir.RadixFindBucket):
            return Effect(True, True, synced_after=True)
        return super().effect(s)

    def serial_map(self, p: ir.Parallel) -> bool:
        """``render_parallel``'s thread-local map: every thread runs every element."""
        return (cuda_radix._match(self, p) is None and cuda_ops._driver(self, p) is None
                and any(isinstance(n, (ir.Store, ir.Atomic)) and n.buffer.scope == ir.Scope.LOCAL
                        for n in ir.nodes(p.body)))

    def loop(self, s: ir.For) -> list[ir.Stmt]:
        copies = self.pipes.prefetch.get(s)
        if copies is None:
            return super().loop(s)
        need = self.before(True, True)
        tma = s in self.tma_loops
        ring = [t.copy for t in self.tma_loops[s]] if tma else copies
        # the iteration starts at the ring's barrier; plain stage fills leave their writes pending
        self.pend_w = not tma and any(not cuda_ops._async_ok(self, c) for c in copies)
        self.pend_r = False
        items = s.body.body if isinstance(s.body, ir.Seq) else (s.body,)
        out = [y for x in items for y in ([x] if any(x is c for c in ring) else self.stmt(x))]
        if len(out) != len(items) or any(a is not b for a, b in zip(out, items)):
            body = replace_body(s.body, out)
            s = replace(s, body=body)
        self.pend_w = self.pend_r = True
        return [self.sync(s.loc), s] if need else [s]


def replace_body(body: ir.Stmt, items: list) -> ir.Stmt:
    if isinstance(body, ir.Seq):
        return ir.Seq(tuple(items), body.loc)
    return items[0] if len(items) == 1 else ir.Seq(tuple(items), body.loc)


def insert_cuda_barriers(kernel: ir.Kernel, wgmma: bool, tma: bool, tcgen05: bool = False) -> ir.Kernel:
    """``kernel`` with a ``Sync`` wherever the CUDA lowering needs a block barrier that no helper
    provides (``wgmma``: the arch has warpgroup MMA; ``tma``: pipelined rings may load by TMA;
    ``tcgen05``: the arch has tcgen05.mma, sm_100a)."""
    plan = plan_layouts(kernel, wgmma, tcgen05)
    pipes = plan_pipelines(kernel, plan.staged)
    tma_loops = cuda_tma.plan_tma(kernel, plan, pipes)[0] if tma else {}
    return CudaBarriers(kernel, plan, pipes, tma_loops).run()


def barrier_pass(wgmma: bool, tma: bool, tcgen05: bool = False):
    """The pipeline step for one target: a named ``Kernel -> Kernel`` transform."""
    def cuda_barriers(kernel: ir.Kernel) -> ir.Kernel:
        return insert_cuda_barriers(kernel, wgmma, tma, tcgen05)
    return cuda_barriers
