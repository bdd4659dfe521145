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

Not done here: the accumulator stays in registers between gemms (a K loop reads TMEM back once
per ``T.gemm``, not once per tile), ``M = 128`` MMAs, 2-CTA MMA and block-scaled fp8 (fp8 gemms
other than K-major e4m3 keep their bf16 shadow tiles).
"""
from __future__ import annotations

from kernforge import dtypes
from kernforge.codegen import ir
from kernforge.backends.cuda.layouts import AccumLayout

MMA_M = 64
LD_ATOMS = 8  # 8-column atoms per tcgen05.ld (.x8: 32 registers)


#: operand dtype -> (kind, A/B type code in the instruction descriptor, K per instruction)
KINDS = {dtypes.float16: ("f16", 0, 16), dtypes.bfloat16: ("f16", 1, 16), dtypes.float8_e4m3: ("f8f6f4", 0, 32)}


def instr_desc(m: int, n: int, dtype, mn_major_a: bool, mn_major_b: bool) -> int:
    """The 32-bit ``kind::f16`` / ``kind::f8f6f4`` instruction descriptor (PTX "Instruction
    descriptor"): D f32 (bits 4-5 = 1), A/B type in bits 7-9 / 10-12 (kind::f16: f16 0, bf16 1;
    kind::f8f6f4: e4m3 0), MN-major (transpose) A bit 15 and B bit 16, N >> 3 in bits 17-22,
    M >> 4 in bits 24-28."""
    if dtype not in KINDS:
        raise ValueError(f"instr_desc: tcgen05 takes bf16, fp16 or e4m3 operands here, not {dtype}")
    if m not in (64, 128) or n % (8 if m == 64 else 16) or not 8 <= n <= 256:
        raise ValueError(f"instr_desc: M = {m}, N = {n} is not a cta_group::1 tcgen05.mma shape")
    ab = KINDS[dtype][1]
    return (1 << 4) | (ab << 7) | (ab << 10) | (int(mn_major_a) << 15) | (int(mn_major_b) << 16) | \
        ((n >> 3) << 17) | ((m >> 4) << 24)


def render_setup(R, slot_offset: int) -> None:
    """Kernel entry: warp 0 allocates the TMEM columns and publishes their address through shared
    memory; thread 0 initialises the MMA-completion mbarrier."""
    cols = R.plan.tmem_columns()
    R.emit(f"uint32_t* const kf_tmem_slot = reinterpret_cast<uint32_t*>(kf_smem + {slot_offset});")
    R.emit(f"uint64_t* const kf_mma_bar = reinterpret_cast<uint64_t*>(kf_smem + {slot_offset + 8});")
    R.open(f"if ({R.tid} < 32)")
    R.emit(f"kf::tmem_alloc(kf_tmem_slot, {cols});")
    R.emit("kf::tmem_relinquish_alloc_permit();")
    R.close()
    R.open(f"if ({R.tid} == 0)")
    R.emit("kf::mbarrier_init(kf_mma_bar, 1);")
    R.emit("kf::mbarrier_init_fence();")
    R.close()
    R.emit("kf::tcgen05_fence_before();")
    R.emit("__syncthreads();")
    R.emit("kf::tcgen05_fence_after();")
    R.emit("const uint32_t kf_tmem = *kf_tmem_slot;")
    R.emit("uint32_t kf_mma_phase = 0;")


def render_teardown(R) -> None:
    """Kernel exit: once every warp is past its last ``tcgen05.ld``, warp 0 frees the columns."""
    R.emit("kf::tcgen05_fence_before();")
    R.emit("__syncthreads();")
    R.open(f"if ({R.tid} < 32)")
    R.emit("kf::tcgen05_fence_after();")
    R.emit(f"kf::tmem_dealloc(kf_tmem, {R.plan.tmem_columns()});")
    R.close()


def render_gemm(R, g: ir.Gemm) -> None:
    """``C (+)= A @ B``: MMAs by thread 0, commit -> mbarrier, wait, ``tcgen05.ld`` per warp."""
    from kernforge.backends.cuda.gemm import smem_desc

    lay: AccumLayout = R.plan.registers[g.c.buffer]
    a, b, c = g.a.buffer, g.b.buffer, g.c.buffer
    K = a.static_shape()[0] if g.trans_a else a.static_shape()[1]
    cn = R.buffer_name(c)
    n = lay.n // lay.wn  # one MMA's N: a warp column
    groups = lay.wm // 4  # warpgroups along M
    blocks = lay.m // MMA_M
    idesc = instr_desc(MMA_M, n, a.dtype, g.trans_a, not g.trans_b)
    kind, _, kstep = KINDS[a.dtype]
    # the previous gemm's tcgen05.ld are done in every warp before these MMAs overwrite the columns
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
    R.emit(f"const int kf_row0 = kf_b * {MMA_M};")
    R.emit(f"const int kf_col0 = kf_wc * {n};")
    for var, op, mn0, k_major in (("kf_da", a, "kf_row0", not g.trans_a), ("kf_db", b, "kf_col0", g.trans_b)):
        r, col = (mn0, f"kf_kk * {kstep}") if k_major else (f"kf_kk * {kstep}", mn0)
        R.emit(f"const uint64_t {var} = {smem_desc(R, op, r, col, k_major, umma=True)};")
    R.emit(f"kf::tcgen05_mma_{kind}(kf_tmem + (kf_b * {lay.wn} + kf_wc) * {n}, kf_da, kf_db, {idesc:#010x}u, "
           "kf_kk > 0);")
    R.close()
    R.close()
    R.close()
    R.emit("kf::tcgen05_commit(kf_mma_bar);")
    R.close()
    R.emit("kf::mbarrier_wait_parity(kf_mma_bar, kf_mma_phase);")
    R.emit("kf_mma_phase ^= 1u;")
    R.emit("kf::tcgen05_fence_after();")
    R.open("" if lay.used_warps == lay.warps else f"if (({R.tid} >> 5) < {lay.used_warps})")
    R.emit(f"const int kf_warp = {R.tid} >> 5;")
    R.emit(f"const int kf_wr = kf_warp % {lay.wm}, kf_wc = kf_warp / {lay.wm};")
    R.emit("#pragma unroll")
    R.open(f"for (int kf_mi = 0; kf_mi < {lay.mt}; ++kf_mi)")
    # 64-row block of this warp's rows kf_mi * 16 * wm + kf_wr * 16: warpgroup kf_wr / 4 of row step kf_mi
    R.emit(f"const int kf_b = kf_mi * {groups} + (kf_wr >> 2);")
    # LD_ATOMS 8-column atoms (32 registers) per load: a whole 256-wide row block at once would
    # hold a second copy of the accumulator in registers
    chunk = next(c for c in (LD_ATOMS, 4, 2, 1) if lay.nt % c == 0)
    R.emit("#pragma unroll")
    R.open(f"for (int kf_j = 0; kf_j < {lay.nt // chunk}; ++kf_j)")
    R.emit(f"float kf_t[{chunk * 4}];")
    R.emit(f"kf::tmem_ld_16x256b<{chunk}>(kf_t, kf_tmem + ((uint32_t)(32 * (kf_warp & 3)) << 16) + "
           f"(kf_b * {lay.wn} + kf_wc) * {n} + kf_j * {chunk * 8});")
    R.emit("kf::tmem_wait_ld();")
    R.emit("#pragma unroll")
    op = "=" if g.clear_accum else "+="
    R.emit(f"for (int kf_z = 0; kf_z < {chunk * 4}; ++kf_z) "
           f"{cn}[kf_mi * {lay.nt * 4} + kf_j * {chunk * 4} + kf_z] {op} kf_t[kf_z];")
    R.close()
    R.close()
    R.close()
