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
