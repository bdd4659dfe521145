"""Fragment layouts on CUDA: which thread holds element ``(i, j)`` of a fragment, in which register.

DESIGN.md §2: every fragment gets one layout, chosen by the op that produces it
(``kernforge.codegen.passes.cuda_layout`` picks them).  A layout maps a thread's
register index ``r`` (a compile-time constant inside an unrolled loop, so the
fragment stays in registers) and the thread id to the element's coordinates.
The renderer prints :meth:`coords` as C expressions; the device library's
headers document the same layouts (``kf/mma.cuh``, ``kf/wgmma.cuh``).

* :class:`StripedLayout` -- copies into a fragment: element ``e`` (row-major
  flat index) of the tile belongs to thread ``(e // vec) % threads``; each
  thread owns runs of ``vec`` contiguous elements (16 bytes when possible).
* :class:`AccumLayout` -- the mma.sync m16n8 / wgmma m64nN accumulator: warps
  tile the ``(M, N)`` tile as ``wm x wn``; warp ``w`` has ``wr = w % wm``,
  ``wc = w // wm``; register ``r = ((mi * nt) + ni) * 4 + q`` holds row
  ``mi*16*wm + wr*16 + lane/4 + 8*(q/2)``, column
  ``wc*(N/wn) + ni*8 + 2*(lane%4) + q%2``.  Four consecutive warps with
  ``wr = 4a..4a+3`` form a wgmma warpgroup covering 64 rows.
* :class:`RowLayout` -- a 1-D ``(M,)`` fragment holding one value per row of
  an AccumLayout (a row reduction's result): register ``s = mi*2 + h`` is row
  ``mi*16*wm + wr*16 + lane/4 + 8*h``, replicated on the 4 lanes of a quad
  and on all ``wn`` warp columns.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod


@dataclass(frozen=True)
class StripedLayout:
    shape: tuple[int, ...]
    threads: int
    vec: int

    @property
    def regs(self) -> int:
        return -(-prod(self.shape) // (self.threads * self.vec)) * self.vec

    @property
    def replicated(self) -> bool:
        return False

    def flat(self, r: str, tid: str) -> str:
        return f"((({r}) / {self.vec}) * {self.threads * self.vec} + ({tid}) * {self.vec} + ({r}) % {self.vec})"

    def coords(self, r: str, tid: str) -> list[str]:
        e = self.flat(r, tid)
        out, inner = [], 1
        for d in reversed(self.shape):
            out.append(f"(({e} / {inner}) % {d})" if inner > 1 else f"({e} % {d})")
            inner *= d
        return list(reversed(out))

    def valid(self, r: str, tid: str) -> str | None:
        """A guard when the last run of registers overhangs the tile."""
        return None if prod(self.shape) % (self.threads * self.vec) == 0 else f"({self.flat(r, tid)} < {prod(self.shape)})"


@dataclass(frozen=True)
class AccumLayout:
    m: int
    n: int
    wm: int
    wn: int

    @property
    def shape(self) -> tuple[int, int]:
        return (self.m, self.n)

    @property
    def mt(self) -> int:
        return self.m // (16 * self.wm)

    @property
    def nt(self) -> int:
        return self.n // (8 * self.wn)

    @property
    def regs(self) -> int:
        return self.mt * self.nt * 4

    @property
    def replicated(self) -> bool:
        return False

    def row(self, mi: str, h: str, tid: str) -> str:
        return (f"(({mi}) * {16 * self.wm} + ((({tid}) >> 5) % {self.wm}) * 16 + ((({tid}) & 31) >> 2) "
                f"+ 8 * ({h}))")

    def coords(self, r: str, tid: str) -> list[str]:
        mi, ni, q = f"(({r}) / {self.nt * 4})", f"((({r}) / 4) % {self.nt})", f"(({r}) & 3)"
        col = (f"(((({tid}) >> 5) / {self.wm}) * {self.n // self.wn} + {ni} * 8 + ((({tid}) & 3) * 2) "
               f"+ ({q} & 1))")
        return [self.row(mi, f"({q} >> 1)", tid), col]

    def valid(self, r: str, tid: str) -> None:
        return None

    def row_reg(self, r: str) -> str:
        """The RowLayout register holding the row of accumulator register ``r``."""
        return f"((({r}) / {self.nt * 4}) * 2 + ((({r}) & 3) >> 1))"


@dataclass(frozen=True)
class RowLayout:
    parent: AccumLayout

    @property
    def shape(self) -> tuple[int]:
        return (self.parent.m,)

    @property
    def regs(self) -> int:
        return self.parent.mt * 2

    @property
    def replicated(self) -> bool:
        return True

    def coords(self, s: str, tid: str) -> list[str]:
        return [self.parent.row(f"(({s}) >> 1)", f"(({s}) & 1)", tid)]

    def valid(self, r: str, tid: str) -> None:
        return None

    def primary(self, tid: str) -> str:
        """The one thread of each replica set that performs side effects."""
        return f"(((({tid}) & 3) == 0) && ((({tid}) >> 5) < {self.parent.wm}))"


Layout = StripedLayout | AccumLayout | RowLayout


def accum_layout(m: int, n: int, threads: int, wgmma: bool) -> AccumLayout | None:
    """The warp arrangement for an ``(m, n)`` accumulator, or None when no
    arrangement of ``threads // 32`` warps tiles it in 16x8 atoms.

    With ``wgmma`` the warps must form whole warpgroups stacked along M in
    groups of four (each wgmma covers 64 rows) and each warp column's width
    must be a legal wgmma N (a multiple of 8 up to 256)."""
    warps = threads // 32
    if threads % 32:
        return None
    best = None
    for wm in range(1, warps + 1):
        if warps % wm:
            continue
        wn = warps // wm
        if m % (16 * wm) or n % (8 * wn):
            continue
        if wgmma and (wm % 4 or n // wn > 256 or m % 64):
            continue
        layout = AccumLayout(m, n, wm, wn)
        # prefer square-ish warp tiles, then more warps along M
        score = (abs(layout.mt * 16 - layout.nt * 8), -wm)
        if best is None or score < best[0]:
            best = (score, layout)
    return None if best is None else best[1]


def striped_layout(shape: tuple[int, ...], threads: int, itemsize: int) -> StripedLayout:
    vec = max(1, 16 // itemsize)
    while vec > 1 and shape[-1] % vec:
        vec //= 2
    return StripedLayout(tuple(shape), threads, vec)
