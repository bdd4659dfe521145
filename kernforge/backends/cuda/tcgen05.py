"""sm_100a lowering of ``T.gemm`` to ``tcgen05.mma`` with the accumulator in tensor memory (TMEM).

Why this shape: the rest of the CUDA backend (softmax, row reductions, epilogues) reads an
accumulator from registers in the warpgroup layout of sm_90a's wgmma
(:class:`~kernforge.backends.cuda.layouts.AccumLayout`).  tcgen05's ``M = 64`` data-path layout
(PTX "layout F": row r of the MMA in TMEM lane ``32 * (r / 16) + r % 16``) puts warp ``w % 4`` of a
warpgroup's 16 rows in its own lane quarter, and ``tcgen05.ld.16x256b`` hands them to the warp in
exactly that register layout.  So a tcgen05 gemm is: one thread issues the MMAs of every 64-row
block and warp column into TMEM (``kind::f16``, or ``kind::f8f6f4`` for K-major e4m3 tiles,
``cta_group::1``, UMMA descriptors over the same
128B-swizzled or core-matrix tiles as wgmma), commits them to an mbarrier, every thread waits,
and each warp loads its rows and adds them to (or, with ``clear_accum``, stores them in) its
registers.  The TMEM columns (``LayoutPlan.tmem_columns``) are allocated once per CTA by warp 0
at kernel entry and freed at exit; the kernel's tcgen05 gemms reuse them one after the other.

TMEM-resident accumulators (:func:`plan_resident`): a gemm that is the only tcgen05 gemm of a
loop's body, accumulates (no ``clear_accum``) and whose accumulator nothing else in the loop
touches keeps its partial sum in TMEM across the loop.  Its MMAs start from zero on the loop's
first tile (``enable_input_d`` = a per-entry flag, set after the first tile's MMAs, or a later K
step of the tile) and accumulate onto TMEM on every later tile; each iteration still commits and
waits (the wait is what frees the ring stage the MMAs read), but no warp loads TMEM in the loop:
the sum is added to the registers once, after the loop, if the loop ran at all.

``M = 128`` (:func:`plan_m128`): where every accumulator of the kernel allows it, the accumulators
take a row order in which warp w's rows of each 128-row block are the 32 of its lane quarter
(``AccumLayout.m128``), so one ``M = 128`` MMA (layout D, row r in lane r) per 128-row block and
warp column replaces two ``M = 64`` ones, and ``tcgen05.ld.16x256b`` at lanes ``32 (w % 4)`` and
``+ 16`` returns the warp's two 16-row slices in the usual fragment.

Block-scaled fp8 (:func:`plan_block_scaled`): an fp8 gemm whose K-loop promotion
``C[i, j] += partial[i, j] * sa(i) * sb(j)`` scales by UE8M0 values (``kernels.gemm.ue8m0_value``:
DeepGEMM's SM100 scales) becomes ``tcgen05.mma ... kind::mxf8f6f4.block_scale.scale_vec::1X``
with C's sum resident in TMEM across the loop: each iteration stages the tile's scale bytes in
shared memory (row r of a 128-row block at byte ``(r % 32) * 16 + (r / 32) * 4``), one thread
copies them into TMEM (``tcgen05.cp .32x128b.warpx4``: every lane quarter gets the 32 rows) and
issues the MMAs, which apply ``2^(e - 127)`` per row of A and column of B on the tensor cores;
the promotion loop on the CUDA cores disappears, and C is read back once after the loop.  Scales
packed four K steps to an int32 word (DeepGEMM's) are staged and copied a whole word at a time,
once per four K steps, each step's MMAs selecting their byte with the descriptor's SF ids.

2-CTA MMA (``cta_group::2``, a kernel's ``cta_pair``): planned by :mod:`.tcgen05_pair`, rendered
here by :func:`_render_pair` and the ``_cg2`` setup/teardown (:func:`pair`).  Not done:
block-scaled pairs (and fp8 gemms other than K-major e4m3 keep their bf16 shadow tiles);
docs/backends/cuda.md says what each needs.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from kernforge import dtypes
from kernforge.codegen import ir
from kernforge.backends.cuda.layouts import AccumLayout, RowLayout
from kernforge.backends.cuda.pipeline_plan import _touches
from kernforge.backends.cuda.smem_layouts import SMEM_ALIGN, smem_desc

TMEM_COLUMNS = 512  # tensor memory per CTA on sm_100a: 128 lanes x 512 columns of 32 bits


def tcgen05_columns(lay: AccumLayout) -> int:
    """TMEM columns of a tcgen05 accumulator: one ``M = 64`` MMA (data-path layout F: row r in lane
    32 * (r / 16) + r % 16, so warp w of a warpgroup reads its 16 rows with ``tcgen05.ld.16x256b``
    in the wgmma register layout) per 64-row block and warp column, each ``n / wn`` fp32 columns
    wide: ``m / 64 * n`` in all; with ``lay.m128`` one ``M = 128`` MMA (layout D, row r in lane r)
    per 128-row block: ``m / 128 * n``."""
    return lay.m // (128 if lay.m128 else 64) * lay.n


LD_ATOMS = 8  # 8-column atoms per tcgen05.ld (.x8: 32 registers)


#: operand dtype -> (kind, A/B type code in the instruction descriptor, K per instruction)
KINDS = {dtypes.float16: ("f16", 0, 16), dtypes.bfloat16: ("f16", 1, 16), dtypes.float8_e4m3: ("f8f6f4", 0, 32)}


def instr_desc(m: int, n: int, dtype, mn_major_a: bool, mn_major_b: bool, cta_group: int = 1) -> int:
    """The 32-bit ``kind::f16`` / ``kind::f8f6f4`` instruction descriptor (PTX "Instruction
    descriptor"): D f32 (bits 4-5 = 1), A/B type in bits 7-9 / 10-12 (kind::f16: f16 0, bf16 1;
    kind::f8f6f4: e4m3 0), MN-major (transpose) A bit 15 and B bit 16, N >> 3 in bits 17-22,
    M >> 4 in bits 24-28.  ``cta_group=2`` (a CTA pair, ``kf::tcgen05_mma_*_cg2``): M and N are
    the pair's whole shape, here M = 256 (128 rows per CTA) and N a multiple of 16 in 32..256
    (each CTA holds N / 2 rows of B^T)."""
    if dtype not in KINDS:
        raise ValueError(f"instr_desc: tcgen05 takes bf16, fp16 or e4m3 operands here, not {dtype}")
    if cta_group == 2:
        if m != 256 or n % 16 or not 32 <= n <= 256:
            raise ValueError(f"instr_desc: M = {m}, N = {n} is not a cta_group::2 shape kernforge issues "
                             "(M = 256, N = 32..256 in steps of 16)")
    elif cta_group != 1:
        raise ValueError(f"instr_desc: cta_group must be 1 or 2, got {cta_group}")
    elif m not in (64, 128) or n % (8 if m == 64 else 16) or not 8 <= n <= 256:
        raise ValueError(f"instr_desc: M = {m}, N = {n} is not a cta_group::1 tcgen05.mma shape")
    ab = KINDS[dtype][1]
    return (1 << 4) | (ab << 7) | (ab << 10) | (int(mn_major_a) << 15) | (int(mn_major_b) << 16) | \
        ((n >> 3) << 17) | ((m >> 4) << 24)


def instr_desc_block_scaled(m: int, n: int, sfa_id: int = 0, sfb_id: int = 0) -> int:
    """The 32-bit ``kind::mxf8f6f4.block_scale`` instruction descriptor for e4m3 x e4m3, K-major,
    UE8M0 scales (PTX "Instruction descriptor" for the block-scaled kinds): it has no D-type field
    (D is f32) -- bits 4-5 hold the SFB id instead (which byte of B's 32-bit scale cells this
    instruction uses: the K block of 32 within a packed word of four) -- A/B type e4m3 (0) in
    bits 7-9 / 10-12, N >> 3 in bits 17-22, the scale type in bit 23 (1 = UE8M0), M >> 4 in bits
    24-28 (``cta_group::1`` block scaling is M = 128 only) and the SFA id in bits 29-30."""
    if m != 128 or n % 16 or not 16 <= n <= 256:
        raise ValueError(f"instr_desc_block_scaled: M = {m}, N = {n} is not a cta_group::1 block-scaled shape")
    if not (0 <= sfa_id < 4 and 0 <= sfb_id < 4):
        raise ValueError(f"instr_desc_block_scaled: scale-factor ids {sfa_id}, {sfb_id} are not bytes 0-3")
    return (sfb_id << 4) | ((n >> 3) << 17) | (1 << 23) | ((m >> 4) << 24) | (sfa_id << 29)


@dataclass(frozen=True)
class BlockScaled:
    """A gemm whose promotion ``promotion`` (``acc[i, j] += c[i, j] * sa(i) * sb(j)``, ``sa`` and
    ``sb`` UE8M0 values) runs on the tensor cores: ``sfa`` / ``sfb`` are the scale bytes as
    expressions in the promotion's row / column variable ``i`` / ``j``."""

    promotion: ir.Parallel
    loop: ir.For
    acc: ir.Buffer
    i: ir.Var
    j: ir.Var
    sfa: ir.Expr
    sfb: ir.Expr
    #: ``(sfa word, sfb word, SF id)`` where both bytes are byte ``k % 4`` of a word indexed by
    #: ``k // 4`` (DeepGEMM's packing, :func:`_packed_word`): the words are copied once per four K
    #: steps and each step's MMAs pick their byte by the SF id; None: one byte copied per step
    words: Optional[tuple] = None


def _same(x, y) -> bool:
    """Structural equality of two expressions (variables and buffers by identity)."""
    if isinstance(x, (ir.Var, ir.Buffer)) or isinstance(y, (ir.Var, ir.Buffer)):
        return x is y
    if type(x) is not type(y):
        return False
    if isinstance(x, ir.Const):
        return x.value == y.value and x.dtype == y.dtype
    if isinstance(x, tuple):
        return len(x) == len(y) and all(_same(a, b) for a, b in zip(x, y))
    if not isinstance(x, ir.Expr):
        return x == y
    return all(_same(getattr(x, f), getattr(y, f)) for f in x.__dataclass_fields__)


def _const(e, value) -> bool:
    return isinstance(e, ir.Const) and e.value == value


def match_ue8m0(e: ir.Expr) -> Optional[ir.Expr]:
    """The byte ``b`` if ``e`` is ``kernels.gemm.ue8m0_value``'s decode of it,
    ``bitcast<float32>(b == 0 ? 1 << 22 : b == 255 ? 0x7fc00000 : b << 23)`` (exactly
    ``2^(b - 127)``, NaN at 255, as the tensor cores read a UE8M0 byte); None otherwise."""
    if not (isinstance(e, ir.Bitcast) and e.dtype == dtypes.float32 and isinstance(e.a, ir.Select)):
        return None
    s0 = e.a
    s1 = s0.b
    if not (isinstance(s0.cond, ir.Binary) and s0.cond.op == ir.Op.EQ and _const(s0.cond.b, 0)
            and _const(s0.a, 1 << 22) and isinstance(s1, ir.Select)):
        return None
    byte = s0.cond.a
    if not (isinstance(s1.cond, ir.Binary) and s1.cond.op == ir.Op.EQ and _const(s1.cond.b, 255)
            and _const(s1.a, 0x7FC00000) and isinstance(s1.b, ir.Binary) and s1.b.op == ir.Op.SHL
            and _const(s1.b.b, 23) and _same(s1.cond.a, byte) and _same(s1.b.a, byte)):
        return None
    # the byte itself: ``(word >> s) & 255`` (any expression whose value is in 0..255)
    if not (isinstance(byte, ir.Binary) and byte.op == ir.Op.AND and _const(byte.b, 255)):
        return None
    return byte


def _uses(e: ir.Expr, v) -> bool:
    """Whether expression ``e`` mentions variable or buffer ``v``."""
    return any(x is v or (isinstance(x, ir.Load) and x.buffer is v) for x in ir.nodes(e))


def _promotion(p: ir.Parallel, c: ir.Buffer):
    """``(acc, i, j, sfa byte, sfb byte)`` if ``p`` is ``acc[i, j] = acc[i, j] + c[i, j] * sa * sb``
    with UE8M0 ``sa`` free of ``j`` and ``sb`` free of ``i``; None otherwise."""
    if len(p.vars) != 2 or not isinstance(p.body, ir.Store) or tuple(p.extents) != c.static_shape():
        return None
    i, j = p.vars
    st = p.body
    v = st.value
    if not (len(st.indices) == 2 and st.indices[0] is i and st.indices[1] is j and st.buffer is not c
            and isinstance(v, ir.Binary) and v.op == ir.Op.ADD and isinstance(v.a, ir.Load)
            and v.a.buffer is st.buffer and _same(v.a.indices, (i, j))):
        return None
    m = v.b
    if not (isinstance(m, ir.Binary) and m.op == ir.Op.MUL and isinstance(m.a, ir.Binary) and m.a.op == ir.Op.MUL
            and isinstance(m.a.a, ir.Load) and m.a.a.buffer is c and _same(m.a.a.indices, (i, j))):
        return None
    sfa, sfb = match_ue8m0(m.a.b), match_ue8m0(m.b)
    if sfa is None or sfb is None or _uses(sfa, j) or _uses(sfb, i) or _uses(sfa, c) or _uses(sfb, c):
        return None
    return st.buffer, i, j, sfa, sfb


def _quarters_only(e, v: ir.Var) -> bool:
    """Whether expression ``e`` reads ``v`` only as ``v // 4``: one value for four consecutive
    ``v >= 0`` (a loop's K steps 4p .. 4p + 3)."""
    if isinstance(e, ir.Binary) and e.op == ir.Op.FLOORDIV and e.a is v and _const(e.b, 4):
        return True
    if e is v:
        return False
    if isinstance(e, tuple):
        return all(_quarters_only(x, v) for x in e)
    if isinstance(e, (ir.Var, ir.Buffer)) or not isinstance(e, ir.Expr):
        return True
    return all(_quarters_only(getattr(e, f), v) for f in e.__dataclass_fields__)


def _packed_word(byte: ir.Expr, v: ir.Var) -> Optional[tuple]:
    """``(word, v % 4)`` if the UE8M0 byte is ``(word >> ((v % 4) * 8)) & 255`` with ``word`` reading
    the K loop's ``v`` only as ``v // 4`` (``kernels.gemm.ue8m0_value(SF[.., k // 4], k % 4)``):
    four consecutive K steps read the four bytes of one word; None otherwise."""
    if not (isinstance(byte, ir.Binary) and byte.op == ir.Op.AND and isinstance(byte.a, ir.Binary)
            and byte.a.op == ir.Op.SHR):
        return None
    word, shift = byte.a.a, byte.a.b
    if not (isinstance(shift, ir.Binary) and shift.op == ir.Op.MUL and _const(shift.b, 8)
            and isinstance(shift.a, ir.Binary) and shift.a.op == ir.Op.MOD and shift.a.a is v
            and _const(shift.a.b, 4)):
        return None
    return (word, shift.a) if _quarters_only(word, v) else None


def _references(root, b: ir.Buffer) -> set:
    """The ids of the loads, stores and regions of buffer ``b`` under ``root``."""
    return {id(n) for n in ir.nodes(root) if isinstance(n, (ir.Load, ir.Store, ir.Region)) and n.buffer is b}


def plan_block_scaled(kernel: ir.Kernel, plan) -> dict:
    """``{gemm: BlockScaled}`` for the fp8 gemms whose promotion folds into block-scaled MMAs:
    a tcgen05 gemm of K-major e4m3 tiles with ``M = 128`` blocks (block scaling has no
    ``M = 64``) and one warp column (or 128-column ones: a B scale address starts on a whole
    copy), ``clear_accum``, the only tcgen05 gemm of its loop's body, followed there (barriers
    between are fine) by its promotion (:func:`_promotion`) into an accumulator of the same
    register layout that nothing else in the loop touches, and whose product nothing else reads."""
    out = {}
    for loop in ir.nodes(kernel.body):
        if not isinstance(loop, ir.For):
            continue
        body = loop.body.body if isinstance(loop.body, ir.Seq) else (loop.body,)
        mine = [n for n in ir.nodes(loop.body) if isinstance(n, ir.Gemm) and plan.gemm_kind.get(n) == "tcgen05"]
        if len(mine) != 1 or mine[0] not in body:
            continue
        g = mine[0]
        lay = plan.registers.get(g.c.buffer)
        if not (g.clear_accum and g.a.buffer.dtype == dtypes.float8_e4m3 and not g.trans_a and g.trans_b
                and isinstance(lay, AccumLayout) and lay.m128 and (lay.wn == 1 or (lay.n // lay.wn) % 128 == 0)):
            continue
        t = body.index(g)
        rest = [x for x in body[t + 1:] if not isinstance(x, ir.Sync)]
        if not rest or not isinstance(rest[0], ir.Parallel):
            continue
        found = _promotion(rest[0], g.c.buffer)
        if found is None:
            continue
        acc, i, j, sfa, sfb = found
        if _references(kernel.body, g.c.buffer) != _references(g, g.c.buffer) | _references(rest[0], g.c.buffer) \
                or plan.registers.get(acc) != lay or any(x is not rest[0] and _touches(x, acc) for x in body):
            continue
        wa, wb = _packed_word(sfa, loop.var), _packed_word(sfb, loop.var)
        words = (wa[0], wb[0], wa[1]) if wa and wb else None
        out[g] = BlockScaled(rest[0], loop, acc, i, j, sfa, sfb, words)
    return out


def scale_columns(lay: AccumLayout) -> int:
    """TMEM columns a block-scaled gemm's scale factors take after its accumulator's: four per
    128-row block of A (32 lanes x 4 bytes each: one ``tcgen05.cp .32x128b.warpx4``) and four
    per 128 columns of B."""
    return 4 * (lay.m // 128) + 4 * -(-lay.n // 128)


def staging_bytes(plan) -> int:
    """Shared bytes the block-scaled gemms stage their scale bytes in: 512 per ``tcgen05.cp``."""
    return max((128 * scale_columns(plan.registers[g.c.buffer]) for g in plan.block_scaled), default=0)


def folded(R, p: ir.Parallel) -> bool:
    """Whether ``p`` is a promotion the tensor cores do (the renderer emits nothing for it)."""
    return any(bs.promotion is p for bs in R.plan.block_scaled.values())


def render_setup(R, slot_offset: int) -> None:
    """Kernel entry: warp 0 allocates the TMEM columns and publishes their address through shared
    memory; thread 0 initialises the MMA-completion mbarrier.  A 2-CTA pair (:func:`pair`): warp
    0 of both CTAs allocates together (``_cg2``), thread 0 also initialises the ``ready`` barrier
    the odd CTA arrives on, and a cluster barrier publishes both before any peer touches them."""
    cols = R.plan.tmem_columns()
    cg = "_cg2" if pair(R) else ""
    R.emit(f"uint32_t* const kf_tmem_slot = reinterpret_cast<uint32_t*>(kf_smem + {slot_offset});")
    R.emit(f"uint64_t* const kf_mma_bar = reinterpret_cast<uint64_t*>(kf_smem + {slot_offset + 8});")
    if pair(R):  # the even CTA's: the odd CTA's half of the stage landed
        R.emit(f"uint64_t* const kf_pair_ready = reinterpret_cast<uint64_t*>(kf_smem + {slot_offset + 16});")
    R.open(f"if ({R.tid} < 32)")
    R.emit(f"kf::tmem_alloc{cg}(kf_tmem_slot, {cols});")
    R.emit(f"kf::tmem_relinquish_alloc_permit{cg}();")
    R.close()
    R.open(f"if ({R.tid} == 0)")
    R.emit("kf::mbarrier_init(kf_mma_bar, 1);")
    if pair(R):
        R.emit("kf::mbarrier_init(kf_pair_ready, 1);")
    R.emit("kf::mbarrier_init_fence();")
    R.close()
    R.emit("kf::tcgen05_fence_before();")
    R.emit("kf::cluster_sync();" if pair(R) else "__syncthreads();")
    R.emit("kf::tcgen05_fence_after();")
    R.emit("const uint32_t kf_tmem = *kf_tmem_slot;")
    R.emit("uint32_t kf_mma_phase = 0;")
    if R.plan.block_scaled:  # after the slot's SMEM_ALIGN bytes (renderer.allocate_smem)
        R.emit(f"uint8_t* const kf_sf_stage = reinterpret_cast<uint8_t*>(kf_smem + {slot_offset + SMEM_ALIGN});")


def render_teardown(R) -> None:
    """Kernel exit: once every warp is past its last ``tcgen05.ld``, warp 0 frees the columns (a
    pair: once every warp of both CTAs is, warp 0 of each, together)."""
    R.emit("kf::tcgen05_fence_before();")
    R.emit("kf::cluster_sync();" if pair(R) else "__syncthreads();")
    R.open(f"if ({R.tid} < 32)")
    R.emit("kf::tcgen05_fence_after();")
    R.emit(f"kf::tmem_dealloc{'_cg2' if pair(R) else ''}(kf_tmem, {R.plan.tmem_columns()});")
    R.close()


def plan_m128(kernel: ir.Kernel, plan) -> None:
    """Give every accumulator of ``plan`` tcgen05's ``M = 128`` row order (``AccumLayout.m128``)
    when all of them take it: then each 128-row block is one ``M = 128`` MMA (PTX data-path
    layout D, row r in TMEM lane r), twice the rows per instruction of ``M = 64`` and half the
    TMEM columns.  Kernel-wide because per-row fragments are shared between accumulators of the
    same M; only where every accumulator is a tcgen05 gemm's with warps along M in whole
    warpgroups, 128-row blocks and ``n / wn`` a multiple of 16 (the M = 128 shapes), and no
    online softmax reads one (``kf/softmax.cuh`` indexes rows in the wgmma order)."""
    accs = {b: lay for b, lay in plan.registers.items() if isinstance(lay, AccumLayout)}
    gemms = [g for g in plan.gemm_kind if g.c.buffer in accs]
    if not gemms or any(plan.gemm_kind[g] != "tcgen05" for g in gemms) \
            or any(isinstance(n, ir.OnlineSoftmax) for n in ir.nodes(kernel.body)):
        return
    if any(lay.wm % 4 or lay.m % 128 or (lay.n // lay.wn) % 16 for lay in accs.values()):
        return
    plan.registers = {b: replace(lay, m128=True) if isinstance(lay, (AccumLayout, RowLayout)) else lay
                      for b, lay in plan.registers.items()}


def plan_resident(kernel: ir.Kernel, gemm_kind: dict) -> dict:
    """``{gemm: loop}`` for the tcgen05 gemms whose accumulator stays in TMEM across ``loop``: the
    gemm is a statement of the loop's own body (so it runs once per iteration), it accumulates
    (no ``clear_accum``), no other statement of the body touches its accumulator (a read there
    would need the partial sum in registers) and no other tcgen05 gemm runs in the body (they
    share the TMEM columns)."""
    out = {}
    for loop in ir.nodes(kernel.body):
        if not isinstance(loop, ir.For):
            continue
        body = loop.body.body if isinstance(loop.body, ir.Seq) else (loop.body,)
        mine = [n for n in ir.nodes(loop.body) if isinstance(n, ir.Gemm) and gemm_kind.get(n) == "tcgen05"]
        if len(mine) != 1 or mine[0] not in body or mine[0].clear_accum:
            continue
        g = mine[0]
        if not any(x is not g and _touches(x, g.c.buffer) for x in body):
            out[g] = loop
    return out


def render_resident_loop(R, loop: ir.For, render) -> None:
    """``loop`` holding a TMEM-resident gemm: a flag that its MMAs have written TMEM (the first
    MMA of the loop's first tile must not accumulate onto stale columns), the loop (``render``),
    then the one read-back of the sum into the registers, skipped when the loop ran no
    iteration."""
    g = next(g for g, lp in R.plan.tmem_resident.items() if lp is loop)
    live = R.fresh("tmem_live")
    # every warp's earlier tcgen05.ld are done before the loop's MMAs overwrite the columns; in the
    # loop nothing reads TMEM, so its iterations need no barrier of their own for it
    R.emit("kf::tcgen05_fence_before();")
    R.emit("__syncthreads();")
    R.emit(f"int {live} = 0;  // {R.buffer_name(g.c.buffer)}'s TMEM columns hold this loop's partial sum")
    R.tmem_live[g] = live
    render()
    del R.tmem_live[g]
    R.open(f"if ({live})")
    bs = R.plan.block_scaled.get(g)
    _render_read_back(R, g, "+=", bs.acc if bs is not None else g.c.buffer)
    R.close()


def render_gemm(R, g: ir.Gemm) -> None:
    """``C (+)= A @ B``: MMAs by thread 0, commit -> mbarrier, wait, ``tcgen05.ld`` per warp
    (for a TMEM-resident gemm, :func:`render_resident_loop` reads back once after its loop)."""

    if g in R.plan.block_scaled:
        _render_block_scaled(R, g, R.plan.block_scaled[g])
        return
    if pair(R):
        _render_pair(R, g)
        return
    lay: AccumLayout = R.plan.registers[g.c.buffer]
    a, b = g.a.buffer, g.b.buffer
    K = a.static_shape()[0] if g.trans_a else a.static_shape()[1]
    n = lay.n // lay.wn  # one MMA's N: a warp column
    mma_m = 128 if lay.m128 else 64
    blocks = lay.m // mma_m
    idesc = instr_desc(mma_m, n, a.dtype, g.trans_a, not g.trans_b)
    kind, _, kstep = KINDS[a.dtype]
    live = R.tmem_live.get(g)
    if live is None:  # the previous gemm's tcgen05.ld are done in every warp before these MMAs
        R.emit("kf::tcgen05_fence_before();")
        R.emit("__syncthreads();")
    R.open(f"if ({R.tid} == 0)")
    R.emit("kf::tcgen05_fence_after();")
    R.emit("#pragma unroll")
    R.open(f"for (int kf_kk = 0; kf_kk < {K // kstep}; ++kf_kk)")
    R.emit("#pragma unroll")
    R.open(f"for (int kf_b = 0; kf_b < {blocks}; ++kf_b)")
    R.emit("#pragma unroll")
    R.open(f"for (int kf_wc = 0; kf_wc < {lay.wn}; ++kf_wc)")
    R.emit(f"const int kf_row0 = kf_b * {mma_m};")
    R.emit(f"const int kf_col0 = kf_wc * {n};")
    for var, op, mn0, k_major in (("kf_da", a, "kf_row0", not g.trans_a), ("kf_db", b, "kf_col0", g.trans_b)):
        r, col = (mn0, f"kf_kk * {kstep}") if k_major else (f"kf_kk * {kstep}", mn0)
        R.emit(f"const uint64_t {var} = {smem_desc(R, op, r, col, k_major, umma=True)};")
    accumulate = "kf_kk > 0" if live is None else f"{live} | (kf_kk > 0)"
    R.emit(f"kf::tcgen05_mma_{kind}(kf_tmem + (kf_b * {lay.wn} + kf_wc) * {n}, kf_da, kf_db, {idesc:#010x}u, "
           f"{accumulate});")
    R.close()
    R.close()
    R.close()
    _commit_and_wait(R)
    if live is None:
        _render_read_back(R, g, "=" if g.clear_accum else "+=")
    else:
        R.emit(f"{live} = 1;")


def pair(R) -> bool:
    """Whether the kernel runs its tcgen05 gemm as a 2-CTA pair (``cuda.tcgen05_pair``)."""
    return R.cluster is not None and R.cluster.plan.pair


def _render_pair(R, g: ir.Gemm) -> None:
    """One K step of a pair's TMEM-resident gemm (``cuda.tcgen05_pair``): the odd CTA's thread 0
    tells the even one that its half of the stage landed (remote arrive on ``kf_pair_ready``); the
    even CTA's thread 0 waits for that, issues one ``M = 256, N = BN`` MMA per K step over both
    CTAs' tiles (the same offsets in each) into both TMEMs, and commits with multicast 0b11, so
    every thread of each CTA waits on its own ``kf_mma_bar``, then (a gemm not TMEM-resident)
    reads its rows back.  The ``ready`` arrival also orders the odd CTA's earlier ``tcgen05.ld``
    (the previous iteration's, or a persistent kernel's previous tile's: fence, block barrier,
    arrive) before the MMAs that overwrite its TMEM, so the loop needs no cluster barrier."""

    lay: AccumLayout = R.plan.registers[g.c.buffer]
    a, b = g.a.buffer, g.b.buffer
    kind, _, kstep = KINDS[a.dtype]
    idesc = instr_desc(256, lay.n, a.dtype, False, False, cta_group=2)
    live = R.tmem_live.get(g)
    if live is None:  # this CTA's previous tcgen05.ld are done before the ready arrival (and its MMAs)
        R.emit("kf::tcgen05_fence_before();")
        R.emit("__syncthreads();")
    R.open(f"if ({R.tid} == 0 && (kf_cta_rank & 1u))")
    R.emit("kf::mbarrier_arrive_cluster(kf_pair_ready, kf_cta_rank & ~1u);")
    R.close()
    R.open(f"else if ({R.tid} == 0)")
    R.emit("kf::mbarrier_wait_parity(kf_pair_ready, kf_mma_phase);  // one arrival per K step, as the commits")
    R.emit("kf::tcgen05_fence_after();")
    R.emit("#pragma unroll")
    R.open(f"for (int kf_kk = 0; kf_kk < {a.static_shape()[1] // kstep}; ++kf_kk)")
    R.emit(f"const uint64_t kf_da = {smem_desc(R, a, '0', f'kf_kk * {kstep}', True, umma=True)};")
    R.emit(f"const uint64_t kf_db = {smem_desc(R, b, '0', f'kf_kk * {kstep}', True, umma=True)};")
    accumulate = "kf_kk > 0" if live is None else f"{live} | (kf_kk > 0)"
    R.emit(f"kf::tcgen05_mma_{kind}_cg2(kf_tmem, kf_da, kf_db, {idesc:#010x}u, {accumulate});")
    R.close()
    R.emit("kf::tcgen05_commit_cg2_multicast(kf_mma_bar, 0x3);")
    R.close()
    R.emit("kf::mbarrier_wait_parity(kf_mma_bar, kf_mma_phase);")
    R.emit("kf_mma_phase ^= 1u;")
    R.emit("kf::tcgen05_fence_after();")
    if live is None:
        _render_read_back(R, g, "=" if g.clear_accum else "+=")
    else:
        R.emit(f"{live} = 1;")


def _render_block_scaled(R, g: ir.Gemm, bs: BlockScaled) -> None:
    """One K step of a block-scaled gemm (:func:`plan_block_scaled`; TMEM-resident, so inside
    :func:`render_resident_loop`): every thread stages scale bytes of the tile's rows and columns
    (``i``/``j`` bound to a strided index) in the ``tcgen05.cp`` source layout, then thread 0 copies
    them into the columns after the accumulator's and issues the MMAs, each with its block's
    factors; commit, and every thread waits (the ring stage and the staging bytes are free).

    With packed words (``bs.words``, DeepGEMM's four K blocks per int32) the whole word is staged
    and copied only on a step whose SF id ``k % 4`` is 0 (or the loop's first step), as DeepGEMM
    does: the cell then holds the four K steps' bytes and each step's MMAs select theirs with the
    descriptor's SFA/SFB ids -- one copy, and one staging barrier, per four K steps.  The copies'
    source is free again when a step's wait returns (the commit tracks them with the MMAs)."""

    lay: AccumLayout = R.plan.registers[g.c.buffer]
    a, b = g.a.buffer, g.b.buffer
    K = a.static_shape()[1]
    n = lay.n // lay.wn
    blocks, pieces = lay.m // 128, -(-lay.n // 128)
    sfa_col = tcgen05_columns(lay)
    sfb_col = sfa_col + 4 * blocks
    idesc = instr_desc_block_scaled(128, n)
    live = R.tmem_live[g]
    fresh = None
    if bs.words is not None:
        sf_id, fresh = R.fresh("sf_id"), R.fresh("sf_new")
        R.emit(f"const uint32_t {sf_id} = {R.expr(bs.words[2])};  // this K step's byte of the packed words")
        R.emit(f"const bool {fresh} = {sf_id} == 0u || !{live};  // a new word: stage and copy it")
        idesc_expr = f"{idesc:#010x}u | ({sf_id} << 4) | ({sf_id} << 29)"
        staged = ((bs.i, bs.words[0], lay.m, 0), (bs.j, bs.words[1], lay.n, 512 * blocks))
        R.open(f"if ({fresh})")
    else:
        idesc_expr = f"{idesc:#010x}u"  # SF ids 0: each step stages its own byte
        staged = ((bs.i, bs.sfa, lay.m, 0), (bs.j, bs.sfb, lay.n, 512 * blocks))
    # row r of a 128-row piece: lane r % 32, column r / 32, the 4-byte cell (byte 0 alone, or the word)
    for var, expr, extent, base in staged:
        R.open(f"for (int kf_s = {R.tid}; kf_s < {extent}; kf_s += {R.k.threads})")
        R.var_override[var] = "kf_s"
        cell = f"{base} + (kf_s >> 7) * 512 + (kf_s & 31) * 16 + ((kf_s >> 5) & 3) * 4"
        if fresh is None:
            R.emit(f"kf_sf_stage[{cell}] = static_cast<uint8_t>({R.expr(expr)});")
        else:
            R.emit(f"*reinterpret_cast<uint32_t*>(kf_sf_stage + {cell}) = static_cast<uint32_t>({R.expr(expr)});")
        del R.var_override[var]
        R.close()
    R.barrier()  # with tcgen05 it fences the staged bytes for tcgen05.cp (async proxy) first
    if fresh is not None:
        R.close()
    R.open(f"if ({R.tid} == 0)")
    R.emit("kf::tcgen05_fence_after();")
    R.open(f"if ({fresh})" if fresh is not None else "")
    for piece, col in [(p, sfa_col + 4 * p) for p in range(blocks)] + \
            [(blocks + p, sfb_col + 4 * p) for p in range(pieces)]:
        R.emit(f"kf::tcgen05_cp_32x128b_warpx4(kf_tmem + {col}, "
               f"kf::make_umma_desc(kf_sf_stage + {512 * piece}, 0, 128));")
    R.close()
    R.emit("#pragma unroll")
    R.open(f"for (int kf_kk = 0; kf_kk < {K // 32}; ++kf_kk)")
    R.emit("#pragma unroll")
    R.open(f"for (int kf_b = 0; kf_b < {blocks}; ++kf_b)")
    R.emit("#pragma unroll")
    R.open(f"for (int kf_wc = 0; kf_wc < {lay.wn}; ++kf_wc)")
    R.emit("const int kf_row0 = kf_b * 128;")
    R.emit(f"const int kf_col0 = kf_wc * {n};")
    R.emit(f"const uint64_t kf_da = {smem_desc(R, a, 'kf_row0', 'kf_kk * 32', True, umma=True)};")
    R.emit(f"const uint64_t kf_db = {smem_desc(R, b, 'kf_col0', 'kf_kk * 32', True, umma=True)};")
    R.emit(f"kf::tcgen05_mma_mxf8f6f4_block_scale(kf_tmem + (kf_b * {lay.wn} + kf_wc) * {n}, kf_da, kf_db, "
           f"{idesc_expr}, kf_tmem + {sfa_col} + 4 * kf_b, kf_tmem + {sfb_col} + kf_col0 / 32, "
           f"{live} | (kf_kk > 0));")
    R.close()
    R.close()
    R.close()
    _commit_and_wait(R)
    R.emit(f"{live} = 1;")


def _render_read_back(R, g: ir.Gemm, op: str, target: Optional[ir.Buffer] = None) -> None:
    """Each warp ``tcgen05.ld``s its rows of the accumulator and stores (``=``) or adds (``+=``)
    them into its registers (``target``'s: a block-scaled gemm's sum is its promotion's)."""
    lay: AccumLayout = R.plan.registers[g.c.buffer]
    cn = R.buffer_name(target if target is not None else g.c.buffer)
    n = lay.n // lay.wn
    groups = lay.wm // 4  # warpgroups along M
    R.open("" if lay.used_warps == lay.warps else f"if (({R.tid} >> 5) < {lay.used_warps})")
    R.emit(f"const int kf_warp = {R.tid} >> 5;")
    R.emit(f"const int kf_wr = kf_warp % {lay.wm}, kf_wc = kf_warp / {lay.wm};")
    R.emit("#pragma unroll")
    R.open(f"for (int kf_mi = 0; kf_mi < {lay.mt}; ++kf_mi)")
    if lay.m128:
        # M = 128 (layout D): this warp's slice kf_mi is the (kf_l & 1)-th 16 lanes of its lane
        # quarter in 128-row block kf_l >> 1 (layouts._row)
        R.emit(f"const int kf_l = kf_mi * {groups} + (kf_wr >> 2), kf_b = kf_l >> 1;")
        lanes = "(32 * (kf_warp & 3) + 16 * (kf_l & 1))"
    else:
        # 64-row block of this warp's rows kf_mi * 16 * wm + kf_wr * 16: warpgroup kf_wr / 4 of row step kf_mi
        R.emit(f"const int kf_b = kf_mi * {groups} + (kf_wr >> 2);")
        lanes = "(32 * (kf_warp & 3))"
    # LD_ATOMS 8-column atoms (32 registers) per load: a whole 256-wide row block at once would
    # hold a second copy of the accumulator in registers
    chunk = next(c for c in (LD_ATOMS, 4, 2, 1) if lay.nt % c == 0)
    R.emit("#pragma unroll")
    R.open(f"for (int kf_j = 0; kf_j < {lay.nt // chunk}; ++kf_j)")
    R.emit(f"float kf_t[{chunk * 4}];")
    R.emit(f"kf::tmem_ld_16x256b<{chunk}>(kf_t, kf_tmem + ((uint32_t){lanes} << 16) + "
           f"(kf_b * {lay.wn} + kf_wc) * {n} + kf_j * {chunk * 8});")
    R.emit("kf::tmem_wait_ld();")
    R.emit("#pragma unroll")
    R.emit(f"for (int kf_z = 0; kf_z < {chunk * 4}; ++kf_z) "
           f"{cn}[kf_mi * {lay.nt * 4} + kf_j * {chunk * 4} + kf_z] {op} kf_t[kf_z];")
    R.close()
    R.close()
    R.close()


def _commit_and_wait(R) -> None:
    """Close the elected thread's issue block with a commit to ``kf_mma_bar``; then every thread
    waits: the MMAs are done reading this iteration's shared tiles (their ring stage may be
    refilled) and, for a read-back, done writing TMEM."""
    R.emit("kf::tcgen05_commit(kf_mma_bar);")
    R.close()
    R.emit("kf::mbarrier_wait_parity(kf_mma_bar, kf_mma_phase);")
    R.emit("kf_mma_phase ^= 1u;")
    R.emit("kf::tcgen05_fence_after();")
