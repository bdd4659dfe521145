"""Which copies of a ``T.Pipelined`` loop become a multi-stage shared-memory ring on CUDA.

A copy global -> shared at the top of a pipelined loop body, whose source
position depends only on the loop variable and on values fixed before the
loop, can be issued ``num_stages - 1`` iterations early with ``cp.async``
into its own stage of a ring of shared tiles.  The renderer then emits, per
iteration: wait for this iteration's stage, one barrier, issue the copy for
iteration ``k + num_stages - 1`` into the stage the previous iteration just
finished reading, and run the body on this iteration's stage.

Analysis only (a :class:`PipelinePlan`); the IR is unchanged.  Copies that do
not qualify stay synchronous copies inside the loop: same result, no overlap.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from kernforge.codegen import ir


@dataclass
class PipelinePlan:
    """For each pipelined loop: the copies issued ahead, and the ring depth of their tiles."""

    prefetch: dict[ir.For, list[ir.Copy]] = field(default_factory=dict)
    stages: dict[ir.Buffer, int] = field(default_factory=dict)  # shared tile -> ring depth


def _stmts(s: ir.Stmt) -> tuple[ir.Stmt, ...]:
    return s.body if isinstance(s, ir.Seq) else (s,)


def _written_locals(s: ir.Stmt) -> set:
    return {n.buffer for n in ir.nodes(s) if isinstance(n, (ir.Store, ir.Atomic))}


def _touches(s: ir.Stmt, b: ir.Buffer) -> bool:
    for n in ir.nodes(s):
        if isinstance(n, (ir.Load, ir.Store, ir.Atomic)) and n.buffer is b:
            return True
        if isinstance(n, ir.Region) and n.buffer is b:
            return True
        if isinstance(n, (ir.Reduce, ir.Cumsum)) and b in (n.src, n.dst):
            return True
        if isinstance(n, ir.OnlineSoftmax) and b in (n.scores, n.row_max, n.row_sum, n.rescale):
            return True
        if isinstance(n, ir.RadixFindBucket) and b in (n.hist, n.above, n.need, n.bucket):
            return True
    return False


def _invariant(e: ir.Expr, loop: ir.For, outer_vars: set, written: set) -> bool:
    for n in ir.nodes(e):
        if isinstance(n, ir.Var) and n is not loop.var and n not in outer_vars:
            return False
        if isinstance(n, ir.Load) and (n.buffer.scope not in (ir.Scope.GLOBAL, ir.Scope.LOCAL)
                                       or n.buffer in written):
            return False
    return True


def plan_pipelines(kernel: ir.Kernel, staged: set) -> PipelinePlan:
    """Find the ring copies of every pipelined loop (``staged``: fragments living in shared memory,
    which are never ring tiles)."""
    plan = PipelinePlan()
    base_vars = set(kernel.block_vars) | set(kernel.symbols) | set(kernel.scalar_params)
    _visit(kernel.body, kernel, base_vars, staged, plan)
    return plan


def _visit(s: ir.Stmt, kernel: ir.Kernel, scope_vars: set, staged: set, plan: PipelinePlan) -> None:
    if isinstance(s, ir.Seq):
        for x in s.body:
            _visit(x, kernel, scope_vars, staged, plan)
    elif isinstance(s, ir.If):
        _visit(s.then, kernel, scope_vars, staged, plan)
        if s.orelse is not None:
            _visit(s.orelse, kernel, scope_vars, staged, plan)
    elif isinstance(s, ir.For):
        if s.kind == ir.LoopKind.PIPELINED and s.num_stages >= 2:
            _plan_loop(s, kernel, scope_vars, staged, plan)
        _visit(s.body, kernel, scope_vars | {s.var}, staged, plan)


def _plan_loop(loop: ir.For, kernel: ir.Kernel, outer_vars: set, staged: set, plan: PipelinePlan) -> None:
    written = _written_locals(loop.body)
    body = _stmts(loop.body)
    chosen: list[ir.Copy] = []
    for i, s in enumerate(body):
        if not isinstance(s, ir.Copy):
            break
        dst = s.dst.buffer
        ok = (s.src.buffer.scope == ir.Scope.GLOBAL and dst.scope == ir.Scope.SHARED and dst not in staged
              and dst not in plan.stages and s.dst.extents == dst.static_shape()
              and all(isinstance(x, ir.Const) and x.value == 0 for x in s.dst.starts)
              and all(_invariant(e, loop, outer_vars, written) for e in s.src.starts)
              and not any(_touches(x, dst) for x in body[:i])
              and not _touches_outside(kernel.body, loop, dst))
        if not ok:
            break
        chosen.append(s)
    if chosen:
        plan.prefetch[loop] = chosen
        for c in chosen:
            plan.stages[c.dst.buffer] = loop.num_stages


def _touches_outside(root: ir.Stmt, loop: ir.For, b: ir.Buffer) -> bool:
    if root is loop:
        return False
    if isinstance(root, ir.Seq):
        return any(_touches_outside(x, loop, b) for x in root.body)
    if isinstance(root, ir.If):
        return _touches_outside(root.then, loop, b) or (root.orelse is not None
                                                        and _touches_outside(root.orelse, loop, b))
    if isinstance(root, ir.For):
        return _touches_outside(root.body, loop, b)
    return _touches(root, b)


def plan_release_rings(tma_loops: dict, layouts) -> set:
    """The TMA rings whose stages are released by the consumers' wgmma completion (an *empty*
    mbarrier per stage) instead of a block-wide barrier per iteration, so that one wgmma group
    stays in flight across iterations (``wgmma_wait<1>``).

    Why only this shape: a loop whose body, besides its TMA'd ring copies, is exactly one wgmma
    ``T.gemm`` accumulating (no ``clear_accum``) into a register fragment that every warp of the
    block drives.  Then the only shared-memory readers of a stage are that gemm's wgmmas (async
    proxy; nothing else writes shared memory in the loop), the accumulator is touched by nothing
    but the chained wgmmas until the wait after the loop, and every thread issues (and so
    releases) every stage, which makes the empty barrier's arrival count the block size.  Every
    tile must be issued by thread 0 alone (whole-tile boxes: swizzled or row-major, not the
    core-matrix boxes the block's threads share), since only thread 0 waits on the empty barrier
    before refilling a stage.
    Anything else (an fp8 promotion reading the partial sum, a bf16 shadow conversion, MLA's
    softmax) keeps the per-iteration barrier; ``tma_loops``: ``cuda_tma.plan_tma``'s loops,
    ``layouts``: the layout plan."""
    out = set()
    for loop, tiles in tma_loops.items():
        if any(t.layout == "core" for t in tiles):
            continue
        ring = [t.copy for t in tiles]
        rest = [s for s in _stmts(loop.body) if not any(s is c for c in ring)]
        if len(rest) != 1 or not isinstance(rest[0], ir.Gemm):
            continue
        g = rest[0]
        lay = layouts.registers.get(g.c.buffer)
        if (layouts.gemm_kind.get(g) == "wgmma" and not g.clear_accum and lay is not None
                and lay.used_warps == lay.warps and g.c.buffer.scope == ir.Scope.FRAGMENT):
            out.add(loop)
    return out



def plan_promotion_rings(tma_loops: dict, layouts) -> set:
    """The TMA rings of fp8 GEMMs with DeepGEMM's per-128-K promotion: the body, besides its ring
    copies, is one wgmma ``T.gemm`` that clears its register accumulator (``clear_accum``: each
    iteration's partial sum) followed by statements that touch no shared memory (the promotion
    ``C += partial * scales``, reading registers and global scales).

    Why they can release their stage by an empty mbarrier too: the promotion must read the
    finished partial sum, so the gemm waits for its wgmmas (``wgmma_wait<0>``) every iteration,
    and from that point nothing reads the stage: the consumers release it *before* promoting,
    and the producer refills it while they promote.  Only a producer warpgroup renders them
    (``plan_warp_specialization``); without one they keep the per-iteration block barrier."""
    out = set()
    for loop, tiles in tma_loops.items():
        if any(t.layout == "core" for t in tiles):
            continue
        ring = [t.copy for t in tiles]
        rest = [s for s in _stmts(loop.body) if not any(s is c for c in ring)]
        if not rest or not isinstance(rest[0], ir.Gemm):
            continue
        g = rest[0]
        lay = layouts.registers.get(g.c.buffer)
        if not (layouts.gemm_kind.get(g) == "wgmma" and g.clear_accum and lay is not None
                and lay.used_warps == lay.warps and g.c.buffer.scope == ir.Scope.FRAGMENT):
            continue
        if all(_registers_only(x, layouts) for x in rest[1:]):
            out.add(loop)
    return out


def _registers_only(s: ir.Stmt, layouts) -> bool:
    """Whether ``s`` is a statement that reads and writes no shared memory and has no barrier or
    tile operation of its own (a map over register fragments, global loads, locals)."""
    for n in ir.nodes(s):
        if isinstance(n, (ir.Sync, ir.Gemm, ir.Copy, ir.Reduce, ir.Cumsum, ir.OnlineSoftmax, ir.RadixFindBucket,
                          ir.Atomic)):
            return False
        if isinstance(n, (ir.Load, ir.Store)) and (n.buffer.scope == ir.Scope.SHARED or n.buffer in layouts.staged):
            return False
    return True


# Warp specialization (docs/backends/cuda.md, "Warp-specialized GEMM pipeline")
PRODUCER_THREADS = 128  # one warpgroup: setmaxnreg acts on whole warpgroups
PRODUCER_REGS = 40  # it only computes TMA coordinates and waits on barriers
CONSUMER_REGS = 232  # DeepGEMM's count for its math warpgroups; lowered when the pool cannot hold it
REGISTER_FILE = 65536  # 32-bit registers per CTA on sm_90
MAX_CONSUMERS = 256  # two math warpgroups, as DeepGEMM: more would leave them under ~150 registers


@dataclass(frozen=True)
class WarpSpecialization:
    """A kernel whose release and promotion rings are filled by a producer warpgroup.

    The block grows by ``PRODUCER_THREADS``: the consumers keep thread ids ``0..consumers-1``
    (so every lowering written for ``kernel.threads`` threads is unchanged), the producer
    warpgroup takes the ids after them and its first thread (``leader``) issues every TMA.
    ``producer_regs`` / ``consumer_regs``: the ``setmaxnreg`` counts of the two roles;
    ``rings``: the loops the producer fills; ``promoting``: those of them that are promotion rings
    (:func:`plan_promotion_rings`: release after ``wgmma_wait<0>``, not one iteration later)."""

    consumers: int
    producer_regs: int
    consumer_regs: int
    rings: frozenset
    promoting: frozenset = frozenset()

    @property
    def threads(self) -> int:
        """The launch's block size."""
        return self.consumers + PRODUCER_THREADS

    @property
    def leader(self) -> int:
        return self.consumers


def plan_warp_specialization(kernel: ir.Kernel, pipes: PipelinePlan, release: set,
                             promotion: set = frozenset(), seesaw=None) -> Optional[WarpSpecialization]:
    """Whether (and how) ``kernel``'s release and promotion rings (:func:`plan_release_rings`,
    :func:`plan_promotion_rings`) get a producer warpgroup, which runs a *slice* of the kernel:
    the control flow that leads to the rings and the rings' fills, nothing else, while the
    consumer warpgroups run the whole body except the fills.

    Why these conditions: the slice must compute the same branches, loop bounds and TMA
    coordinates as the consumers without their data, so every expression in it may read only
    block indices, shape symbols, scalar parameters, enclosing loop variables and global inputs
    the kernel never writes; every pipelined loop must be a release or promotion ring (another
    ring synchronises the whole block each iteration); and no lowering may synchronise the block
    inside a device helper (row reductions, scans, softmax, radix select), since the consumers'
    barriers become named barriers over the consumer threads only.  The block must be whole
    warpgroups (``setmaxnreg``) and at most ``MAX_CONSUMERS`` consumer threads.  ``seesaw``
    (:func:`kernforge.backends.cuda.seesaw.plan_seesaw`): an attention loop the consumers run as
    two warpgroups, a ring like the others; its softmax runs inside one warpgroup."""
    rings = frozenset(release) | frozenset(promotion) | (frozenset({seesaw.loop}) if seesaw else frozenset())
    if (not rings or set(pipes.prefetch) != set(rings) or kernel.threads % PRODUCER_THREADS
            or kernel.threads > MAX_CONSUMERS):
        return None
    if any(isinstance(n, (ir.Reduce, ir.Cumsum, ir.OnlineSoftmax, ir.RadixFindBucket)) for n in ir.nodes(kernel.body)
           if seesaw is None or n is not seesaw.softmax):
        return None
    written = {n.buffer for n in ir.nodes(kernel.body) if isinstance(n, (ir.Store, ir.Atomic))}
    written |= {n.dst.buffer for n in ir.nodes(kernel.body) if isinstance(n, (ir.Copy, ir.Fill))}
    written |= {n.c.buffer for n in ir.nodes(kernel.body) if isinstance(n, ir.Gemm)}
    base = set(kernel.block_vars) | set(kernel.symbols) | set(kernel.scalar_params)
    if not _slice_ok(kernel.body, base, pipes.prefetch, rings, written):
        return None
    share = (REGISTER_FILE - PRODUCER_THREADS * PRODUCER_REGS) // kernel.threads // 8 * 8
    return WarpSpecialization(kernel.threads, PRODUCER_REGS, min(CONSUMER_REGS, share), rings,
                              frozenset(promotion) - frozenset(release))


def leads_to_ring(s: ir.Stmt, rings) -> bool:
    """Whether statement ``s`` is or contains one of ``rings`` (the producer's slice keeps it)."""
    return any(n in rings for n in ir.nodes(s) if isinstance(n, ir.For))


def _computable(e: ir.Expr, known: set, written: set) -> bool:
    for n in ir.nodes(e):
        if isinstance(n, ir.Var) and n not in known:
            return False
        if isinstance(n, ir.Load) and (n.buffer.scope != ir.Scope.GLOBAL or n.buffer in written):
            return False
    return True


def _slice_ok(s: ir.Stmt, known: set, prefetch: dict, rings, written: set) -> bool:
    if not leads_to_ring(s, rings):
        return True
    if isinstance(s, ir.Seq):
        return all(_slice_ok(x, known, prefetch, rings, written) for x in s.body)
    if isinstance(s, ir.If):
        return (_computable(s.cond, known, written) and _slice_ok(s.then, known, prefetch, rings, written)
                and (s.orelse is None or _slice_ok(s.orelse, known, prefetch, rings, written)))
    if isinstance(s, ir.For):
        if not (_computable(s.start, known, written) and _computable(s.extent, known, written)):
            return False
        inner = known | {s.var}
        if s in rings:
            return all(_computable(e, inner, written) for c in prefetch[s] for e in c.src.starts)
        return _slice_ok(s.body, inner, prefetch, rings, written)
    return False  # a Parallel (or other statement) around a ring: no slice

