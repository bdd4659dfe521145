"""``T.radix_find_bucket``: the "which bucket holds the k-th largest key" step of a radix select.

One call replaces the suffix scan, flagging, count and rank update a radix select writes per
digit, so a backend can lower it as a unit: CUDA calls ``kf::radix_find_bucket`` (a block
scan plus a warp-parallel count); other backends run the primitive spelling
(``codegen/passes/composites.py``), with the same results.
"""
from __future__ import annotations

from kernforge import dtypes
from kernforge.codegen import ir
from kernforge.dsl import builder as B
from kernforge.dsl.handles import TensorHandle, VarHandle


def _int32(x, what: str, loc, var: bool) -> ir.Buffer:
    scopes = (ir.Scope.LOCAL,) if var else (ir.Scope.SHARED, ir.Scope.FRAGMENT)
    if var != isinstance(x, VarHandle) or not isinstance(x, TensorHandle) or x.scope not in scopes:
        kind = "a T.alloc_var" if var else "a shared or fragment tile"
        raise B.error(f"T.radix_find_bucket: {what} must be {kind}, got {x!r}", loc)
    B.current().check_live(x.buffer, loc)
    if x.buffer.dtype != dtypes.int32:
        raise B.error(f"T.radix_find_bucket: {what} {x.name} must be int32, is {x.buffer.dtype}", loc)
    return x.buffer


def radix_find_bucket(hist, above, need, bucket) -> None:
    """Find the digit bucket holding the ``need``-th largest key of a radix select.

    ``hist`` (nb,) counts the keys per digit value; ``above`` (nb,) receives the suffix
    counts ``hist[b] + ... + hist[nb - 1]``; ``bucket`` (a ``T.alloc_var``) receives the
    largest digit whose suffix count reaches ``need`` (-1 if none does) and ``need`` (a
    ``T.alloc_var``) becomes the key's rank inside that bucket.  Exact semantics:
    ``ir.RadixFindBucket``."""
    loc = B.user_loc(2)
    if B.current().inside("parallel"):
        raise B.error("T.radix_find_bucket inside T.Parallel: it is a whole-tile step", loc)
    h, a = _int32(hist, "hist", loc, False), _int32(above, "above", loc, False)
    if h.ndim != 1 or h.static_shape() != a.static_shape() or h is a:
        raise B.error(f"T.radix_find_bucket: hist and above must be two distinct 1-D tiles of one shape, got "
                      f"{h.name}{h.static_shape()} and {a.name}{a.static_shape()}", loc)
    n, b = _int32(need, "need", loc, True), _int32(bucket, "bucket", loc, True)
    if n is b:
        raise B.error("T.radix_find_bucket: need and bucket must be two variables", loc)
    B.current().emit(ir.RadixFindBucket(h, a, n, b, loc))
