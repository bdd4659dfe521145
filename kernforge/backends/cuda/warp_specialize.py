"""Rendering of a warp-specialized kernel (``pipeline_plan.plan_warp_specialization``): a producer
warpgroup fills the release rings by TMA while the consumer warpgroups run the wgmmas.

Block layout: the consumers are threads ``0..C-1`` (C = ``kernel.threads``) and run the kernel
body as rendered for C threads, except that each ring loop only waits on its *full* barriers
and releases stages; the producer warpgroup is threads ``C..C+127`` and runs a slice of the
body (the branches and loops that lead to the rings, then each ring's fill loop), whose first
thread ``C`` (the leader) issues every TMA.  Each role first sets its register budget
(``setmaxnreg.dec`` to ``producer_regs``, ``setmaxnreg.inc`` to ``consumer_regs``).

Barriers: the consumers' barriers are ``bar.sync 1, C`` (``CudaRenderer.barrier``); the only
block-wide ``__syncthreads()`` are at each ring's entry (after the leader has initialised its
mbarriers) and exit (before the leader invalidates them), which both roles reach because the
slice takes the same branches.  Ring protocol, iteration k (j = k - start, S stages):

* producer leader, fill j: for j >= S wait empty[j % S] for release number j / S - 1 (parity
  ``(j / S - 1) & 1``), then arm full[j % S] with the stage's bytes and issue its boxes;
* consumers: wait full[j % S] with parity ``(j / S) & 1``, issue the stage's wgmmas, commit,
  ``wgmma_wait<1>`` (iteration k-1's group has retired), arrive on empty[(j - 1) % S] (one
  arrival per consumer thread); after the loop ``wgmma_wait<0>``.  A promotion ring (fp8 with a
  per-128-K partial sum, ``pipeline_plan.plan_promotion_rings``) waits ``wgmma_wait<0>`` in its
  gemm and arrives on empty[j % S] right then, before the promotion reads the partial sum in
  registers, so the producer refills the stage while the consumers promote.  An attention loop
  the consumers run as MLA's two-warpgroup seesaw (:mod:`kernforge.backends.cuda.seesaw`) is filled
  the same way; its consumer side is ``seesaw.render_consumer``, and the leader also initialises
  the seesaw's publication barriers.
"""
from __future__ import annotations

from math import prod

from kernforge.codegen import arith, ir
from kernforge.backends.cuda import persistent as cuda_persistent, seesaw as cuda_seesaw, tma as cuda_tma
from kernforge.backends.cuda.ops import I32, render_ring_consume
from kernforge.backends.cuda.pipeline_plan import leads_to_ring

CONSUMER_BARRIER = 1  # named barrier id of the consumers' block barriers (0 is __syncthreads')


def consumer_barrier(R) -> str:
    """The consumers' block barrier (``bar.sync 1, C``), fenced for the async proxy."""
    return f"kf::fence_proxy_async(); kf::named_barrier_sync({CONSUMER_BARRIER}, {R.warp_spec.consumers});"


def render_kernel_body(R) -> None:
    """The role split, after the prologue every thread runs."""
    ws = R.warp_spec
    R.open(f"if ({R.tid} >= {ws.consumers})")  # the producer warpgroup
    R.emit(f"kf::setmaxnreg_dec<{ws.producer_regs}>();")
    if R.persistent is not None:  # each role walks the same tiles (cuda.persistent)
        cuda_persistent.render_tiles(R, lambda: _producer(R, R.k.body), consumers=False)
    else:
        _producer(R, R.k.body)
    R.close("} else {")
    R.depth += 1
    R.emit(f"kf::setmaxnreg_inc<{ws.consumer_regs}>();")
    if R.persistent is not None:
        cuda_persistent.render_tiles(R, lambda: R.stmt(R.k.body), consumers=True)
    else:
        R.stmt(R.k.body)
    R.close()


def _producer(R, s: ir.Stmt) -> None:
    """The producer's slice of ``s`` (the statements that lead to a ring)."""
    rings = R.warp_spec.rings
    if not leads_to_ring(s, rings):
        return
    if isinstance(s, ir.Seq):
        for x in s.body:
            _producer(R, x)
    elif isinstance(s, ir.If):
        R.open(f"if ({R.expr(s.cond)})")
        _producer(R, s.then)
        if s.orelse is not None and leads_to_ring(s.orelse, rings):
            R.close("} else {")
            R.depth += 1
            _producer(R, s.orelse)
        R.close()
    elif s in rings:
        _ring(R, s, producer=True)
    else:  # a loop around a ring (the planner admitted nothing else)
        if arith.nonnegative(s.start, R.nonneg_vars):
            R.nonneg_vars.add(s.var)
        v = R.var_name(s.var)
        R.open(f"for ({R.ctype(s.var.dtype)} {v} = {R.expr(s.start)}; {v} < {R.expr(s.start)} + "
               f"{R.cast_to(s.extent, s.var.dtype)}; ++{v})")
        _producer(R, s.body)
        R.close()


def _body(loop: ir.For) -> tuple:
    return loop.body.body if isinstance(loop.body, ir.Seq) else (loop.body,)


def render_consumer_ring(R, loop: ir.For) -> None:
    _ring(R, loop, producer=False)


def _ring(R, loop: ir.For, producer: bool) -> None:
    """One role's side of a ring: entry (the leader initialises S full barriers of one arrival and
    S empty barriers of C arrivals; block barrier), the role's loop, exit (block barrier; the
    leader invalidates the barriers, so entering the ring again starts from fresh objects)."""
    ws, S = R.warp_spec, loop.num_stages
    tiles = R.tma_loops[loop]
    seesaw = R.seesaw is not None and loop is R.seesaw.loop
    bars = f"kf_bars{list(R.mbarrier_offsets).index(loop)}"
    start, v = R.expr(loop.start), R.var_name(loop.var)
    end, j = R.fresh("end"), R.fresh("j")
    R.nonneg_vars.add(loop.var)
    R.emit(f"const int32_t {end} = {start} + {R.cast_to(loop.extent, I32)};")
    base = R.ring_base.get(loop)  # persistent: barriers live across tiles, j counts on from base
    j_expr = f"{v} - {start}" if base is None else f"{base} + ({v} - {start})"
    cluster = R.cluster.plan.size if R.cluster is not None else 1
    # a cluster's rings meet at cluster barriers: no peer multicasts into (or releases to) barriers
    # not yet initialised, and none leaves while a peer may still do so (cuda.cluster)
    block_sync = "kf::cluster_sync();" if cluster > 1 else "__syncthreads();"
    if producer and base is None:
        R.open(f"if ({R.tid} == {ws.leader})")
        R.emit(f"for (int kf_s = 0; kf_s < {S}; ++kf_s) kf::mbarrier_init({bars} + kf_s, 1);")
        R.emit(f"for (int kf_s = 0; kf_s < {S}; ++kf_s) kf::mbarrier_init({bars} + {S} + kf_s, "
               f"{ws.consumers * cluster});")  # each CTA of the cluster releases every stage
        if seesaw:
            cuda_seesaw.render_barrier_init(R, bars, S)
        R.emit("kf::mbarrier_init_fence();")
        R.close()
    if base is None:
        R.emit(block_sync)
    if producer:
        R.open(f"if ({R.tid} == {ws.leader})")
        R.open(f"for (int32_t {v} = {start}; {v} < {end}; ++{v})")
        R.emit(f"const int32_t {j} = {j_expr};")
        R.open(f"if ({j} >= {S})")  # the stage's previous occupant, iteration j - S, was released
        R.emit(f"kf::mbarrier_wait_parity({bars} + {S} + {j} % {S}, (uint32_t)(({j} / {S} - 1) & 1));")
        R.close()
        cuda_tma.render_issue(R, tiles, f"{j} % {S}", f"{bars} + {j} % {S}", ws.leader)
        R.close()
        R.close()
    elif seesaw:
        cuda_seesaw.render_consumer(R, R.seesaw, tiles, bars, start, end)
    elif loop in ws.promoting:
        R.open(f"for (int32_t {v} = {start}; {v} < {end}; ++{v})")
        R.emit(f"const int32_t {j} = {j_expr};")
        R.emit(f"kf::mbarrier_wait_parity({bars} + {j} % {S}, (uint32_t)(({j} / {S}) & 1));")
        copies = [t.copy for t in tiles]
        for c in copies:
            b = c.dst.buffer
            R.emit(f"{R.ctype(b.dtype)}* const {R.cname(b)} = {R.cname(b)}_ring + ({j} % {S}) * "
                   f"{prod(b.static_shape())};")
        for x in _body(loop):
            if any(x is c for c in copies):
                continue
            R.stmt(x)
            if isinstance(x, ir.Gemm):  # its wgmma_wait<0> retired the stage's readers: release it
                R.emit(R.release(f"{bars} + {S} + {j} % {S}"))
        R.close()
    else:
        R.open(f"for (int32_t {v} = {start}; {v} < {end}; ++{v})")
        R.emit(f"const int32_t {j} = {j_expr};")
        render_ring_consume(R, loop, tiles, v, start, j, bars, S)
        R.close()
        gemm = next(x for x in _body(loop) if isinstance(x, ir.Gemm))
        R.emit("kf::wgmma_wait<0>();")
        R.emit(f"kf::wgmma_fence_operand({R.buffer_name(gemm.c.buffer)});")
    if base is not None:  # the next tile's iterations continue the count (cuda.persistent)
        R.emit(f"{base} += {end} - {start};")
        return
    R.emit(block_sync)
    if producer:
        R.open(f"if ({R.tid} == {ws.leader})")
        n = 2 * S + (cuda_seesaw.BARRIERS if seesaw else 0)
        R.emit(f"for (int kf_s = 0; kf_s < {n}; ++kf_s) kf::mbarrier_inval({bars} + kf_s);")
        R.close()
