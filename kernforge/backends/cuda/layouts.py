"""Fragment layouts on CUDA: which thread holds element ``(i, j)`` of a fragment, in which register.

DESIGN.md §2: every fragment gets one layout, chosen by the op that produces it
(``kernforge.backends.cuda.layout_plan`` picks them).  A layout maps a thread's
register index ``r`` (a compile-time constant inside an unrolled loop, so the
fragment stays in registers) and the thread id to the element's coordinates.
The renderer prints :meth:`coords` as C expressions; the device library's
headers document the same layouts (``kf/mma.cuh``, ``kf/wgmma.cuh``).

* :class:`StripedLayout` -- copies into a fragment: element ``e`` (row-major
  flat index) of the tile belongs to thread ``(e // vec) % threads``; each
  thread owns runs of ``vec`` contiguous elements (16 bytes when possible).
* :class:`AccumLayout` -- the mma.sync m16n8 / wgmma m64nN accumulator: the
  first ``wm * wn`` warps tile the ``(M, N)`` tile as ``wm x wn`` (any other
  warps own nothing); warp ``w`` has ``wr = w % wm``, ``wc = w // wm``;
  register ``r = ((mi * nt) + ni) * 4 + q`` holds row
  ``mi*16*wm + wr*16 + lane/4 + 8*(q/2)``, column
  ``wc*(N/wn) + ni*8 + 2*(lane%4) + q%2``.  Four consecutive warps with
  ``wr = 4a..4a+3`` form a wgmma warpgroup covering 64 rows.
* :class:`RowLayout` -- a 1-D ``(M,)`` fragment holding one value per row, in
  the rows' distribution of every accumulator with the same ``M`` and ``wm``:
  register ``s = mi*2 + h`` of every thread of the block is row
  ``mi*16*wm + (w % wm)*16 + lane/4 + 8*h``, replicated on the 4 lanes of a
  quad and on all warps with the same ``w % wm``.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import log2, prod


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
    warps: int  # warps of the block; those past wm * wn own no element
    # rows placed as sm_100a's tcgen05 M = 128 data path hands them out (:func:`_row`)
    m128: bool = False

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
    def used_warps(self) -> int:
        return self.wm * self.wn

    @property
    def replicated(self) -> bool:
        return False

    def coords(self, r: str, tid: str) -> list[str]:
        mi, ni, q = f"(({r}) / {self.nt * 4})", f"((({r}) / 4) % {self.nt})", f"(({r}) & 3)"
        col = (f"(((({tid}) >> 5) / {self.wm}) * {self.n // self.wn} + {ni} * 8 + ((({tid}) & 3) * 2) "
               f"+ ({q} & 1))")
        return [_row(self.wm, mi, f"({q} >> 1)", tid, self.m128), col]

    def valid(self, r: str, tid: str) -> str | None:
        return None if self.used_warps == self.warps else f"((({tid}) >> 5) < {self.used_warps})"

    def row_reg(self, r: str) -> str:
        """The RowLayout register holding the row of accumulator register ``r``."""
        return f"((({r}) / {self.nt * 4}) * 2 + ((({r}) & 3) >> 1))"

    @property
    def rows(self) -> "RowLayout":
        """The layout of a per-row value (a reduction along N) that matches this accumulator."""
        return RowLayout(self.m, self.wm, self.m128)


def _row(wm: int, mi: str, h: str, tid: str, m128: bool = False) -> str:
    """Row of a thread's accumulator rows ``mi`` (16-row step) and ``h`` (upper 8 rows): the
    wgmma / mma.sync order (16-row slice ``mi * wm + warp``), or with ``m128`` (``wm`` a multiple
    of 4, 128-row blocks) tcgen05's M = 128 order, where TMEM lane r holds row r and warp w may
    read only lanes 32 * (w % 4) .. + 31: warp w's ``mi``-th slice is slice ``L & 1`` of its
    lane quarter of block ``L >> 1``, ``L = mi * (wm / 4) + (w % wm) / 4``."""
    lane = f"((({tid}) & 31) >> 2) + 8 * ({h})"
    if not m128:
        return f"(({mi}) * {16 * wm} + ((({tid}) >> 5) % {wm}) * 16 + {lane})"
    block = f"(({mi}) * {wm // 4} + ((({tid}) >> 5) % {wm}) / 4)"
    return f"(({block} >> 1) * 128 + ((({tid}) >> 5) % 4) * 32 + ({block} & 1) * 16 + {lane})"


@dataclass(frozen=True)
class RowLayout:
    m: int
    wm: int
    m128: bool = False  # the rows of an ``AccumLayout(m128=True)``

    @property
    def shape(self) -> tuple[int]:
        return (self.m,)

    @property
    def regs(self) -> int:
        return self.m // (16 * self.wm) * 2

    @property
    def replicated(self) -> bool:
        return True

    def row(self, s: str, tid: str) -> str:
        return _row(self.wm, f"(({s}) >> 1)", f"(({s}) & 1)", tid, self.m128)

    def coords(self, s: str, tid: str) -> list[str]:
        return [self.row(s, tid)]

    def valid(self, r: str, tid: str) -> None:
        return None

    def primary(self, tid: str) -> str:
        """The one thread of each replica set that performs side effects."""
        return f"(((({tid}) & 3) == 0) && ((({tid}) >> 5) < {self.wm}))"


Layout = StripedLayout | AccumLayout | RowLayout


def accum_layout(m: int, n: int, threads: int, wgmma: bool, policy=None) -> AccumLayout | None:
    """The warp arrangement for an ``(m, n)`` accumulator, or None when none tiles it in 16x8 atoms.

    By default (``policy`` None, or ``GemmWarpPolicy.FullRow``) as many warps as possible
    go along M (``wm``: every accumulator with the same M then shares one row
    distribution, so per-row values such as a softmax's running max serve both the
    scores and the output), then along N.  ``FullCol`` puts as many as possible along N
    first; ``Square`` takes, among the arrangements using the most warps, the one whose
    per-warp tile ``(m/wm, n/wn)`` is closest to square (ties: more warps along M).  With
    ``wgmma`` the warps along M come in whole warpgroups (a multiple of 4, 64 rows per
    instruction) and a warp column is at most 256 wide (the largest wgmma N), whatever
    the policy."""
    warps = threads // 32
    if threads % 32 or warps == 0:
        return None

    def ok(wm: int, wn: int) -> bool:
        return not (m % (16 * wm) or (wgmma and (wm % 4 or m % 64)) or n % (8 * wn)
                    or (wgmma and n // wn > 256))

    kind = getattr(policy, "value", None)
    if kind == "full_col":
        for wn in range(min(warps, n // 8), 0, -1):
            for wm in range(warps // wn, 0, -1):
                if ok(wm, wn):
                    return AccumLayout(m, n, wm, wn, warps)
        return None
    if kind == "square":
        cands = [(wm, wn) for wm in range(1, warps + 1) for wn in range(1, warps // wm + 1) if ok(wm, wn)]
        if not cands:
            return None
        used = max(wm * wn for wm, wn in cands)
        wm, wn = min((c for c in cands if c[0] * c[1] == used),
                     key=lambda c: (abs(log2((m / c[0]) / (n / c[1]))), -c[0]))
        return AccumLayout(m, n, wm, wn, warps)
    for wm in range(min(warps, m // 16), 0, -1):
        if m % (16 * wm) or (wgmma and (wm % 4 or m % 64)):
            continue
        for wn in range(warps // wm, 0, -1):
            if n % (8 * wn) or (wgmma and n // wn > 256):
                continue
            return AccumLayout(m, n, wm, wn, warps)
    return None


def striped_layout(shape: tuple[int, ...], threads: int, itemsize: int) -> StripedLayout:
    vec = max(1, 16 // itemsize)
    while vec > 1 and shape[-1] % vec:
        vec //= 2
    return StripedLayout(tuple(shape), threads, vec)
