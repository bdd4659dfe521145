"""CUDA lowering of ``T.gemm``: wgmma (sm_90a), tcgen05.mma (sm_100a, :mod:`tcgen05`), mma.sync
m16n8k16 with ldmatrix, or a scalar loop.

Operand tiles are 128B-swizzled or in core-matrix order (:mod:`smem_layouts`), the
accumulator in :class:`~kernforge.backends.cuda.layouts.AccumLayout`; the layout
planner decided which gemm takes which path (``LayoutPlan.gemm_kind``).
"""
from __future__ import annotations

from kernforge import dtypes
from kernforge.codegen import ir
from kernforge.backends.cuda import tcgen05 as cuda_tcgen05
from kernforge.backends.cuda.layouts import AccumLayout
from kernforge.backends.cuda.ops import I32, _add, _vars, _zero
from kernforge.backends.cuda.smem_layouts import smem_desc

def render_gemm(R, g: ir.Gemm) -> None:
    kind = R.plan.gemm_kind[g]
    if kind == "scalar":
        render_scalar_gemm(R, g)
        return
    if kind == "tcgen05":
        cuda_tcgen05.render_gemm(R, g)
        return
    lay: AccumLayout = R.plan.registers[g.c.buffer]
    a, b, c = g.a.buffer, g.b.buffer, g.c.buffer
    K = a.static_shape()[0] if g.trans_a else a.static_shape()[1]
    ab = "bf16" if a.dtype == dtypes.bfloat16 else "f16"
    cn = R.buffer_name(c)
    R.open("" if lay.used_warps == lay.warps else f"if (({R.tid} >> 5) < {lay.used_warps})")
    R.emit(f"const int kf_warp = {R.tid} >> 5;")
    if kind == "mma":
        R.emit(f"const int kf_lane = {R.tid} & 31;")
    R.emit(f"const int kf_wr = kf_warp % {lay.wm}, kf_wc = kf_warp / {lay.wm};")
    if g.clear_accum:
        R.emit("#pragma unroll")
        R.emit(f"for (int kf_z = 0; kf_z < {lay.regs}; ++kf_z) {cn}[kf_z] = 0.0f;")
    an, bn = R.buffer_name(a), R.buffer_name(b)
    a_cols, b_cols = a.static_shape()[1], b.static_shape()[1]

    def core(name, cols, r, col):
        return f"{name} + (((({r}) >> 3) * {cols // 8} + (({col}) >> 3)) * 64 + (({r}) & 7) * 8 + (({col}) & 7))"

    if kind == "wgmma" and a.dtype == dtypes.float8_e4m3:
        render_wgmma_fp8(R, g, lay, K)
        R.close()
        return
    if kind == "wgmma":
        # the operand fences keep arithmetic on the accumulator (zeroing, a softmax rescale) out
        # of the asynchronous region, where ptxas would inject a warpgroup.arrive (C7519)
        R.emit(f"kf::wgmma_fence_operand({cn});")
        R.emit("kf::wgmma_fence();")
        R.emit("#pragma unroll")
        R.open(f"for (int kf_kk = 0; kf_kk < {K // 16}; ++kf_kk)")
        R.emit("#pragma unroll")
        R.open(f"for (int kf_mi = 0; kf_mi < {lay.mt}; ++kf_mi)")
        R.emit(f"const int kf_row0 = kf_mi * {16 * lay.wm} + (kf_wr & ~3) * 16;")
        R.emit(f"const int kf_col0 = kf_wc * {lay.n // lay.wn};")
        # A (M x K, or K x M when trans_a) and B (K x N, or N x K when trans_b): a descriptor at the
        # instruction's first element (mn0, k) in the tile's layout (smem_layouts)
        for var, op, mn0, k_major in (("kf_da", a, "kf_row0", not g.trans_a), ("kf_db", b, "kf_col0", g.trans_b)):
            r, col = (mn0, "kf_kk * 16") if k_major else ("kf_kk * 16", mn0)
            R.emit(f"const uint64_t {var} = {smem_desc(R, op, r, col, k_major)};")
        n = lay.nt * 8
        R.emit(f"kf::wgmma_m64nNk16_f32_{ab}<{n}, {int(g.trans_a)}, {int(not g.trans_b)}>("
               f"*reinterpret_cast<float(*)[{n // 2}]>(&{cn}[kf_mi * {lay.nt * 4}]), kf_da, kf_db, 1);")
        R.close()
        R.close()
        R.emit("kf::wgmma_commit();")
        _wait(R, cn)
        R.close()
        return
    # mma.sync m16n8k16 with ldmatrix from core-matrix tiles
    R.emit("#pragma unroll")
    R.open(f"for (int kf_kk = 0; kf_kk < {K // 16}; ++kf_kk)")
    R.emit(f"uint32_t kf_a[{lay.mt}][4];")
    R.emit(f"uint32_t kf_b[{lay.nt}][2];")
    R.emit("#pragma unroll")
    R.open(f"for (int kf_mi = 0; kf_mi < {lay.mt}; ++kf_mi)")
    R.emit(f"const int kf_row0 = kf_mi * {16 * lay.wm} + kf_wr * 16;")
    if g.trans_a:
        R.emit(f"kf::ldmatrix_x4_trans(kf_a[kf_mi], {core(an, a_cols, 'kf_kk * 16 + (kf_lane & 7) + (kf_lane >> 4) * 8', 'kf_row0 + ((kf_lane >> 3) & 1) * 8')});")
    else:
        R.emit(f"kf::ldmatrix_x4(kf_a[kf_mi], {core(an, a_cols, 'kf_row0 + (kf_lane & 7) + ((kf_lane >> 3) & 1) * 8', 'kf_kk * 16 + (kf_lane >> 4) * 8')});")
    R.close()
    R.emit("#pragma unroll")
    pair = lay.nt % 2 == 0  # two n-atoms per ldmatrix.x4
    step = 2 if pair else 1
    R.open(f"for (int kf_ni = 0; kf_ni < {lay.nt}; kf_ni += {step})")
    R.emit(f"const int kf_col0 = kf_wc * {lay.n // lay.wn} + kf_ni * 8;")
    # matrices: (n-block, k-block) = (0,0), (0,1), (1,0), (1,1) -> b[ni] = {r0, r1}, b[ni+1] = {r2, r3}
    n_hi = " + (kf_lane >> 4) * 8" if pair else ""
    regs = "*reinterpret_cast<uint32_t(*)[4]>(&kf_b[kf_ni][0])" if pair else "kf_b[kf_ni]"
    x = "x4" if pair else "x2"
    if g.trans_b:
        R.emit(f"kf::ldmatrix_{x}({regs}, {core(bn, b_cols, f'kf_col0 + (kf_lane & 7){n_hi}', 'kf_kk * 16 + ((kf_lane >> 3) & 1) * 8')});")
    else:
        R.emit(f"kf::ldmatrix_{x}_trans({regs}, {core(bn, b_cols, 'kf_kk * 16 + (kf_lane & 7) + ((kf_lane >> 3) & 1) * 8', f'kf_col0{n_hi}')});")
    R.close()
    R.emit("#pragma unroll")
    R.open(f"for (int kf_mi = 0; kf_mi < {lay.mt}; ++kf_mi)")
    R.emit("#pragma unroll")
    R.open(f"for (int kf_ni = 0; kf_ni < {lay.nt}; ++kf_ni)")
    R.emit(f"float (&kf_d)[4] = *reinterpret_cast<float(*)[4]>(&{cn}[(kf_mi * {lay.nt} + kf_ni) * 4]);")
    R.emit(f"kf::mma_m16n8k16_f32_{ab}(kf_d, kf_a[kf_mi], kf_b[kf_ni], kf_d);")
    R.close()
    R.close()
    R.close()
    R.close()


def render_wgmma_fp8(R, g: ir.Gemm, lay: AccumLayout, K: int) -> None:
    """Native fp8: ``wgmma m64nNk32 .e4m3`` (``QGMMA``) on the fp8 tiles themselves, both K-major
    (``layout_plan.native_fp8_gemm``), 128B-swizzled or in 8 x 16-byte core-matrix order
    (:mod:`smem_layouts`): a descriptor at (mn0, 32 kk).  Called inside the warp scope
    ``render_gemm`` opened (and closes)."""
    a, b, c = g.a.buffer, g.b.buffer, g.c.buffer
    cn = R.buffer_name(c)
    R.emit(f"kf::wgmma_fence_operand({cn});")
    R.emit("kf::wgmma_fence();")
    R.emit("#pragma unroll")
    R.open(f"for (int kf_kk = 0; kf_kk < {K // 32}; ++kf_kk)")
    R.emit("#pragma unroll")
    R.open(f"for (int kf_mi = 0; kf_mi < {lay.mt}; ++kf_mi)")
    R.emit(f"const int kf_row0 = kf_mi * {16 * lay.wm} + (kf_wr & ~3) * 16;")
    R.emit(f"const int kf_col0 = kf_wc * {lay.n // lay.wn};")
    R.emit(f"const uint64_t kf_da = {smem_desc(R, a, 'kf_row0', 'kf_kk * 32', True)};")
    R.emit(f"const uint64_t kf_db = {smem_desc(R, b, 'kf_col0', 'kf_kk * 32', True)};")
    n = lay.nt * 8
    R.emit(f"kf::wgmma_m64nNk32_f32_e4m3<{n}>(*reinterpret_cast<float(*)[{n // 2}]>(&{cn}[kf_mi * {lay.nt * 4}]), "
           f"kf_da, kf_db, 1);")
    R.close()
    R.close()
    R.emit("kf::wgmma_commit();")
    _wait(R, cn)


def _wait(R, cn: str) -> None:
    """Wait for this gemm's wgmmas, or (inside a release ring, ``R.wgmma_keep == 1``) for all but
    the group just committed: the ring's loop waits for the last one after it ends."""
    R.emit(f"kf::wgmma_wait<{R.wgmma_keep}>();")
    if not R.wgmma_keep:
        R.emit(f"kf::wgmma_fence_operand({cn});")


def render_wgmma_register_a(R, g: ir.Gemm, frags: str) -> None:
    """``g`` (``C += A B``, a 64-row bf16 A) with A from registers: ``frags``, the issuing
    warpgroup's ``uint32_t [K / 16][4]`` fragments (``kf::wgmma_accum_to_a_bf16`` of the accumulator
    that holds A, packed before this call), B from shared memory as :func:`render_gemm` reads it.
    Why: a softmax's probabilities are already in the accumulator layout, which is wgmma's A
    fragment layout, so their product needs no shared-memory round trip (FlashAttention-3's and
    FlashMLA's own-P product; the seesaw, :mod:`kernforge.backends.cuda.seesaw`)."""
    lay: AccumLayout = R.plan.registers[g.c.buffer]
    K = g.a.buffer.static_shape()[0] if g.trans_a else g.a.buffer.static_shape()[1]
    cn = R.buffer_name(g.c.buffer)
    n = lay.nt * 8
    R.open("")
    R.emit(f"const int kf_col0 = ({R.tid} >> 5) / {lay.wm} * {lay.n // lay.wn};")
    R.emit(f"kf::wgmma_fence_operand({cn});")
    R.emit("kf::wgmma_fence();")
    R.emit("#pragma unroll")
    R.open(f"for (int kf_kk = 0; kf_kk < {K // 16}; ++kf_kk)")
    r, col = ("kf_col0", "kf_kk * 16") if g.trans_b else ("kf_kk * 16", "kf_col0")
    R.emit(f"const uint64_t kf_db = {smem_desc(R, g.b.buffer, r, col, g.trans_b)};")
    R.emit(f"kf::wgmma_m64nNk16_f32_bf16_rs<{n}, {int(not g.trans_b)}>(*reinterpret_cast<float(*)[{n // 2}]>"
           f"(&{cn}[0]), {frags}[kf_kk], kf_db, 1);")
    R.close()
    R.emit("kf::wgmma_commit();")
    _wait(R, cn)
    R.close()


def render_scalar_gemm(R, g: ir.Gemm) -> None:
    """``C (+)= A @ B`` element by element (dtypes/shapes the tensor cores do not take)."""
    c = g.c
    shape = c.extents
    vars_ = _vars(R, 2)
    kv = ir.Var(R.fresh("k"), I32)
    K = g.a.extents[0] if g.trans_a else g.a.extents[1]
    i, j = vars_
    aidx = (kv, i) if g.trans_a else (i, kv)
    bidx = (j, kv) if g.trans_b else (kv, j)

    def at(r: ir.Region, idx):
        return tuple(_add(s, x) for s, x in zip(r.starts, idx))

    cidx = at(c, vars_)
    prod_ = ir.binary(ir.Op.MUL, ir.Load(g.a.buffer, at(g.a, aidx)), ir.Load(g.b.buffer, at(g.b, bidx)))
    acc = ir.Store(c.buffer, cidx, ir.cast(ir.binary(ir.Op.ADD, ir.Load(c.buffer, cidx), prod_), c.buffer.dtype))
    body = [ir.For(kv, ir.const(K), acc)]
    if g.clear_accum:
        body.insert(0, ir.Store(c.buffer, cidx, _zero(c.buffer.dtype)))
    R.stmt(ir.Parallel(vars_, tuple(shape), ir.Seq(tuple(body))))
