"""The cube path of ``T.gemm``: which gemms the Ascend renderer lowers, and the plan of the
MIX kernel they need (docs/backends/ascend.md, templates/include/kf/cube.h).

A gemm's tiles are UB tiles of the AIV (kernforge's tiles all live in UB), and on dav-c220 the
AIC that owns the cube has no UB, so each ``T.gemm`` becomes a request through a GM workspace:
the AIV writes A and B there, the AIC moves them GM -> L1 (Nd2Nz) -> L0A/L0B (LoadData), runs
``Mmad`` into L0C and writes the fp32 product back with ``Fixpipe``; the AIV adds it into C.
On dav-3510 (``Arch.direct_cv``) the data takes the 950's direct paths instead (spec section 2:
"no L0C->UB, no UB->L1 (950 has both)"): the AIV copies A and B from UB into its half of the
AIC's L1 (Nd2Nz, UB -> L1), the AIC's Fixpipe writes the fp32 product into the AIV's UB work
area; only the control words stay in GM (a 96-byte workspace per group: the AIC's scalar unit
reads GM only, and a mode-2 flag carries no value, so the op id an AIV asks for is a GM word).
Both AIVs' operands then live in L1 at once, which the L1 check counts.

What is lowered, and why the rest is not (:func:`gemm_problem`):

* A, B and C are whole static 2-D UB tiles (the renderer copies whole tiles to GM);
* A and B are half, bfloat16 or float32 of one dtype, C is float32 (the cube accumulates fp32);
* fp8 e4m3 operands on dav-3510 (the 950's cube takes fp8 -> fp32; 910B has no fp8);
* K is a multiple of 16 (32 for fp8): whole fractals, so no L1/L0 padding has to be zeroed (K's
  pad would enter every sum); M and N are any: A's rows past M and B's columns past N are padded
  on chip, their garbage lands only in C rows that Fixpipe does not write and in product
  columns (the workspace holds M x 16*ceil(N/16)) that the AIV does not read;
* a transposed operand is 16-bit (LoadData transposes b16 fractals only); float32 runs as
  ``A @ B^T`` (K-major A and B), the only layout whose fractals need no transpose;
* each gemm's operands fit L1 and L0A / L0B / L0C of the arch, else
  :class:`~kernforge.backends.ascend.renderer.AscendCapacityError` names the buffer.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from kernforge import dtypes
from kernforge.backends.ascend import copies
from kernforge.codegen import ir
from kernforge.codegen.passes import ranges

CUBE_DTYPES = (dtypes.float16, dtypes.bfloat16, dtypes.float32)
FP8_CUBE_DTYPES = (dtypes.float8_e4m3,)  # dav-3510: fp8 x fp8 -> fp32
HEADER = 32  # bytes of a workspace control word (one 32-byte block)


def _round(n: int, a: int = 32) -> int:
    return (n + a - 1) // a * a


@dataclass(frozen=True)
class GemmSite:
    """One lowered ``T.gemm``: its op id in the AIC's dispatch and its static shape."""

    op: int
    stmt: ir.Gemm
    dtype: dtypes.DType
    m: int
    n: int
    k: int

    @property
    def elem(self) -> int:
        return self.dtype.itemsize

    def memory(self) -> dict:
        """Bytes per on-chip memory (A at the start of L1, B in its own pool); M and N are
        padded to 16 on chip."""
        mp, np_ = _round(self.m, 16), _round(self.n, 16)
        return {"L1A": mp * self.k * self.elem, "L1B": self.k * np_ * self.elem,
                "L0A": mp * self.k * self.elem, "L0B": self.k * np_ * self.elem, "L0C": mp * np_ * 4}


@dataclass(frozen=True)
class CubePlan:
    """The MIX kernel's gemms and its GM workspace layout (bytes): per group a 32-byte done
    word, then one slot per AIV: [op word][A][B][C fp32]."""

    sites: tuple
    a_off: int
    b_off: int
    c_off: int
    slot_bytes: int
    pools: dict  # memory -> bytes the AIC's TBuf needs (max over the gemms)
    product_bytes: int  # UB scratch for the fp32 product on the AIV
    direct: bool = False  # dav-3510: UB -> L1 and L0C -> UB; the workspace holds control words only

    @property
    def l1_halves(self) -> tuple:
        """Bytes of each AIV's half of the L1 A and B pools on the direct path."""
        return _round(self.pools["L1A"], 512), _round(self.pools["L1B"], 512)

    @property
    def group_bytes(self) -> int:
        return HEADER + 2 * self.slot_bytes

    def site(self, s: ir.Gemm) -> GemmSite:
        return next(x for x in self.sites if x.stmt is s)


def _whole_tile(r: ir.Region) -> Optional[tuple]:
    """The static 2-D shape of a region that is a whole dense UB tile, or None."""
    b = r.buffer
    if not (copies.in_ub(b) and b.is_static and len(b.static_shape()) == 2):
        return None
    shape = b.static_shape()
    starts = [ir.fold(x) for x in r.starts]
    if tuple(r.extents) != shape or not all(isinstance(x, ir.Const) and int(x.value) == 0 for x in starts):
        return None
    strides = [ir.fold(x) for x in b.strides]
    if not all(isinstance(x, ir.Const) for x in strides) or [int(x.value) for x in strides] != [shape[1], 1]:
        return None
    return shape


def gemm_problem(s: ir.Gemm, arch) -> Optional[str]:
    """Why ``s`` cannot take the cube path on ``arch`` (None: it can)."""
    a, b, c = (_whole_tile(r) for r in (s.a, s.b, s.c))
    if a is None or b is None or c is None:
        return "T.gemm operands must be whole 2-D shared/fragment tiles (the cube path copies whole tiles)"
    dt = s.a.buffer.dtype
    allowed = CUBE_DTYPES + (FP8_CUBE_DTYPES if arch.fp8 else ())
    if dt != s.b.buffer.dtype or dt not in allowed:
        return (f"T.gemm of {dt} x {s.b.buffer.dtype}: the cube path on {arch.name} takes "
                f"{', '.join(map(str, allowed))} operands of one dtype")
    if s.c.buffer.dtype != dtypes.float32:
        return f"T.gemm into a {s.c.buffer.dtype} tile: the cube accumulates float32"
    m, k = (a[1], a[0]) if s.trans_a else a
    k2, n = (b[1], b[0]) if s.trans_b else b
    if k != k2 or c != (m, n):
        return f"T.gemm shapes do not agree: A {a}, B {b}, C {c}"
    c0 = max(16, 32 // dt.itemsize)  # a fractal row holds 32 bytes: K is whole fractal rows
    if k % c0:
        return f"T.gemm of K={k}: the cube path needs K a multiple of {c0} (whole fractals)"
    if dt.itemsize != 2 and (s.trans_a or not s.trans_b):
        return (f"T.gemm of {dt} needs A K-major and B N x K (transpose_B=True): LoadData transposes "
                "16-bit fractals only")
    return None


def plan_cube(kernel: ir.Kernel, arch, capacity_error, render_error) -> Optional[CubePlan]:
    """The kernel's gemm sites and workspace, or None when it has no gemm.  Raises
    ``render_error`` (AscendRenderError) for a gemm off the cube path and ``capacity_error``
    (AscendCapacityError) naming the buffer that does not fit L1/L0."""
    sites = []
    for n in ranges.statements(kernel.body):
        if not isinstance(n, ir.Gemm):
            continue
        why = gemm_problem(n, arch)
        if why is not None:
            raise render_error(f"ascend: {why}", n.loc)
        m, k = n.a.buffer.static_shape()[::-1] if n.trans_a else n.a.buffer.static_shape()
        sites.append(GemmSite(len(sites) + 1, n, n.a.buffer.dtype, m, n.c.buffer.static_shape()[1], k))
    if not sites:
        return None
    pools = {}
    for site in sites:
        need = site.memory()
        names = {"L1A": site.stmt.a.buffer.name, "L1B": site.stmt.b.buffer.name, "L0A": site.stmt.a.buffer.name,
                 "L0B": site.stmt.b.buffer.name, "L0C": site.stmt.c.buffer.name}
        l1 = _round(need["L1A"], 512) + need["L1B"]
        if arch.direct_cv:  # both AIVs' A and B sit in L1 at once
            l1 = 2 * (_round(need["L1A"], 512) + _round(need["L1B"], 512))
        checks = [("L0A", need["L0A"], arch.l0a, names["L0A"]), ("L0B", need["L0B"], arch.l0b, names["L0B"]),
                  ("L0C", need["L0C"], arch.l0c, names["L0C"]),
                  ("L1", l1, arch.l1, names["L1A"] if need["L1A"] > arch.l1 else names["L1B"])]
        for memory, bytes_, cap, name in checks:
            if bytes_ > cap:
                raise capacity_error(
                    f"ascend {arch.name}: T.gemm needs {bytes_} bytes of {memory} for {name!r} "
                    f"(M={site.m}, N={site.n}, K={site.k}, {site.dtype}), {cap} exist",
                    buffer=name, memory=memory, needed=bytes_, capacity=cap, loc=site.stmt.loc)
        for key, v in need.items():
            pools[key] = max(pools.get(key, 0), v)
    l1 = _round(pools["L1A"], 512) + pools["L1B"]
    if arch.direct_cv:
        l1 = 2 * (_round(pools["L1A"], 512) + _round(pools["L1B"], 512))
    if l1 > arch.l1:  # each gemm fits, their largest A and B together do not: the AIC's pools are shared
        big = max(sites, key=lambda s: s.memory()["L1B"]).stmt.b.buffer.name
        raise capacity_error(f"ascend {arch.name}: the gemms' L1 pools need {l1} bytes, {arch.l1} exist",
                             buffer=big, memory="L1", needed=l1, capacity=arch.l1, loc=sites[0].stmt.loc)
    if arch.direct_cv:  # the slots hold just the op words
        return CubePlan(tuple(sites), 0, 0, 0, HEADER, pools, _round(pools["L0C"]), direct=True)
    a_off = HEADER
    b_off = a_off + _round(max(s.m * s.k * s.elem for s in sites))
    c_off = b_off + _round(max(s.k * s.n * s.elem for s in sites))
    slot = c_off + _round(max(s.m * _round(s.n, 16) * 4 for s in sites))
    return CubePlan(tuple(sites), a_off, b_off, c_off, slot, pools, _round(pools["L0C"]))


def usage(plan: CubePlan) -> list:
    """``(memory, buffer, offset, bytes)`` rows of the AIC's L1/L0 pools, per gemm, for
    ``kernforge build``."""
    rows = []
    for s in plan.sites:
        need = s.memory()
        line = f" (T.gemm #{s.op}, line {s.stmt.loc.line})" if s.stmt.loc else f" (T.gemm #{s.op})"
        if plan.direct:  # AIV 0's half, then AIV 1's, of the A and the B pool
            a_half, b_half = plan.l1_halves
            rows += [("L1", f"{s.stmt.a.buffer.name}{line} AIV {v}", v * a_half, need["L1A"]) for v in (0, 1)]
            rows += [("L1", f"{s.stmt.b.buffer.name}{line} AIV {v}", 2 * a_half + v * b_half, need["L1B"])
                     for v in (0, 1)]
        else:
            rows += [("L1", s.stmt.a.buffer.name + line, 0, need["L1A"]),
                     ("L1", s.stmt.b.buffer.name + line, _round(plan.pools["L1A"], 512), need["L1B"])]
        rows += [("L0A", s.stmt.a.buffer.name + line, 0, need["L0A"]),
                 ("L0B", s.stmt.b.buffer.name + line, 0, need["L0B"]),
                 ("L0C", s.stmt.c.buffer.name + line, 0, need["L0C"])]
    return rows
