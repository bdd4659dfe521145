"""FlashMLA's two-warpgroup "seesaw" for an attention loop on sm_90a: a CUDA schedule of the
``T.Pipelined`` loop ``scores = Q K^T; mask; T.online_softmax; P = scores; acc_o *= rescale;
acc_o += P V`` that the kernel writes once as a sequential program (``kernels/mla_decode``).

Why a schedule and not the loop as written: with 8 warps on one 64-row block, the loop as written
splits every KV tile's 64 x N scores over the two warpgroups along N (each issues
``HGMMA.64x(N/2)``), and the block meets at a barrier between the scores, the softmax and the
output product, so the tensor cores idle while the softmax runs.  Here each math warpgroup takes
alternate KV tiles whole (warpgroup ``w`` the tiles ``j = w, w + 2, ...``: scores with
N = ``block_N`` >= 64 per warpgroup) and keeps its half of the output (``acc_o``'s layout already
gives warpgroup ``w`` the columns ``w * dim_v / 2 ..``).  Tile ``j``'s softmax needs the running max
after tile ``j - 1``, which the other warpgroup computed: the maxima form one chain that alternates
between the warpgroups, and while one runs its softmax the other runs its products.

Per own tile ``j`` (stage ``j % 2`` of the two-stage ring that the producer warpgroup of
:mod:`warp_specialize` fills), warpgroup ``w``:

1. waits for the stage, runs the loop's tile fix-ups (MLA zeroes KV rows past the sequence) on its
   128 threads, and computes its scores ``S_j`` (the loop's own gemm statements, rendered for one
   warpgroup's accumulator layout) and masks them;
2. folds the other warpgroup's tile ``j - 1`` into its output half: waits for that tile's
   publication (``pub[1 - w]``), reads the running max ``m_{j-1}`` and the tile's rescale factor
   from shared memory, ``acc_o *= rescale; l *= rescale``, and issues ``acc_o += P_{j-1} V_{j-1}``
   without waiting for it;
3. runs the loop's ``T.online_softmax`` on ``S_j`` from ``m_{j-1}`` while that product runs on the
   tensor cores (its own ``l`` is a partial row sum: every tile rescales it, only its own tiles
   add to it), then waits for the product and releases the stage;
4. publishes ``P_j`` for the other warpgroup (the loop's copy to the P tile), ``m_j`` and the
   rescale factor, and arrives on ``pub[w]``;
5. ``acc_o *= rescale; acc_o += P_j V_j`` with ``P_j`` from its registers (register-A wgmma:
   the scores' accumulator layout is the A fragment layout), then releases the stage.

After the loop a warpgroup folds the last tile if the other owns it, and the two partial sums are
added.  In exact arithmetic every output half sees the sequential loop's updates in the same order
(``O = O * r_j + P_j V_j`` for j = 0, 1, ...) and ``l`` is the same sum split in two, so the
interpreter and host backends keep running the loop as written; float32 rounding of ``l`` differs.

Shared memory: one ``P`` tile (the loop's own), the running max and rescale factor of the last
published tile, and the two partial sums (``EXCHANGE_FLOATS``); the softmax needs no scratch (a
warp owns whole rows).  One slot of each suffices because its only reader is the next writer: the
P tile and the factors of tile ``j`` are read by the other warpgroup alone (its own product takes
``P_j`` from registers), which writes tile ``j + 1``'s after reading them.  Barriers beside the
ring's full/empty pairs: ``pub[2]``, 128 arrivals each.  The output's TMA-store staging reuses the
drained KV stages (:func:`drained_stage`): at d_v 512 its 64 KB tile would not fit beside the ring.
Not done: issuing the next tile's scores before the own product's wait (each warpgroup still
waits for its scores before the fold, and for its own product before the next tile).
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, replace
from math import prod
from typing import Optional

from kernforge import dtypes
from kernforge.codegen import ir
from kernforge.backends.cuda import gemm as cuda_gemm
from kernforge.backends.cuda.layouts import AccumLayout, RowLayout

WARPGROUP = 128
BARRIERS = 2  # pub[2]
EXCHANGE_FLOATS = 4 * 64  # m and rescale of the last published tile, the two partial row sums
WG_BARRIER = 2  # named barriers 2 and 3: one warpgroup's own (1 is the consumers')


@dataclass(frozen=True)
class Seesaw:
    """The statements of one attention loop in their roles (``plan_seesaw``)."""

    loop: ir.For
    fixups: tuple  # statements after the ring copies that rewrite landed ring tiles
    scores: tuple  # the gemms into the scores (the first clears them)
    mask: tuple  # element maps over the scores
    softmax: ir.OnlineSoftmax
    publish: ir.Copy  # scores -> the P tile
    rescale: tuple  # element maps acc_o *= rescale
    pv: ir.Gemm  # acc_o += P V
    scores_layout: AccumLayout  # one warpgroup's layout of the whole scores tile

    @property
    def out(self) -> ir.Buffer:
        return self.pv.c.buffer


def _body(loop: ir.For) -> tuple:
    return loop.body.body if isinstance(loop.body, ir.Seq) else (loop.body,)


def _writes(s: ir.Stmt) -> set:
    out = {n.buffer for n in ir.nodes(s) if isinstance(n, (ir.Store, ir.Atomic))}
    out |= {n.dst.buffer for n in ir.nodes(s) if isinstance(n, (ir.Copy, ir.Fill))}
    return out


def _whole(c: ir.Copy) -> bool:
    return (all(isinstance(x, ir.Const) and x.value == 0 for x in (*c.src.starts, *c.dst.starts))
            and c.src.extents == c.src.buffer.static_shape() == c.dst.extents == c.dst.buffer.static_shape())


def _reads_fragments(s: ir.Stmt, layouts) -> bool:
    return any(isinstance(n, (ir.Load, ir.Store)) and n.buffer in layouts.registers for n in ir.nodes(s))


def plan_seesaw(kernel: ir.Kernel, wgmma: bool, tma_loops: dict, layouts) -> Optional[Seesaw]:
    """The kernel's attention loop as a :class:`Seesaw`, or None.  Conditions (each one a reason the
    schedule would not be the loop's meaning): sm_90a wgmma; two warpgroups; not persistent; the
    only pipelined loop is a two-stage TMA ring of whole-tile boxes; its body, besides the ring copies and
    barriers, is exactly: fix-ups writing only ring tiles (no fragment: they run on one
    warpgroup), scores gemms (wgmma, the first clearing), element maps writing only the scores,
    the online softmax of the scores, the copy of the scores to a shared bf16 P tile (the
    register-A wgmma is bf16), element maps writing only the output, and one wgmma
    ``acc_o += P V`` with V a ring tile; the scores are 64 x N (64 <= N <= 256) and the output a
    64-row accumulator whose two warp columns are the two warpgroups; the softmax's row vectors
    are in the rows' layout."""
    if not wgmma or kernel.threads != 2 * WARPGROUP or len(tma_loops) != 1 or kernel.attrs.get("persistent_schedule"):
        return None  # (a persistent tile loop would carry the ring's counts over tiles: not rendered here)
    loop, tiles = next(iter(tma_loops.items()))
    if loop.num_stages != 2 or any(t.layout == "core" for t in tiles):
        return None
    if sum(1 for n in ir.nodes(kernel.body) if isinstance(n, ir.For) and n.kind == ir.LoopKind.PIPELINED) != 1:
        return None
    ring_copies = [t.copy for t in tiles]
    ring = {c.dst.buffer for c in ring_copies}
    rest = [s for s in _body(loop) if not any(s is c for c in ring_copies) and not isinstance(s, ir.Sync)]
    i = 0
    fixups = []
    while i < len(rest) and not isinstance(rest[i], ir.Gemm):
        s = rest[i]
        if not _writes(s) or not _writes(s) <= ring or _reads_fragments(s, layouts) or any(
                isinstance(n, (ir.Gemm, ir.OnlineSoftmax, ir.Reduce, ir.Cumsum, ir.Copy)) for n in ir.nodes(s)):
            return None
        fixups.append(s)
        i += 1
    gemms = []
    while i < len(rest) and isinstance(rest[i], ir.Gemm) and (not gemms or rest[i].c.buffer is gemms[0].c.buffer):
        gemms.append(rest[i])
        i += 1
    if not gemms or not gemms[0].clear_accum:
        return None
    scores = gemms[0].c.buffer
    mask = []
    while i < len(rest) and isinstance(rest[i], ir.Parallel) and _writes(rest[i]) == {scores}:
        mask.append(rest[i])
        i += 1
    tail = rest[i:]
    if len(tail) < 3 or not isinstance(tail[0], ir.OnlineSoftmax) or not isinstance(tail[1], ir.Copy):
        return None
    softmax, publish, pv = tail[0], tail[1], tail[-1]
    if softmax.scores is not scores or publish.src.buffer is not scores or not isinstance(pv, ir.Gemm):
        return None
    out = pv.c.buffer
    rescale = tail[2:-1]
    if not all(isinstance(s, ir.Parallel) and _writes(s) == {out} for s in rescale):
        return None
    if (pv.clear_accum or pv.a.buffer is not publish.dst.buffer or pv.b.buffer not in ring or pv.trans_a
            or publish.dst.buffer.scope != ir.Scope.SHARED or publish.dst.buffer.dtype != dtypes.bfloat16
            or not _whole(publish)):
        return None
    if any(layouts.gemm_kind.get(g) != "wgmma" for g in (*gemms, pv)) or any(
            g.b.buffer not in ring or g.a.buffer in ring for g in gemms):
        return None
    lay_s, lay_o = layouts.registers.get(scores), layouts.registers.get(out)
    if not (isinstance(lay_s, AccumLayout) and isinstance(lay_o, AccumLayout) and scores.scope == ir.Scope.FRAGMENT):
        return None
    m, n = lay_s.shape
    if not (m == 64 and 64 <= n <= 256 and n % 8 == 0 and lay_o.m == 64 and lay_o.wm == 4 and lay_o.wn == 2
            and lay_o.warps == 8 and not lay_o.m128 and not lay_s.m128):
        return None
    wg = AccumLayout(64, n, 4, 1, 4)
    if any(layouts.registers.get(v) != RowLayout(64, 4) for v in (softmax.row_max, softmax.row_sum, softmax.rescale)):
        return None
    return Seesaw(loop, tuple(fixups), tuple(gemms), tuple(mask), softmax, publish, tuple(rescale), pv, wg)


@contextmanager
def warpgroup_scope(R, sw: Seesaw):
    """Render statements for one warpgroup: thread ids 0..127 of it, block-stride loops over 128
    threads, and the scores in the warpgroup's own accumulator layout (``kf_ss``)."""
    scores = sw.softmax.scores
    saved = (R.tid, R.k, R.plan.registers[scores], R.buf_override.get(scores))
    R.tid, R.k = "kf_wtid", replace(R.k, threads=WARPGROUP)
    R.plan.registers[scores] = sw.scores_layout
    R.buf_override[scores] = "kf_ss"
    try:
        yield
    finally:
        R.tid, R.k, R.plan.registers[scores] = saved[:3]
        if saved[3] is None:
            R.buf_override.pop(scores, None)
        else:
            R.buf_override[scores] = saved[3]


def render_consumer(R, sw: Seesaw, tiles, bars: str, start: str, end: str) -> None:
    """The consumers' side of the ring (both math warpgroups), module docstring steps 1-5."""
    S = 2
    v = R.var_name(sw.loop.var)
    sm = sw.softmax
    m, l, rescale = (R.buffer_name(b) for b in (sm.row_max, sm.row_sum, sm.rescale))
    rows = sw.scores_layout.rows  # m, l and rescale: every warpgroup holds all 64 rows
    pub = f"{bars} + {2 * S}"
    xs = "kf_seesaw_x"  # [0, 64): m, [64, 128): rescale of the last published tile; [128, 256): sums

    def stage(j: str) -> None:  # the ring tiles of stage j % 2, under the loop's names
        for c in (t.copy for t in tiles):
            b = c.dst.buffer
            R.emit(f"{R.ctype(b.dtype)}* const {R.cname(b)} = {R.cname(b)}_ring + (({j}) % {S}) * "
                   f"{prod(b.static_shape())};")

    def per_row(body) -> None:  # body(register, row) for each of the thread's rows
        r = R.fresh("s")
        R.emit("#pragma unroll")
        R.open(f"for (int {r} = 0; {r} < {rows.regs}; ++{r})")
        body(r, rows.row(r, "kf_wtid"))
        R.close()

    def fold(jj: str, in_flight: bool) -> None:  # the other warpgroup's tile jj into this half of the output
        R.open("")
        R.emit(f"kf::mbarrier_wait_parity({pub} + (1 - kf_wg), (uint32_t)((({jj}) / 2) & 1));")
        per_row(lambda r, row: R.emit(f"{m}[{r}] = {xs}[{row}]; {rescale}[{r}] = {xs}[64 + {row}]; "
                                      f"{l}[{r}] *= {rescale}[{r}];"))
        for s in sw.rescale:
            R.stmt(s)
        stage(jj)
        R.wgmma_keep = int(in_flight)  # left in flight: the softmax runs while it multiplies
        R.stmt(sw.pv)
        R.wgmma_keep = 0
        if not in_flight:
            R.emit(R.release(f"{bars} + {S} + ({jj}) % {S}"))
        R.close()

    R.open("")
    R.emit(f"const int kf_wg = {R.tid} >> 7, kf_wtid = {R.tid} & 127;")
    R.emit(f"float* const {xs} = reinterpret_cast<float*>(kf_smem + {R.seesaw_offset});")
    R.emit(f"float kf_ss[{sw.scores_layout.regs}];")
    j = R.fresh("j")
    R.open(f"for (int32_t {v} = {start} + kf_wg; {v} < {end}; {v} += 2)")
    R.emit(f"const int32_t {j} = {v} - {start};")
    R.emit(f"kf::mbarrier_wait_parity({bars} + {j} % {S}, (uint32_t)(({j} / {S}) & 1));")
    R.open("")
    stage(j)
    with warpgroup_scope(R, sw):
        if sw.fixups:
            for s in sw.fixups:
                R.stmt(s)
            R.emit(f"kf::fence_proxy_async(); kf::named_barrier_sync({WG_BARRIER} + kf_wg, {WARPGROUP});")
        for g in sw.scores:
            R.stmt(g)
        for s in sw.mask:
            R.stmt(s)
    R.close()
    R.open(f"if ({j} > 0)")
    fold(f"{j} - 1", in_flight=True)
    R.close()
    with warpgroup_scope(R, sw):
        R.stmt(sm)
    # the fold's product has read P (about to be overwritten) and its stage: every warp's wait,
    # then the warpgroup's barrier, as a stage is released only once all its readers waited
    R.emit("kf::wgmma_wait<0>();")
    R.emit(f"kf::wgmma_fence_operand({R.buffer_name(sw.out)});")
    R.emit(f"kf::named_barrier_sync({WG_BARRIER} + kf_wg, {WARPGROUP});")
    R.open(f"if ({j} > 0)")
    R.emit(R.release(f"{bars} + {S} + ({j} - 1) % {S}"))
    R.close()
    with warpgroup_scope(R, sw):
        R.stmt(sw.publish)
    per_row(lambda r, row: R.emit(f"if ((kf_wtid & 3) == 0) {{ {xs}[{row}] = {m}[{r}]; "
                                  f"{xs}[64 + {row}] = {rescale}[{r}]; }}"))
    R.emit("kf::fence_proxy_async();")
    R.emit(f"kf::mbarrier_arrive({pub} + kf_wg);")
    R.open("")
    R.emit(f"uint32_t kf_pa[{sw.scores_layout.n // 16}][4];")
    R.emit("kf::wgmma_accum_to_a_bf16(kf_ss, kf_pa);")  # before the rescale: no register write after the fence
    for s in sw.rescale:
        R.stmt(s)
    stage(j)
    cuda_gemm.render_wgmma_register_a(R, sw.pv, "kf_pa")
    R.close()
    R.emit(R.release(f"{bars} + {S} + {j} % {S}"))
    R.close()
    # the last tile, when the other warpgroup owns it (or this one owned none)
    n = R.fresh("n")
    R.emit(f"const int32_t {n} = {end} - {start};")
    R.open(f"if ({n} > 0 && (({n} - 1) & 1) != kf_wg)")
    fold(f"{n} - 1", in_flight=False)
    R.close()
    # l = the two partial sums
    per_row(lambda r, row: R.emit(f"if ((kf_wtid & 3) == 0) {xs}[128 + kf_wg * 64 + {row}] = {l}[{r}];"))
    R.barrier()
    per_row(lambda r, row: R.emit(f"{l}[{r}] = {xs}[128 + {row}] + {xs}[192 + {row}];"))
    R.close()


def drained_stage(R) -> Optional[tuple[int, int]]:
    """(offset, bytes) of the seesaw ring's largest tile (all its stages): shared memory the
    output's TMA-store staging may reuse, as FlashMLA stages its output in its drained KV buffers.
    Why it is free then: every consumer leaves the ring through the block barrier at its exit,
    after every stage's loads have landed and been read; the producer issues the next loads only
    after the block barrier at a ring's entry, which the consumers reach after the epilogue (its
    TMA store's reads are waited for before the consumers' next barrier).  None without a seesaw,
    or in a persistent kernel (its epilogue defers that wait)."""
    if R.seesaw is None or R.persistent is not None:
        return None
    tiles = [c.dst.buffer for c in R.pipes.prefetch[R.seesaw.loop]]
    b = max(tiles, key=lambda t: prod(t.static_shape()) * t.dtype.itemsize)
    return R.smem_offsets[b], prod(b.static_shape()) * b.dtype.itemsize * R.seesaw.loop.num_stages


def render_barrier_init(R, bars: str, stages: int) -> None:
    """The producer leader's extra barriers (after the ring's full and empty pairs)."""
    R.emit(f"for (int kf_s = 0; kf_s < {BARRIERS}; ++kf_s) kf::mbarrier_init({bars} + {2 * stages} + kf_s, "
           f"{WARPGROUP});")
