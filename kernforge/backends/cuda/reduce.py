"""CUDA lowering of reductions and scans.

A row reduction of an accumulator stays in registers: thread-local, then across
the quad with shuffles (``kf::quad_allreduce``), then through a shared scratch
when several warps hold parts of a row.  Any other reduction folds a staged
(shared) source per destination element.  A 1-D shared scan is done by the
whole block (``kf::block_inclusive_scan``); other scans run one thread per line.
"""
from __future__ import annotations

from kernforge import dtypes
from kernforge.codegen import ir
from kernforge.backends.cuda.layouts import AccumLayout
from kernforge.backends.cuda.ops import I32, _vars, _zero

_COMBINE = {ir.Op.REDUCE_MAX: ir.Op.MAX, ir.Op.REDUCE_MIN: ir.Op.MIN, ir.Op.REDUCE_SUM: ir.Op.ADD}
_WARP_OP = {ir.Op.REDUCE_MAX: "kf::MaxOp", ir.Op.REDUCE_MIN: "kf::MinOp", ir.Op.REDUCE_SUM: "kf::SumOp"}


def _identity(op: ir.Op, dt: dtypes.DType) -> str:
    if op == ir.Op.REDUCE_SUM:
        return "0"
    neg = op == ir.Op.REDUCE_MAX
    if dt.is_float:
        return "(-kf_inf<float>())" if neg else "kf_inf<float>()"
    bits = dt.bits
    if dt.kind == "uint":
        return "0" if neg else f"{(1 << bits) - 1}ull"
    return f"({-(1 << (bits - 1)) + 1}ll - 1)" if neg else f"{(1 << (bits - 1)) - 1}ll"


def _warp_path(R, r: ir.Reduce) -> bool:
    src = R.plan.registers.get(r.src)
    return isinstance(src, AccumLayout) and r.dim == 1 and R.plan.registers.get(r.dst) == src.rows


def reduce_scratch_floats(R, r: ir.Reduce) -> int:
    """Shared scratch a row reduction needs to combine warps that share rows."""
    if not _warp_path(R, r):
        return 0
    lay = R.plan.registers[r.src]
    return lay.m * lay.wn if _cross_warp(lay) else 0


def _cross_warp(lay: AccumLayout) -> bool:
    """Rows are shared by several warp columns, or some warps hold no part of them."""
    return lay.wn > 1 or lay.used_warps < lay.warps


def render_reduce(R, r: ir.Reduce) -> None:
    if not _warp_path(R, r):
        render_generic_reduce(R, r)
        return
    lay: AccumLayout = R.plan.registers[r.src]
    ct = "float" if r.src.dtype.is_float else R.ctype(r.src.dtype)
    op, sn, dn = _WARP_OP[r.op], R.buffer_name(r.src), R.buffer_name(r.dst)
    init = _identity(r.op, r.src.dtype)
    R.open("")
    R.emit(f"{ct} kf_part[{lay.mt * 2}];")
    owner = lay.valid("0", R.tid)
    if owner:
        R.open(f"if {owner}")
    R.emit("#pragma unroll")
    R.open(f"for (int kf_s = 0; kf_s < {lay.mt * 2}; ++kf_s)")
    R.emit(f"{ct} kf_v = {init};")
    R.emit("#pragma unroll")
    R.open(f"for (int kf_ni = 0; kf_ni < {lay.nt}; ++kf_ni)")
    R.emit("#pragma unroll")
    R.emit(f"for (int kf_q = 0; kf_q < 2; ++kf_q) kf_v = {op}::apply(kf_v, ({ct}){_as_compute(sn, r.src.dtype)}"
           f"[((kf_s >> 1) * {lay.nt} + kf_ni) * 4 + (kf_s & 1) * 2 + kf_q]));")
    R.close()
    R.emit(f"kf_part[kf_s] = kf::quad_allreduce<{op}>(kf_v);")
    R.close()
    if owner:
        R.close()
    if _cross_warp(lay):
        row = lay.rows.row("kf_s", R.tid)
        # no barrier needed before writing: every use of the scratch ends with one
        R.open(f"if ({owner or 'true'} && ({R.tid} & 3) == 0)")
        R.emit(f"const int kf_wc = ({R.tid} >> 5) / {lay.wm};")
        R.emit("#pragma unroll")
        R.emit(f"for (int kf_s = 0; kf_s < {lay.mt * 2}; ++kf_s) kf_scratch[kf_wc * {lay.m} + {row}] = (float)kf_part[kf_s];")
        R.close()
        R.emit("__syncthreads();")
        R.emit("#pragma unroll")
        R.open(f"for (int kf_s = 0; kf_s < {lay.mt * 2}; ++kf_s)")
        R.emit(f"{ct} kf_v = ({ct})kf_scratch[{row}];")
        R.emit(f"for (int kf_w = 1; kf_w < {lay.wn}; ++kf_w) kf_v = {op}::apply(kf_v, ({ct})kf_scratch[kf_w * {lay.m} + {row}]);")
        R.emit("kf_part[kf_s] = kf_v;")
        R.close()
        R.barrier()
    dt = r.dst.dtype
    R.emit("#pragma unroll")
    R.open(f"for (int kf_s = 0; kf_s < {lay.mt * 2}; ++kf_s)")
    value = "kf_part[kf_s]" if r.clear else f"{op}::apply(({ct}){_as_compute(dn, dt)}[kf_s]), kf_part[kf_s])"
    R.emit(f"{dn}[kf_s] = {_from(value, dt, R)};")
    R.close()
    R.close()


def _as_compute(name: str, dt: dtypes.DType) -> str:
    return f"kf_to_float({name}" if dt.is_low_precision else f"({name}"


def _from(value: str, dt: dtypes.DType, R) -> str:
    return f"kf_from_float<{R.ctype(dt)}>({value})" if dt.is_low_precision else f"({R.ctype(dt)})({value})"


def render_generic_reduce(R, r: ir.Reduce) -> None:
    """Each owner of a destination element folds its line of a shared (or local) source."""
    dst, src = r.dst, r.src
    shape = dst.static_shape()
    vars_ = _vars(R, len(shape))
    kv = ir.Var(R.fresh("k"), I32)
    sidx = list(vars_)
    sidx.insert(r.dim, kv)
    ext = src.static_shape()[r.dim]
    comb = _COMBINE[r.op]
    cur = ir.Load(dst, tuple(vars_))
    step = ir.Store(dst, tuple(vars_), ir.cast(ir.binary(comb, cur, ir.Load(src, tuple(sidx))), dst.dtype))
    body: list[ir.Stmt] = [ir.For(kv, ir.const(ext), step)]
    if r.clear:
        body.insert(0, ir.Store(dst, tuple(vars_), ir.cast(_identity_expr(r.op, src.dtype), dst.dtype)))
    stmt = ir.Seq(tuple(body))
    if dst.scope == ir.Scope.LOCAL:  # every thread computes its own copy
        _serial_nest(R, vars_, shape, stmt)
    else:
        R.stmt(ir.Parallel(vars_, tuple(shape), stmt))


def _identity_expr(op: ir.Op, dt: dtypes.DType) -> ir.Expr:
    if op == ir.Op.REDUCE_SUM:
        return _zero(dt)
    big = op == ir.Op.REDUCE_MIN
    if dt.is_float:
        return ir.const(float("inf") if big else float("-inf"), dtypes.float32)
    if dt.kind == "uint":
        return ir.const((1 << dt.bits) - 1 if big else 0, dt)
    return ir.const((1 << (dt.bits - 1)) - 1 if big else -(1 << (dt.bits - 1)), dt)


def _serial_nest(R, vars_, shape, body: ir.Stmt) -> None:
    for v, e in reversed(list(zip(vars_, shape))):
        body = ir.For(v, ir.const(e), body)
    R.stmt(body)


def block_scan_ok(R, c: ir.Cumsum) -> bool:
    """A 1-D scan of a shared array in a 32/64-bit type: the whole block scans it (kf::block_inclusive_scan)."""
    return (c.src.ndim == 1 and R.is_smem(c.src) and R.is_smem(c.dst) and c.src.dtype == c.dst.dtype
            and not c.src.dtype.is_low_precision and not c.src.dtype.is_bool and c.src.dtype.itemsize >= 4
            and R.k.threads % 32 == 0)


def render_cumsum(R, c: ir.Cumsum) -> None:
    """Inclusive scan: the whole block for a 1-D shared array, else one thread per line."""
    if not R.in_parallel and block_scan_ok(R, c):
        ct = R.ctype(c.src.dtype)
        R.emit(f"kf::block_inclusive_scan<{R.k.threads}>({R.buffer_name(c.src)}, {R.buffer_name(c.dst)}, "
               f"{c.src.static_shape()[0]}, {'true' if c.reverse else 'false'}, "
               f"reinterpret_cast<{ct}*>(kf_scan_scratch));")  # ends with a barrier
        return
    shape = c.src.static_shape()
    ext = shape[c.dim]
    lines = [e for d, e in enumerate(shape) if d != c.dim] or [1]
    vars_ = _vars(R, len(lines))
    kv = ir.Var(R.fresh("k"), I32)
    pos = ir.binary(ir.Op.SUB, ext - 1, kv) if c.reverse else kv
    prev = ir.binary(ir.Op.ADD, pos, 1) if c.reverse else ir.binary(ir.Op.SUB, pos, 1)

    def idx(p):
        out = list(vars_) if len(shape) > 1 else []
        out.insert(c.dim, p)
        return tuple(out)

    cur = ir.Load(c.src, idx(pos))
    run = ir.binary(ir.Op.ADD, ir.Load(c.dst, idx(prev)), cur)
    value = ir.select(ir.binary(ir.Op.EQ, kv, 0), ir.cast(cur, run.dtype), run)
    body = ir.For(kv, ir.const(ext), ir.Store(c.dst, idx(pos), ir.cast(value, c.dst.dtype)))
    if c.dst.scope == ir.Scope.LOCAL:
        _serial_nest(R, vars_, lines, body)
    else:
        R.stmt(ir.Parallel(vars_, tuple(lines), body))
