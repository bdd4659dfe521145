"""Readable text for IR nodes (``repr`` of every node, and ``--dump-ir`` output)."""
from __future__ import annotations

from kernforge.codegen import ir


def format_expr(e: ir.Expr) -> str:
    if isinstance(e, ir.Const):
        if e.dtype.is_float or e.dtype.bits == 64 or e.dtype.kind == "uint":
            return f"{e.dtype}({e.value})"
        return repr(e.value)
    if isinstance(e, ir.Var):
        return e.name
    if isinstance(e, ir.Binary):
        if e.op in (ir.Op.MAX, ir.Op.MIN, ir.Op.POW):
            return f"{e.op.value}({format_expr(e.a)}, {format_expr(e.b)})"
        return f"({format_expr(e.a)} {e.op.value} {format_expr(e.b)})"
    if isinstance(e, ir.Unary):
        if e.op == ir.Op.NEG:
            return f"-{format_expr(e.a)}"
        if e.op == ir.Op.NOT:
            return f"~{format_expr(e.a)}"
        return f"{e.op.value}({format_expr(e.a)})"
    if isinstance(e, ir.Cast):
        return f"cast<{e.dtype}>({format_expr(e.a)})"
    if isinstance(e, ir.Bitcast):
        return f"bitcast<{e.dtype}>({format_expr(e.a)})"
    if isinstance(e, ir.Select):
        return f"select({format_expr(e.cond)}, {format_expr(e.a)}, {format_expr(e.b)})"
    if isinstance(e, ir.Load):
        return f"{e.buffer.name}[{', '.join(format_expr(i) for i in e.indices)}]"
    if isinstance(e, ir.Shuffle):
        return f"shfl_{e.kind}({format_expr(e.value)}, {format_expr(e.arg)}, width={e.width}, lane={e.thread.name})"
    return f"<{type(e).__name__}>"


def _lines(s: ir.Stmt, depth: int) -> list[str]:
    pad = "  " * depth
    if isinstance(s, ir.Seq):
        return [line for x in s.body for line in _lines(x, depth)]
    if isinstance(s, ir.Allocate):
        return [f"{pad}alloc {s.buffer!r}"]
    if isinstance(s, ir.For):
        extra = f", num_stages={s.num_stages}" if s.kind == ir.LoopKind.PIPELINED else ""
        head = f"{pad}for {s.var.name} in {s.kind.value}({format_expr(s.start)}, +{format_expr(s.extent)}{extra}):"
        return [head] + _lines(s.body, depth + 1)
    if isinstance(s, ir.Parallel):
        names = ", ".join(v.name for v in s.vars)
        return [f"{pad}for {names} in parallel{s.extents}:"] + _lines(s.body, depth + 1)
    if isinstance(s, ir.If):
        out = [f"{pad}if {format_expr(s.cond)}:"] + _lines(s.then, depth + 1)
        if s.orelse is not None:
            out += [f"{pad}else:"] + _lines(s.orelse, depth + 1)
        return out
    if isinstance(s, ir.Store):
        idx = ", ".join(format_expr(i) for i in s.indices)
        return [f"{pad}{s.buffer.name}[{idx}] = {format_expr(s.value)}"]
    if isinstance(s, ir.Copy):
        return [f"{pad}copy {s.src!r} -> {s.dst!r}" + (" (disable_tma=True)" if s.disable_tma else "")]
    if isinstance(s, ir.Fill):
        return [f"{pad}fill {s.dst!r} = {format_expr(s.value)}"]
    if isinstance(s, ir.Gemm):
        flags = f"trans_a={s.trans_a}, trans_b={s.trans_b}, clear_accum={s.clear_accum}"
        if s.policy is not None:
            flags += f", policy={s.policy.name}"
        return [f"{pad}gemm {s.a!r} @ {s.b!r} -> {s.c!r} ({flags})"]
    if isinstance(s, ir.Reduce):
        return [f"{pad}{s.op.value} {s.src.name} -> {s.dst.name} dim={s.dim} clear={s.clear}"]
    if isinstance(s, ir.Cumsum):
        return [f"{pad}cumsum {s.src.name} -> {s.dst.name} dim={s.dim} reverse={s.reverse}"]
    if isinstance(s, ir.OnlineSoftmax):
        return [f"{pad}online_softmax {s.scores.name} max={s.row_max.name} sum={s.row_sum.name} "
                f"rescale={s.rescale.name} scale_log2={format_expr(s.scale_log2)}"]
    if isinstance(s, ir.RadixFindBucket):
        return [f"{pad}radix_find_bucket {s.hist.name} -> {s.above.name} need={s.need.name} "
                f"bucket={s.bucket.name}"]
    if isinstance(s, ir.Sync):
        return [f"{pad}sync {s.scope}"]
    if isinstance(s, ir.Check):
        idx = ", ".join(format_expr(i) for i in s.indices)
        return [f"{pad}check #{s.site} {format_expr(s.cond)} else {s.kind} {s.name}[{idx}]"]
    if isinstance(s, ir.Atomic):
        idx = ", ".join(format_expr(i) for i in s.indices)
        line = f"{s.op.value} {s.buffer.name}[{idx}] <- {format_expr(s.value)}"
        if s.result is not None:  # fetch-and-op: the previous value goes to result
            line = f"{s.result.name}[{', '.join(format_expr(i) for i in s.result_indices)}] = {line}"
        return [pad + line]
    return [f"{pad}<{type(s).__name__}>"]


def format_stmt(s: ir.Stmt) -> str:
    return "\n".join(_lines(s, 0))


def format_kernel(k: ir.Kernel) -> str:
    params = ", ".join(repr(p) if isinstance(p, ir.Buffer) else f"{p.dtype} {p.name}" for p in k.params)
    grid = ", ".join(format_expr(g) for g in k.grid)
    blocks = ", ".join(v.name for v in k.block_vars)
    head = [f"kernel {k.name}({params})", f"  grid({grid}) threads={k.threads} as ({blocks})"]
    if k.attrs:
        head.append(f"  attrs {k.attrs}")
    return "\n".join(head + _lines(k.body, 1))
