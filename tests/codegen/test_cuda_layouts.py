"""Fragment layouts: every element owned exactly once, and the accumulator is the mma/wgmma layout.

The layouts print C expressions; the tests evaluate those very strings in
Python (all operands are non-negative, so C ``/`` is Python ``//``), so what
is checked is what the generated kernels compute.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernforge.backends.cuda.layouts import AccumLayout, RowLayout, StripedLayout, accum_layout, striped_layout


def _py(expr: str):
    return compile(expr.replace("/", "//").replace("&&", " and "), "<layout>", "eval")


def _eval(expr: str, **env) -> int:
    return int(eval(_py(expr), {}, env))  # noqa: S307 - our own integer expressions


def _owners(layout, threads: int) -> np.ndarray:
    """count[element] over all (thread, register) pairs that hold it and pass the layout's guard."""
    count = np.zeros(layout.shape, dtype=np.int64)
    guard = layout.valid("r", "tid")
    guard = _py(guard) if guard is not None else None
    coords = [_py(c) for c in layout.coords("r", "tid")]
    for tid in range(threads):
        for r in range(layout.regs):
            env = {"r": r, "tid": tid}
            if guard is not None and not eval(guard, {}, env):  # noqa: S307
                continue
            count[tuple(eval(c, {}, env) for c in coords)] += 1  # noqa: S307
    return count


@pytest.mark.parametrize("shape,threads,itemsize", [((64, 32), 128, 2), ((7, 5), 32, 4), ((256,), 128, 4),
                                                    ((3, 4, 8), 64, 1)])
def test_striped_layout_owns_each_element_once(shape, threads, itemsize):
    lay = striped_layout(shape, threads, itemsize)
    assert (_owners(lay, threads) == 1).all()


def test_striped_layout_runs_are_16_bytes_when_rows_allow():
    assert striped_layout((64, 32), 128, 2).vec == 8
    assert striped_layout((64, 6), 128, 2).vec == 2
    lay = StripedLayout((64, 32), 128, 8)
    # thread 1's first run starts right after thread 0's: coalesced 16-byte accesses
    assert _eval(lay.flat("0", "1")) == 8 and _eval(lay.flat("7", "1")) == 15


@pytest.mark.parametrize("m,n,threads,wgmma", [(128, 128, 128, True), (64, 32, 256, True), (16, 16, 256, False),
                                               (64, 64, 128, False), (48, 24, 128, False)])
def test_accum_layout_owns_each_element_once(m, n, threads, wgmma):
    lay = accum_layout(m, n, threads, wgmma)
    assert lay is not None
    assert (_owners(lay, threads) == 1).all()


def test_accum_layout_is_the_mma_c_fragment():
    """Lane L of a warp holds D(L/4 + 8*(q/2), 2*(L%4) + q%2) of each 16x8 atom (PTX ISA m16n8 C layout)."""
    lay = AccumLayout(m=32, n=16, wm=2, wn=1, warps=2)
    for tid in range(64):
        warp, lane = divmod(tid, 32)
        for r in range(lay.regs):
            mi, ni, q = r // (lay.nt * 4), (r // 4) % lay.nt, r % 4
            row = mi * 16 * lay.wm + warp * 16 + lane // 4 + 8 * (q // 2)
            col = ni * 8 + 2 * (lane % 4) + q % 2
            assert [_eval(c, r=r, tid=tid) for c in lay.coords("r", "tid")] == [row, col]


def test_wgmma_layout_gives_each_warpgroup_64_contiguous_rows():
    lay = accum_layout(128, 64, 256, wgmma=True)
    assert lay.wm % 4 == 0
    for group in range(lay.used_warps // 4):
        rows = {_eval(lay.coords("r", "tid")[0], r=r, tid=tid)
                for tid in range(group * 128, group * 128 + 128) for r in range(0, lay.nt * 4)}
        assert len(rows) == 64 and max(rows) - min(rows) == 63 and min(rows) % 64 == 0


def test_row_layout_matches_its_accumulator_rows():
    """The row value a thread reads for accumulator register r sits in its own RowLayout register."""
    acc = accum_layout(64, 96, 256, wgmma=False)
    rows = acc.rows
    assert rows == RowLayout(64, acc.wm)
    for tid in range(acc.used_warps * 32):
        for r in range(acc.regs):
            s = _eval(acc.row_reg("r"), r=r)
            assert _eval(rows.coords("s", "tid")[0], s=s, tid=tid) == _eval(acc.coords("r", "tid")[0], r=r, tid=tid)


def test_row_layout_primary_threads_cover_each_row_once():
    rows = RowLayout(64, 2)
    seen = np.zeros(64, dtype=int)
    for tid in range(256):
        if _eval(rows.primary("tid"), tid=tid):
            for s in range(rows.regs):
                seen[_eval(rows.coords("s", "tid")[0], s=s, tid=tid)] += 1
    assert (seen == 1).all()


@given(m=st.sampled_from([16, 32, 48, 64, 128, 256]), n=st.sampled_from([8, 16, 24, 64, 128, 512]),
       warps=st.sampled_from([1, 2, 4, 8]), wgmma=st.booleans())
def test_accum_layout_choice_respects_instruction_limits(m, n, warps, wgmma):
    lay = accum_layout(m, n, warps * 32, wgmma)
    if lay is None:
        assert wgmma or m % 16 or n % 8  # mma.sync always finds an arrangement for 16x8 multiples
        return
    assert lay.used_warps <= warps and lay.mt * 16 * lay.wm == m and lay.nt * 8 * lay.wn == n
    if wgmma:
        assert lay.wm % 4 == 0 and m % 64 == 0 and n // lay.wn <= 256
