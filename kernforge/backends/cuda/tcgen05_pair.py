"""sm_100a 2-CTA MMA in the generated GEMMs: the plan (``tcgen05.mma.cta_group::2``, issue 21 item 6).

Why: DeepGEMM's SM100 GEMMs run one ``M = 256`` MMA over a cluster of two CTAs.  Each CTA holds
its own 128 rows of A but only half of the B tile, so a pair reads each B tile from L2 once
instead of twice, and one instruction does the work of two ``M = 128`` ones.

The shape, per CTA, is the single-CTA ``M = 128`` kernel's (``tcgen05.plan_m128``): a 128-row
block whose accumulator ``128 x BN`` lives in the CTA's own TMEM, row r in lane r (PTX data-path
layout A for the pair is layout D's lane map), so the read-back and every epilogue are unchanged.
What changes (rendered by ``tcgen05`` and ``tma``, decided here):

* the grid's M blocks pair along y (``__cluster_dims__(1, 2, 1)``; the launch rounds y up, so
  the odd CTA of a last, lone M block runs with a zero-filled A box and stores nothing);
* B's map boxes ``BN / 2`` rows: CTA r loads rows ``r * BN / 2 ..`` of the pair's B tile into the
  *start* of its own stage (the same offset in both CTAs, as the pair MMA's B descriptor needs),
  not multicast; its full barrier expects its A box plus that half;
* the even CTA's thread 0 issues one ``M = 256, N = BN`` MMA per K step (``*_cg2`` forms) once
  its own stage landed and the odd CTA, whose stage landed too, arrived on its ``ready`` barrier
  (a remote arrive); it commits with multicast 0b11, so the MMA barrier of *both* CTAs completes
  and every thread of each waits on its own (that wait frees the ring stage and, after the loop,
  the TMEM columns for the read-back);
* TMEM is allocated and freed by one warp of each CTA together (``.cta_group::2``), with cluster
  barriers after the setup and before the free.

Planned for a gemm of a TMA ring, TMEM-resident (``bf16_gemm_nt``'s) or read back every
iteration (``fp8_gemm``'s per-128-K partial products): otherwise the kernel keeps its single-CTA form and the
program's ``cluster_reason`` says why.  Persistent kernels pair too (the tile scheduler hands
the cluster's CTAs M blocks ``2 unit`` and ``2 unit + 1`` of one N block, ``cuda.persistent``);
block-scaled and warp-specialized kernels are not paired yet (docs/backends/cuda.md, "sm_100a:
2-CTA MMA").
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

from kernforge.codegen import ir
from kernforge.backends.cuda import cluster as cuda_cluster
from kernforge.backends.cuda.arch import arch_info

ATTR = "cta_pair"  # kernel attribute: a factory's ``cta_pair`` parameter asks for the 2-CTA MMA
PAIR_DTYPES = ("bfloat16", "float16", "float8_e4m3")  # kind::f16, kind::f8f6f4 (not block-scaled)


def plan_cluster(kernel: ir.Kernel, arch: str, facts: dict) -> tuple[Optional[cuda_cluster.KernelCluster], str]:
    """The renderer's ``cluster`` analysis: the 2-CTA pair where the kernel asks for it
    (``attrs[ATTR]``) and :func:`plan_pair` accepts it, else ``cuda.cluster``'s multicast plan
    (with the pair's refusal in the reason when neither applies)."""
    pair, why = plan_pair(kernel, arch, facts) if kernel.attrs.get(ATTR) else (None, "")
    if pair is not None:
        return pair, ""
    plan, reason = cuda_cluster.plan_kernel(kernel, arch, facts["tma"][0], facts["warpspec"], facts["persistent"])
    if plan is None and why:
        reason = f"no 2-CTA MMA: {why}" + (f"; {reason}" if reason else "")
    return plan, reason


def plan_pair(kernel: ir.Kernel, arch: str, facts: dict) -> tuple[Optional[cuda_cluster.KernelCluster], str]:
    """A cluster of two CTAs along grid y sharing one ``M = 256`` tcgen05 gemm, or None and why.

    Needs: tcgen05 (sm_100a); the kernel's only gemm a tcgen05 one (PTX: every tcgen05
    instruction of a kernel names the same ``.cta_group``), not block-scaled, on K-major
    bf16/f16/e4m3 tiles, with the ``M = 128`` row order over exactly one 128-row block and ``16 <=
    BN <= 256``, ``BN % 16 == 0`` (the pair's N range); TMEM-resident across a TMA ring, or a
    statement of the ring's body (its sum read back every iteration: the scaled fp8 GEMM's
    partial products), the ring not warp-specialized and run by both CTAs for the same iterations (nothing on the way to it
    depends on ``by``; persistent: both walk the same units, ``cuda.persistent``, but not a walk
    over live row blocks); the ring's tiles exactly A (at ``by``) and B (not at ``by``, in
    one 128B-swizzled row box whose halves are whole swizzle atoms)."""

    if not arch_info(arch).tcgen05:
        return None, f"{arch} has no tcgen05"
    plan, tma_loops = facts["layouts"], facts["tma"][0]
    persistent = facts["persistent"]
    if facts["warpspec"] is not None:
        return None, "a warp-specialized kernel is not paired yet"
    if persistent is not None and persistent.live is not None:
        return None, "a persistent walk over live row blocks does not pair M blocks"
    if len(plan.gemm_kind) != 1 or set(plan.gemm_kind.values()) != {"tcgen05"}:
        return None, "the kernel's gemms are not one tcgen05 gemm (.cta_group must be one per kernel)"
    (g,) = plan.gemm_kind
    lay = plan.registers[g.c.buffer]
    if g in plan.block_scaled or g.a.buffer.dtype.name not in PAIR_DTYPES or g.trans_a or not g.trans_b:
        return None, "only K-major bf16/f16/e4m3 operands are paired (not block-scaled)"
    if not lay.m128 or lay.m != 128 or lay.n % 16 or not 16 <= lay.n <= 256:
        return None, f"a {lay.m} x {lay.n} accumulator is not one M = 128 block of 16..256 columns"
    ring = plan.tmem_resident.get(g) or next((loop for loop in tma_loops if g in _statements(loop)), None)
    if ring is None or ring not in tma_loops:
        return None, "the gemm is not a statement of a TMA ring's body (once per iteration, in both CTAs)"
    by = kernel.block_vars[1] if len(kernel.block_vars) > 1 else None
    if by is None or any(cuda_cluster.uses(e, by) for e in cuda_cluster.control(kernel.body, ring)):
        return None, "the ring's iterations depend on by: the pair would not meet at every barrier"
    tiles = tma_loops[ring]
    byb = {t.copy.dst.buffer: t for t in tiles}
    if len(tiles) != 2 or set(byb) != {g.a.buffer, g.b.buffer}:
        return None, "the ring loads more than the gemm's A and B tiles"
    a, b = byb[g.a.buffer], byb[g.b.buffer]
    if not any(cuda_cluster.uses(s, by) for s in a.copy.src.starts) or \
            any(cuda_cluster.uses(s, by) for s in b.copy.src.starts):
        return None, "A's tile does not follow by, or B's does"
    if b.layout != "swizzled" or b.rows != b.box_rows or b.rows != lay.n:
        return None, "B's tile is not one 128B-swizzled row box of the accumulator's columns"
    half = cuda_cluster.plan_multicast(arch, (1, 2), b.rows, b.box_cols * b.spec.elem_bytes,
                                       swizzle=b.spec.swizzle, axis=1)
    if half.size != 2:
        return None, half.reason
    shared = next(i for i, t in enumerate(tiles) if t is b)
    # persistent: the 1-D launch's clusters span x, and the scheduler hands CTA r M block 2 unit + r
    half = replace(half, pair=True, launch_axis=0 if persistent is not None else half.launch_axis)
    return cuda_cluster.KernelCluster(half, ring, shared), ""


def _statements(loop: ir.For) -> tuple:
    """The statements of ``loop``'s own body (each runs once per iteration)."""
    return loop.body.body if isinstance(loop.body, ir.Seq) else (loop.body,)
