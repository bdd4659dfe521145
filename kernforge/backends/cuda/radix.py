"""CUDA lowering of radix-select steps to ``kf/radix.cuh``: histogram atomics to
``kf::hist_add_warp``, ``T.radix_find_bucket`` to ``kf::radix_find_bucket``.

A ``Parallel`` map whose whole body is ``atomic_add(hist[d], c)`` on a 1-D int32 tile in
shared memory, optionally under one ``if``, with a constant ``c`` (a radix select's digit
histogram, or any other), adds through warp aggregation: lanes with equal ``d`` meet in
``__match_any_sync`` and one of them adds ``c`` times their number.  On skewed data (a
row's large keys share their top digits) that turns up to 32 atomics on one shared
address into one.  The helper needs every lane of a warp, so the map runs a uniform trip
count over the block (``ceil(n / threads)`` rounds) and out-of-range or unselected
iterations take part with ``pred = false``.
"""
from __future__ import annotations

from math import prod

from kernforge import dtypes
from kernforge.codegen import ir


def _match(R, p: ir.Parallel) -> tuple[ir.Expr | None, ir.Atomic] | None:
    body, cond = p.body, None
    if isinstance(body, ir.If) and body.orelse is None:
        body, cond = body.then, body.cond
    if not isinstance(body, ir.Atomic) or body.op != ir.Op.ATOMIC_ADD:
        return None
    hist = body.buffer
    if hist.ndim != 1 or hist.dtype != dtypes.int32 or not R.is_smem(hist) or hist in R.plan.registers:
        return None
    if not (isinstance(body.value, ir.Const) and R.k.threads % 32 == 0):
        return None
    if any(isinstance(n, ir.Load) and n.buffer in R.plan.registers for n in ir.nodes(p.body)):
        return None  # a register fragment drives its own loop
    return cond, body


def try_histogram(R, p: ir.Parallel) -> bool:
    """Render ``p`` as warp-aggregated histogram increments when it is one (see module doc)."""
    found = _match(R, p)
    if found is None:
        return False
    cond, atomic = found
    R.headers.add("kf/radix.cuh")
    saved = (R.reg_ctx, R.in_parallel)
    R.in_parallel, R.reg_ctx = True, None
    total, threads = prod(p.extents), R.k.threads
    e = R.fresh("e")
    R.open(f"for (int {e} = {R.tid}; {e} < {-(-total // threads) * threads}; {e} += {threads})")
    used = {n for n in ir.nodes(p.body) if isinstance(n, ir.Var)}
    inner = 1
    for v, ext in reversed(list(zip(p.vars, p.extents))):
        if v in used:
            R.emit(f"const int32_t {R.cname(v)} = ({e} / {inner}) % {ext};" if inner > 1
                   else f"const int32_t {R.cname(v)} = {e} % {ext};")
        inner *= ext
    ok = f"{e} < {total}" + (f" && ({R.expr(cond)})" if cond is not None else "")
    R.emit(f"const bool kf_ok = {ok};")
    R.emit(f"kf::hist_add_warp({R.buffer_name(atomic.buffer)}, kf_ok ? (int32_t)({R.expr(atomic.indices[0])}) : 0, "
           f"{int(atomic.value.value)}, kf_ok);")
    R.close()
    R.reg_ctx, R.in_parallel = saved
    return True


def render_find_bucket(R, s: ir.RadixFindBucket) -> None:
    """One call by the whole block (a suffix scan through the block-scan scratch, then a
    warp-parallel count of the buckets that reach ``need``); every thread gets the answer
    in its copy of ``need`` and ``bucket``.  The planner keeps ``hist``/``above`` in shared
    memory; the renderer only takes the op natively when the block is whole warps."""
    R.headers.add("kf/radix.cuh")
    need, bucket = R.buffer_name(s.need), R.buffer_name(s.bucket)
    R.open("")
    R.emit(f"const kf::RadixBucket kf_found = kf::radix_find_bucket<{R.k.threads}>({R.buffer_name(s.hist)}, "
           f"{R.buffer_name(s.above)}, {s.hist.static_shape()[0]}, {need}[0], "
           "reinterpret_cast<int32_t*>(kf_scan_scratch));")
    R.emit(f"{bucket}[0] = kf_found.digit;")
    R.emit(f"{need}[0] = kf_found.need;")
    R.close()  # the helper ends with a barrier (the barrier pass knows)
