"""Recognising the branch-free *append* idiom (stream compaction in a serial loop).

The idiom, as the DSL writes it::

    for j in T.serial(n):
        buf_a[cnt] = a(j)
        buf_b[cnt] = b(j)
        cnt = cnt + T.cast(pred(j), "int32")

writes every iteration's values at the counter and advances the counter only
when ``pred`` holds: afterwards ``buf_*[c0 : cnt]`` holds the selected values
in iteration order.  A scalar loop needs a store-to-load chain through ``cnt``
per element; a SIMD target can instead evaluate ``a``, ``b`` and ``pred`` for a
chunk of lanes, compress the selected lanes together and advance ``cnt`` by the
popcount (the CPU renderer does this with AVX-512, see docs/backends/cpu.md).

:func:`match_append` is a pure analysis (it returns a description or ``None``,
never rewrites), so any renderer can use it and fall back to the plain loop.
The conditions make the chunked evaluation observably identical to the scalar
loop, including what the scalar loop leaves at ``buf[cnt]`` after it:

* the body is only ``Store``\\ s at index ``[cnt]`` (``cnt`` a one-element
  local counter, int32) into distinct 1-D on-chip buffers of 2- or 4-byte
  elements, followed by ``cnt = cnt + cast(pred)`` with ``pred`` boolean;
* ``cnt`` is read nowhere else in the body (values and ``pred`` depend only on
  the loop variable and loop-invariant state);
* a value may read an appended buffer only as ``buf[j]`` (in-place
  compaction).  Then the chunked form is exact only while every write position
  trails the read position, which holds when ``cnt <= start`` on entry:
  :attr:`AppendLoop.needs_trailing_counter` tells the renderer to test that at
  run time and run the scalar loop otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from kernforge import dtypes
from kernforge.codegen import ir

_ON_CHIP = (ir.Scope.SHARED, ir.Scope.FRAGMENT, ir.Scope.LOCAL)


@dataclass(frozen=True)
class AppendLoop:
    """A recognised append loop: ``stores[i]`` writes ``stores[i].value`` at ``[counter[0]]``."""
    loop: ir.For
    counter: ir.Buffer
    stores: tuple[ir.Store, ...]
    predicate: ir.Expr
    needs_trailing_counter: bool


def _is_counter_load(e: ir.Expr, counter: ir.Buffer) -> bool:
    return (isinstance(e, ir.Load) and e.buffer is counter and len(e.indices) == 1
            and isinstance(e.indices[0], ir.Const) and e.indices[0].value == 0)


def _counter_of(update: ir.Stmt) -> Optional[tuple[ir.Buffer, ir.Expr]]:
    """``(cnt, pred)`` when ``update`` is ``cnt[0] = cnt[0] + cast<int32>(pred)``."""
    if not isinstance(update, ir.Store):
        return None
    cnt = update.buffer
    if not (cnt.scope == ir.Scope.LOCAL and cnt.dtype == dtypes.int32 and cnt.is_static
            and cnt.static_shape() == (1,) and len(update.indices) == 1
            and isinstance(update.indices[0], ir.Const) and update.indices[0].value == 0):
        return None
    v = update.value
    if not (isinstance(v, ir.Binary) and v.op == ir.Op.ADD):
        return None
    for mine, other in ((v.a, v.b), (v.b, v.a)):
        if (_is_counter_load(mine, cnt) and isinstance(other, ir.Cast)
                and other.dtype == dtypes.int32 and other.a.dtype.is_bool):
            return cnt, other.a
    return None


def match_append(loop: ir.For) -> Optional[AppendLoop]:
    """The append idiom in ``loop`` (see the module docstring), or ``None``."""
    if loop.kind not in (ir.LoopKind.SERIAL, ir.LoopKind.UNROLLED):
        return None
    body = loop.body.body if isinstance(loop.body, ir.Seq) else (loop.body,)
    if len(body) < 2:
        return None
    found = _counter_of(body[-1])
    if found is None:
        return None
    cnt, pred = found
    stores = body[:-1]
    targets = []
    for st in stores:
        if not (isinstance(st, ir.Store) and len(st.indices) == 1 and _is_counter_load(st.indices[0], cnt)):
            return None
        b = st.buffer
        if (b.scope not in _ON_CHIP or b is cnt or len(b.shape) != 1 or b.dtype.itemsize not in (2, 4)
                or any(b is t for t in targets)):
            return None
        targets.append(b)
    in_place = False
    for e in [st.value for st in stores] + [pred]:
        for n in ir.walk(e):
            if not isinstance(n, ir.Load):
                continue
            if n.buffer is cnt:
                return None
            if any(n.buffer is t for t in targets):
                if not (len(n.indices) == 1 and n.indices[0] is loop.var):
                    return None
                in_place = True
    return AppendLoop(loop, cnt, tuple(stores), pred, in_place)
