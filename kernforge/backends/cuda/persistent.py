"""Persistent tile scheduling on CUDA (``T.persistent``; DeepGEMM's ``scheduler/gemm.cuh``).

A kernel that asks for it (``attrs["persistent_schedule"]``, set by ``T.persistent`` at the author's
choice, which the grouped GEMMs' configuration makes on GPUs) is launched with
``min(#tiles, #SMs)`` CTAs on a 1-D grid; each CTA loops over the logical grid's blocks
``t = blockIdx.x + i * gridDim.x`` in the order of ``kf/persistent.cuh`` (bz-major,
L2-grouped inside one bz, optionally walking only each bz's live row blocks).  The SM count
is a launch-time value (:func:`launch_grid`), never compiled in.

Why it pays: the CTA's set-up is done once, not per tile, and the state of its rings carries
over from one tile to the next:

* every TMA ring's mbarriers are initialised once before the tile loop and invalidated once
  after it (:func:`render_setup`, :func:`render_teardown`), and each ring keeps a running
  iteration count (``kf_ring<i>``) that its stage index and phase parity derive from, so a
  producer warpgroup fills the next tile's first stages (waiting on the *empty* barriers of
  the previous tile's last ones, released by the consumers' first iteration of the next tile)
  while the consumers run the previous tile's epilogue;
* the consumers (the whole block without warp specialization) meet at a block barrier after
  each tile, so no thread's next-tile shared-memory writes (a ring refill, a staged fragment)
  overtake another thread's reads of the previous tile; the producer does not take part (its
  stage reuse is ordered by the empty barriers).

Where it is not rendered (:func:`plan_persistent` returns None and the launch stays one CTA
per block): a release ring without warp specialization (thread 0's refills would need the
empty-barrier bookkeeping of the producer protocol), and a ``live_rows`` buffer the kernel
writes.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Callable, Optional, Sequence

from kernforge import dtypes
from kernforge.codegen import ir

# SMs of the default device of each arch: H100 / H200 (sm_90a), B200 (sm_100a), A100 (sm_80);
# a GPU launcher passes its device's own count instead
DEFAULT_SM_COUNT = {"sm_80": 108, "sm_90a": 132, "sm_100a": 148}


@dataclass(frozen=True)
class PersistentPlan:
    """``l2_group``: row blocks per L2 group; ``live`` / ``block_rows``: the per-bz row counts
    that limit each bz's row blocks (``T.persistent(live_rows=, block_rows=)``), or None / 0."""

    l2_group: int
    live: Optional[ir.Buffer] = None
    block_rows: int = 0


def parse(kernel: ir.Kernel) -> Optional[PersistentPlan]:
    """The kernel's request (``attrs["persistent_schedule"]``: ``l2_group=G[,live=NAME/BLOCK_ROWS]``)."""
    spec = kernel.attrs.get("persistent_schedule")
    if not spec:
        return None
    fields = dict(item.split("=", 1) for item in spec.split(","))
    live, block_rows = None, 0
    if "live" in fields:
        name, rows = fields["live"].rsplit("/", 1)
        live = next((p for p in kernel.buffer_params if p.name == name), None)
        if live is None:
            raise ir.KernelError(f"T.persistent live_rows {name!r} is not a parameter of {kernel.name}", kernel.loc)
        block_rows = int(rows)
    return PersistentPlan(int(fields["l2_group"]), live, block_rows)


def plan_persistent(kernel: ir.Kernel, tma_loops: dict, release: set, warp_spec) -> Optional[PersistentPlan]:
    """The persistent schedule to render, or None where the ring state cannot carry over
    (module docstring)."""
    plan = parse(kernel)
    if plan is None:
        return None
    rings = warp_spec.rings if warp_spec is not None else frozenset()
    if any(loop in release and loop not in rings for loop in tma_loops):
        return None
    if plan.live is not None and any(isinstance(n, (ir.Store, ir.Atomic)) and n.buffer is plan.live
                                     or isinstance(n, (ir.Copy, ir.Fill)) and n.dst.buffer is plan.live
                                     for n in ir.nodes(kernel.body)):
        return None
    return plan


def launch_grid(grid: Sequence[int], sm_count: int, cluster: int = 1, axis: int = 0) -> tuple[int, ...]:
    """The 1-D launch of a persistent kernel whose logical grid is ``grid``: one CTA per SM, or
    one per block when there are fewer blocks (an upper bound on the tiles: the live walk may
    hand out fewer).  With clusters of ``cluster`` CTAs (``cuda.cluster``) a cluster walks units
    of ``cluster`` adjacent blocks along ``axis`` (x, or y for B multicast: ``ceil(n / cluster)``
    units along it), so the launch is whole clusters, at most one CTA per SM."""
    if sm_count < cluster or sm_count < 1:
        raise ValueError(f"sm_count must be a positive number of SMs (at least the cluster's {cluster}), "
                         f"got {sm_count}")
    if cluster > 1:
        units = prod(-(-int(g) // cluster) if i == axis else int(g) for i, g in enumerate(grid))
        return (cluster * max(1, min(units, int(sm_count) // cluster)),)
    return (max(1, min(prod(int(g) for g in grid), int(sm_count))),)


# ---------------------------------------------------------------- rendering


def _leader(R) -> int:
    return R.warp_spec.leader if R.warp_spec is not None else 0


def _cluster(R) -> int:
    """CTAs per cluster (``cuda.cluster``): a cluster's CTAs walk the same tiles at adjacent blocks
    along the cluster's axis (x: they share A; y: they share B)."""
    return R.cluster.plan.size if R.cluster is not None else 1


def _released(R, loop: ir.For) -> bool:
    return R.warp_spec is not None and loop in R.warp_spec.rings


def render_setup(R) -> None:
    """Before the tile loop (every thread): each ring's mbarriers, initialised once by the thread
    that issues its TMA, and its running iteration count (``R.ring_base``)."""
    R.headers.add("kf/persistent.cuh")
    if not R.mbarrier_offsets:
        return
    R.open(f"if ({R.tid} == {_leader(R)})")
    for i, loop in enumerate(R.mbarrier_offsets):
        S = loop.num_stages
        R.emit(f"for (int kf_s = 0; kf_s < {S}; ++kf_s) kf::mbarrier_init(kf_bars{i} + kf_s, 1);")
        if _released(R, loop):
            R.emit(f"for (int kf_s = 0; kf_s < {S}; ++kf_s) kf::mbarrier_init(kf_bars{i} + {S} + kf_s, "
                   f"{R.warp_spec.consumers * _cluster(R)});")  # each CTA of a cluster releases a stage
    R.emit("kf::mbarrier_init_fence();")
    R.close()
    R.emit("kf::cluster_sync();" if _cluster(R) > 1 else "__syncthreads();")
    for i, loop in enumerate(R.mbarrier_offsets):
        R.ring_base[loop] = f"kf_ring{i}"
        R.emit(f"int32_t kf_ring{i} = 0;  // iterations this CTA's ring {i} has run, over all its tiles")


def render_tiles(R, body: Callable[[], None], consumers: bool) -> None:
    """The tile loop around ``body`` (one role's statements); ``consumers``: end each tile with
    the consumers' block barrier (module docstring)."""
    plan: PersistentPlan = R.persistent
    grid = list(R.k.grid) + [ir.as_expr(1)] * (3 - len(R.k.grid))
    nx, ny, nz = (R.cast_to(g, dtypes.int32) for g in grid)
    live = f"(const int32_t*){R.buffer_name(plan.live)}" if plan.live is not None else "nullptr"
    R.emit("int32_t kf_walk_z = 0, kf_walk_base = 0;")
    c = _cluster(R)
    paired = "kf_tby" if c > 1 and R.cluster.plan.axis == 1 else "kf_tbx"
    if c > 1:  # the cluster walks units of c adjacent blocks along its axis; CTA r takes block c * unit + r
        R.open(f"for (int32_t kf_tile = (int32_t)blockIdx.x / {c}; ; kf_tile += (int32_t)gridDim.x / {c})")
        if paired == "kf_tby":
            ny = f"(({ny}) + {c - 1}) / {c}"
        else:
            nx = f"(({nx}) + {c - 1}) / {c}"
    else:
        R.open("for (int32_t kf_tile = (int32_t)blockIdx.x; ; kf_tile += (int32_t)gridDim.x)")
    R.emit("int32_t kf_tbx, kf_tby, kf_tbz;")
    R.emit(f"if (!kf::next_tile(kf_tile, {nx}, {ny}, {nz}, {plan.l2_group}, {live}, {plan.block_rows}, "
           "kf_walk_z, kf_walk_base, kf_tbx, kf_tby, kf_tbz)) break;")
    if c > 1:
        R.emit(f"{paired} = {paired} * {c} + (int32_t)kf_cta_rank;")
    for v, t in zip(R.k.block_vars, ("kf_tbx", "kf_tby", "kf_tbz")):
        R.emit(f"const {R.ctype(v.dtype)} {R.cname(v)} = ({R.ctype(v.dtype)}){t};")
    R.open("")
    body()
    R.close()
    if consumers:
        if R.tmem_slot_offset >= 0:  # order this tile's tensor-memory loads before the next tile's MMAs
            R.emit("kf::tcgen05_fence_before();")
        if R.mbarrier_offsets and not R.uses_wgmma and R.warp_spec is None:
            R.emit("kf::fence_proxy_async();")  # generic reads of a stage before its next TMA fill
        R.barrier()
    R.close()


def render_teardown(R) -> None:
    """After the tile loop: every thread is past its last wait, then the barriers are invalidated."""
    if not R.mbarrier_offsets:
        return
    R.emit("kf::cluster_sync();" if _cluster(R) > 1 else "__syncthreads();")
    R.open(f"if ({R.tid} == {_leader(R)})")
    for i, loop in enumerate(R.mbarrier_offsets):
        n = loop.num_stages * (2 if _released(R, loop) else 1)
        R.emit(f"for (int kf_s = 0; kf_s < {n}; ++kf_s) kf::mbarrier_inval(kf_bars{i} + kf_s);")
    R.close()
