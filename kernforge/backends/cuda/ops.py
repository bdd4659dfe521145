"""CUDA lowering of each tile statement (the ``render_<stmt>`` handlers of :class:`CudaRenderer`).

Copies, fills, scalar gemms and generic reductions are lowered to element maps
(an ``ir.Parallel`` built here, with the copy's edge semantics as explicit
conditions from the shared mask logic, :func:`kernforge.codegen.passes.masks.element_mask`)
and rendered like an author's ``T.Parallel``: the same code walks a thread's
registers or shares iterations between threads.  Barriers are ``ir.Sync``
statements the barrier pass placed (``cuda/barriers.py``); the handlers here
emit only those of the pipelined ring's own protocol.  Tensor-core gemms,
warp row reductions, ``cp.async`` copies and the pipelined ring are spelled
out here as calls into the device library (``kf/*.cuh``).
"""
from __future__ import annotations

from math import prod
from typing import Optional

from kernforge import dtypes
from kernforge.codegen import arith, ir
from kernforge.codegen.passes import masks
from kernforge.backends.cuda.layouts import AccumLayout, RowLayout
from kernforge.backends.cuda import radix as cuda_radix, tma as cuda_tma, tma_store as cuda_tma_store

I32 = dtypes.int32


# ---------------------------------------------------------------- structure


def render_seq(R, s: ir.Seq) -> None:
    scoped = any(isinstance(x, ir.Allocate) for x in s.body)
    if scoped:
        R.open("")
    for x in s.body:
        R.stmt(x)
    if scoped:
        R.close()


def render_allocate(R, s: ir.Allocate) -> None:
    b = s.buffer
    if b in R.plan.registers:
        R.emit(f"{R.ctype(b.dtype)} {R.cname(b)}[{R.plan.registers[b].regs}];")
    elif b.scope == ir.Scope.LOCAL:
        R.emit(f"{R.ctype(b.dtype)} {R.cname(b)}[{prod(b.static_shape())}];")


def _guarded(R, target: ir.Buffer, line: str) -> None:
    """Emit a side effect on shared/global memory once: thread 0 outside Parallel, the primary
    replica inside a Parallel driven by a replicated layout."""
    if target.scope == ir.Scope.LOCAL or target in R.plan.registers:
        R.emit(line)
    elif not R.in_parallel:
        R.emit(f"if ({R.tid} == 0) {{ {line} }}")
    elif R.reg_ctx is not None and R.reg_ctx[0].replicated:
        R.emit(f"if ({R.reg_ctx[0].primary(R.tid)}) {{ {line} }}")
    else:
        R.emit(line)


def render_sync(R, s: ir.Sync) -> None:
    """A barrier the barrier pass (``cuda/barriers.py``) placed."""
    R.barrier()


def render_store(R, s: ir.Store) -> None:
    ref = R.reg_ref(s.buffer, s.indices) if s.buffer in R.plan.registers else \
        f"{R.buffer_name(s.buffer)}[{R.offset(s.buffer, s.indices)}]"
    _guarded(R, s.buffer, f"{ref} = {R.store_value(s.value, s.buffer.dtype)};")


def render_atomic(R, s: ir.Atomic) -> None:
    fn = "kf::atomic_add" if s.op == ir.Op.ATOMIC_ADD else "kf::atomic_max"
    ref = f"&{R.buffer_name(s.buffer)}[{R.offset(s.buffer, s.indices)}]"
    if s.result is not None:
        _render_fetch(R, s, ref)
        return
    _guarded(R, s.buffer, f"{fn}({ref}, {R.store_value(s.value, s.buffer.dtype)});")


def _render_fetch(R, s: ir.Atomic, ref: str) -> None:
    """A fetch-and-op (``return_prev=True``, thread-level code): each thread runs its own update
    and stores the previous value to its own result element, through the store path (so a
    register-planned result works as any store does).  It is not a side effect to run once: a
    replicated map would hand the value to one replica only, so that is refused."""
    if not R.in_parallel or (R.reg_ctx is not None and R.reg_ctx[0].replicated):
        raise ir.KernelError(f"a fetch-and-op ({s.op.value}, return_prev=True) must run once per "
                             "thread, in thread-level code", s.loc)
    fn = "kf::atomic_fetch_add" if s.op == ir.Op.ATOMIC_ADD else "kf::atomic_fetch_max"
    prev = ir.Var(R.fresh("prev"), s.buffer.dtype)
    R.emit(f"const {R.ctype(s.buffer.dtype)} {prev.name} = {fn}({ref}, "
           f"{R.store_value(s.value, s.buffer.dtype)});")
    render_store(R, ir.Store(s.result, s.result_indices, prev, s.loc))


def render_ring_consume(R, loop: ir.For, tiles, v: str, start: str, j: str, bars: str, S: int) -> None:
    """One consumer step of a release ring (iteration ``j`` of ``loop``): wait for stage
    ``j % S`` to fill, run the stage with one wgmma group kept in flight (``wgmma_wait<1>``),
    then release iteration ``j - 1``'s stage, whose wgmmas have now retired.  Shared by the
    thread-0-issue ring and the warp-specialized consumers (cuda.warp_specialize)."""
    R.emit(f"kf::mbarrier_wait_parity({bars} + {j} % {S}, (uint32_t)(({j} / {S}) & 1));")
    R.wgmma_keep = 1
    # a persistent ring's j counts on over tiles (cuda.persistent): its stage is j % S
    _render_stage(R, loop, [t.copy for t in tiles], v, start, f"{j} % {S}" if loop in R.ring_base else None)
    R.wgmma_keep = 0
    R.open(f"if ({j} > 0)")
    R.emit(R.release(f"{bars} + {S} + ({j} - 1) % {S}"))  # both CTAs' copies in a cluster
    R.close()


def render_if(R, s: ir.If) -> None:
    R.open(f"if ({R.expr(s.cond)})")
    R.stmt(s.then)
    if s.orelse is not None:
        R.close("} else {")
        R.depth += 1
        R.stmt(s.orelse)
    R.close()


def render_for(R, s: ir.For) -> None:
    if s in R.pipes.prefetch and not R.in_parallel:
        render_pipelined(R, s)
        return
    if arith.nonnegative(s.start, R.nonneg_vars):
        R.nonneg_vars.add(s.var)
    ct = R.ctype(s.var.dtype)
    if s.kind == ir.LoopKind.UNROLLED:
        R.emit("#pragma unroll")
    v = R.var_name(s.var)
    R.open(f"for ({ct} {v} = {R.expr(s.start)}; {v} < {R.expr(s.start)} + {R.cast_to(s.extent, s.var.dtype)}; ++{v})")
    R.stmt(s.body)
    R.close()


# ---------------------------------------------------------------- element maps


def _driver(R, p: ir.Parallel):
    cands = [R.plan.registers[n.buffer] for n in ir.nodes(p.body)
             if isinstance(n, (ir.Load, ir.Store)) and n.buffer in R.plan.registers
             and len(n.indices) == len(p.vars) and all(i is v for i, v in zip(n.indices, p.vars))
             and n.buffer.static_shape() == p.extents]
    for kind in (AccumLayout, RowLayout):
        for c in cands:
            if isinstance(c, kind):
                return c
    return cands[0] if cands else None


def render_parallel(R, p: ir.Parallel) -> None:
    R.nonneg_vars |= set(p.vars)
    if R.in_parallel:  # a nested map runs inside its enclosing element
        for v, e in zip(p.vars, p.extents):
            R.open(f"for (int32_t {R.cname(v)} = 0; {R.cname(v)} < {e}; ++{R.cname(v)})")
        R.stmt(p.body)
        for _ in p.vars:
            R.close()
        return
    if cuda_radix.try_histogram(R, p):
        return
    driver = _driver(R, p)
    if driver is None and any(isinstance(n, (ir.Store, ir.Atomic)) and n.buffer.scope == ir.Scope.LOCAL
                              for n in ir.nodes(p.body)):
        # a map into thread-local storage: every thread computes every element of its own copy,
        # as block statements do (shared/global side effects in it stay once per block)
        body = p.body
        for v, e in reversed(list(zip(p.vars, p.extents))):
            body = ir.For(v, ir.const(e), body)
        R.stmt(body)
        return
    saved = (R.reg_ctx, R.in_parallel)
    R.in_parallel = True
    if driver is not None:
        r = R.fresh("r")
        R.emit("#pragma unroll")
        R.open(f"for (int {r} = 0; {r} < {driver.regs}; ++{r})")
        used = {n for n in ir.nodes(p.body) if isinstance(n, ir.Var)}
        for v, c in zip(p.vars, driver.coords(r, R.tid)):
            if v in used:
                R.emit(f"const int32_t {R.cname(v)} = {c};")
        guard = driver.valid(r, R.tid)
        if guard:
            R.open(f"if {guard}")
        R.reg_ctx = (driver, r, p.vars)
        R.stmt(p.body)
        if guard:
            R.close()
        R.close()
    else:
        e = R.fresh("e")
        total = prod(p.extents)
        R.open(f"for (int {e} = {R.tid}; {e} < {total}; {e} += {R.k.threads})")
        inner = 1
        used = {n for n in ir.nodes(p.body) if isinstance(n, ir.Var)}
        for v, ext in reversed(list(zip(p.vars, p.extents))):
            if v in used:
                R.emit(f"const int32_t {R.cname(v)} = ({e} / {inner}) % {ext};" if inner > 1
                       else f"const int32_t {R.cname(v)} = {e} % {ext};")
            inner *= ext
        R.reg_ctx = None
        R.stmt(p.body)
        R.close()
    R.reg_ctx, R.in_parallel = saved


def _add(start: ir.Expr, v: ir.Expr) -> ir.Expr:
    """``start + v``, keeping ``v`` itself when start is 0 (so identity accesses stay recognisable)."""
    return v if arith.const_int(start) == 0 else ir.fold(ir.binary(ir.Op.ADD, start, v))


def _vars(R, n: int) -> tuple[ir.Var, ...]:
    return tuple(ir.Var(R.fresh("i"), I32) for _ in range(n))


def _region_index(r: ir.Region, logical) -> tuple:
    """Full indices of region ``r`` for a logical index over its squeezed extents."""
    it = iter(logical)
    return tuple(s if e == 1 else _add(s, next(it)) for s, e in zip(r.starts, r.extents))


def _inside(R, r: ir.Region, idx) -> ir.Expr | None:
    """The condition that ``idx`` lies inside ``r``'s buffer (None when provably so): the shared
    edge-mask logic of :mod:`kernforge.codegen.passes.masks`, with CUDA's constant-shape prover."""
    return masks.element_mask(r, idx, masks.ConstBounds(R.nonneg_vars), upper_first=True)


def _map_shape(R, regions) -> tuple[ir.Region, tuple[int, ...]]:
    """The iteration space of a copy-like map: a register fragment's whole shape when one takes part
    (so that its owner threads iterate their own registers), else the first region's squeezed extents."""
    for r in regions:
        if r.buffer in R.plan.registers:
            return r, r.extents
    return regions[0], regions[0].squeezed() or (1,)


def _logical(anchor: ir.Region, vars_) -> tuple:
    """Logical (squeezed) indices from the map's vars, which run over ``anchor``'s full or squeezed extents."""
    if len(vars_) == len(anchor.extents) and anchor.squeezed() != anchor.extents:
        return tuple(v for v, e in zip(vars_, anchor.extents) if e != 1)
    return tuple(vars_) if anchor.squeezed() else ()


def _map_index(anchor: ir.Region, vars_, r: ir.Region) -> tuple:
    if r is anchor and len(vars_) == len(r.extents):
        return tuple(_add(s, v) for s, v in zip(r.starts, vars_))
    return _region_index(r, _logical(anchor, vars_))


def render_copy(R, c: ir.Copy) -> None:
    if c in R.tma_stores:  # STSM + TMA-store epilogue (cuda_tma_store; emptied when its staging did not fit)
        cuda_tma_store.render(R, R.tma_stores[c], R.tma_store_offset)
        return
    if try_async_copy(R, c) or try_pair_store(R, c):
        return
    anchor, shape = _map_shape(R, (c.dst, c.src))
    vars_ = _vars(R, len(shape))
    didx, sidx = _map_index(anchor, vars_, c.dst), _map_index(anchor, vars_, c.src)
    src_in, dst_in = _inside(R, c.src, sidx), _inside(R, c.dst, didx)
    value = ir.cast(ir.Load(c.src.buffer, sidx), c.dst.buffer.dtype)
    if src_in is not None:
        value = ir.select(src_in, value, _zero(c.dst.buffer.dtype))
    body: ir.Stmt = ir.Store(c.dst.buffer, didx, value)
    if dst_in is not None:
        body = ir.If(dst_in, body)
    R.stmt(ir.Parallel(vars_, tuple(shape), body))


_PAIR_TYPES = (dtypes.bfloat16, dtypes.float16, dtypes.float32)


def _pair_layout(R, c: ir.Copy) -> AccumLayout | None:
    """The accumulator layout when ``c`` goes out by :func:`try_pair_store`, else None."""
    lay = R.plan.registers.get(c.src.buffer)
    dst = c.dst.buffer
    if not isinstance(lay, AccumLayout) or dst.scope != ir.Scope.GLOBAL or dst.dtype not in _PAIR_TYPES \
            or c.src.buffer.dtype != dtypes.float32 or c.dst.squeezed() != (lay.m, lay.n) \
            or c.dst.extents[-1] != lay.n or arith.const_int(dst.strides[-1]) != 1:
        return None
    return lay


def try_pair_store(R, c: ir.Copy) -> bool:
    """Accumulator -> global epilogue: each thread's two adjacent columns go out in one store."""
    lay = _pair_layout(R, c)
    if lay is None:
        return False
    dst = c.dst.buffer
    i, j = ir.Var(R.fresh("i"), I32), ir.Var(R.fresh("j"), I32)
    R.nonneg_vars |= {i, j}
    idx = _region_index(c.dst, (i, j))
    idx1 = idx[:-1] + (ir.binary(ir.Op.ADD, idx[-1], 1),)
    in0, in1 = (_inside(R, c.dst, x) for x in (idx, idx1))
    in0, in1 = ("true" if x is None else R.expr(x) for x in (in0, in1))
    r, sn, ct = R.fresh("r"), R.buffer_name(c.src.buffer), R.ctype(dst.dtype)
    guard = lay.valid(r, R.tid)
    if guard:
        R.open(f"if {guard}")
    R.emit("#pragma unroll")
    R.open(f"for (int {r} = 0; {r} < {lay.regs}; {r} += 2)")
    for v, e in zip((i, j), lay.coords(r, R.tid)):
        R.emit(f"const int32_t {R.cname(v)} = {e};")
    R.emit(f"{ct}* kf_p = {R.buffer_name(dst)} + {R.offset(dst, idx)};")
    R.emit(f"const bool kf_in0 = {in0}, kf_in1 = {in1};")
    R.open(f"if (kf_in0 && kf_in1 && (reinterpret_cast<uintptr_t>(kf_p) & {2 * dst.dtype.itemsize - 1}) == 0)")
    R.emit(f"kf::store_pair<{ct}>(kf_p, {sn}[{r}], {sn}[{r} + 1]);")
    R.close("} else {")
    R.depth += 1
    R.emit(f"if (kf_in0) kf_p[0] = kf_from_float<{ct}>({sn}[{r}]);")
    R.emit(f"if (kf_in1) kf_p[1] = kf_from_float<{ct}>({sn}[{r} + 1]);")
    R.close()
    R.close()
    if guard:
        R.close()
    return True


def _zero(dt: dtypes.DType) -> ir.Expr:
    return ir.const(0.0 if dt.is_float else 0, dt) if not dt.is_bool else ir.const(False)


def render_fill(R, f: ir.Fill) -> None:
    shape = f.dst.extents if f.dst.buffer in R.plan.registers else (f.dst.squeezed() or (1,))
    vars_ = _vars(R, len(shape))
    idx = _map_index(f.dst, vars_, f.dst)
    body: ir.Stmt = ir.Store(f.dst.buffer, idx, ir.cast(f.value, f.dst.buffer.dtype))
    inside = _inside(R, f.dst, idx)
    if inside is not None:
        body = ir.If(inside, body)
    R.stmt(ir.Parallel(vars_, tuple(shape), body))


# ---------------------------------------------------------------- async copies


def _async_ok(R, c: ir.Copy) -> int:
    """The vector width (elements per 16 bytes) when ``c`` can go through cp.async, else 0."""
    src, dst = c.src.buffer, c.dst.buffer
    if src.scope != ir.Scope.GLOBAL or not R.is_smem(dst) or src.dtype != dst.dtype:
        return 0
    if c.dst.extents != dst.static_shape() or any(arith.const_int(s) != 0 for s in c.dst.starts):
        return 0
    vec = 16 // src.dtype.itemsize
    if c.src.squeezed() != c.dst.squeezed() or c.src.extents[-1] != c.dst.extents[-1]:
        return 0
    last = c.dst.extents[-1]
    if last % vec or arith.const_int(src.strides[-1]) != 1:
        return 0
    if dst in R.plan.core_tiles and dst.dtype.itemsize not in (1, 2):
        return 0  # a core matrix row is one 16-byte chunk of 8 (16-bit) or 16 (fp8) elements
    return vec


def try_async_copy(R, c: ir.Copy, commit: bool = True) -> bool:
    vec = _async_ok(R, c)
    if not vec:
        return False
    shape = list(c.dst.extents)
    chunks_per_row = shape[-1] // vec
    rows = prod(shape[:-1])
    total = rows * chunks_per_row
    q = R.fresh("q")
    core = c.dst.buffer in R.plan.core_tiles and rows % 8 == 0
    if total % R.k.threads == 0:
        it = R.fresh("it")
        R.emit("#pragma unroll")
        R.open(f"for (int {it} = 0; {it} < {total // R.k.threads}; ++{it})")
        R.emit(f"const int {q} = {it} * {R.k.threads} + {R.tid};")
    else:
        R.open(f"for (int {q} = {R.tid}; {q} < {total}; {q} += {R.k.threads})")
    # chunk -> (row, column chunk); core tiles take 8 rows of one column chunk per 8 lanes
    row, col = R.fresh("row"), R.fresh("col")
    if core:
        R.emit(f"const int {row} = ({q} / {8 * chunks_per_row}) * 8 + {q} % 8;")
        R.emit(f"const int {col} = (({q} / 8) % {chunks_per_row}) * {vec};")
    else:
        R.emit(f"const int {row} = {q} / {chunks_per_row};")
        R.emit(f"const int {col} = ({q} % {chunks_per_row}) * {vec};")
    vars_ = []
    inner = 1
    for ext in reversed(shape[:-1]):
        v = ir.Var(R.fresh("i"), I32)
        R.emit(f"const int32_t {R.cname(v)} = ({row} / {inner}) % {ext};")
        inner *= ext
        vars_.insert(0, v)
    cv = ir.Var(col, I32)
    R.nonneg_vars |= set(vars_) | {cv}
    full = vars_ + [cv]
    didx = tuple(_add(s, v) for s, v in zip(c.dst.starts, full))
    sidx = _region_index(c.src, [v for v, e in zip(full, c.dst.extents) if e != 1])
    ct = R.ctype(c.src.buffer.dtype)
    R.emit(f"const {ct}* kf_src = {R.buffer_name(c.src.buffer)} + {R.offset(c.src.buffer, sidx)};")
    R.emit(f"{ct}* kf_dst = {R.buffer_name(c.dst.buffer)} + {R.offset(c.dst.buffer, didx)};")
    inside = _inside(R, c.src, sidx)
    rows_in = R.expr(inside) if inside is not None else "true"
    last_dim = R.expr(c.src.buffer.shape[-1])
    last_idx = R.expr(sidx[-1])
    R.emit(f"const bool kf_rows_in = {rows_in};")
    R.open(f"if (kf_rows_in && ({last_idx}) + {vec} <= {last_dim} && "
           f"(reinterpret_cast<uintptr_t>(kf_src) & 15) == 0)")
    R.emit("kf::cp_async_cg_16(kf_dst, kf_src, 16);")
    R.close("} else {")
    R.depth += 1
    R.emit("#pragma unroll")
    R.emit(f"for (int kf_v = 0; kf_v < {vec}; ++kf_v) kf_dst[kf_v] = (kf_rows_in && ({last_idx}) + kf_v < {last_dim}) "
           f"? kf_src[kf_v] : kf_from_float<{ct}>(0.0f);")
    R.close()
    R.close()
    if commit:
        R.emit("kf::cp_async_commit();")
        R.emit("kf::cp_async_wait<0>();")
    return True


def render_pipelined(R, loop: ir.For) -> None:
    """A ``num_stages``-deep ring: stage ``(k - start) % S`` of each prefetched tile holds iteration k."""
    if loop in R.release_rings:
        render_release_ring(R, loop)
        return
    if loop in R.tma_loops:
        render_tma_pipelined(R, loop)
        return
    S = loop.num_stages
    copies = R.pipes.prefetch[loop]
    start, v = R.expr(loop.start), R.var_name(loop.var)
    end = R.fresh("end")
    R.nonneg_vars.add(loop.var)
    R.emit(f"const int32_t {end} = {start} + {R.cast_to(loop.extent, I32)};")
    plain = [0]  # plain stage fills issued since the last barrier of the ring
    prologue = [True]

    def issue(k_expr: str, stage_expr: str) -> None:
        kv = R.fresh("k")
        R.emit(f"const int32_t {kv} = {k_expr};")
        R.open(f"if ({kv} < {end})")
        R.var_override[loop.var] = kv
        for c in copies:
            b = c.dst.buffer
            R.buf_override[b] = f"({R.cname(b)}_ring + ({stage_expr}) * {prod(b.static_shape())})"
            if not try_async_copy(R, c, commit=False):
                # rows too short (or strided) for 16-byte cp.async: a plain copy into the
                # stage; the barrier at the top of the consuming iteration publishes it.
                # Plain fills are kept apart by a barrier (structural and conservative: all
                # of them in the prologue, all but the first after the iteration's barrier)
                if prologue[0] or plain[0]:
                    R.barrier()
                plain[0] += 1
                render_copy(R, c)
            del R.buf_override[b]
        del R.var_override[loop.var]
        R.close()
        R.emit("kf::cp_async_commit();")

    for s in range(S - 1):
        R.open("")
        issue(f"{start} + {s}", str(s))
        R.close()
    R.open(f"for (int32_t {v} = {start}; {v} < {end}; ++{v})")
    R.emit(f"kf::cp_async_wait<{S - 2}>();")
    R.barrier()
    prologue[0], plain[0] = False, 0
    R.open("")
    issue(f"{v} + {S - 1}", f"({v} - {start} + {S - 1}) % {S}")
    R.close()
    _render_stage(R, loop, copies, v, start)
    R.close()
    R.emit("kf::cp_async_wait<0>();")


def _render_stage(R, loop: ir.For, copies, v: str, start: str, stage: Optional[str] = None) -> None:
    """One iteration of a pipelined loop: point each prefetched tile's name at its stage of
    the ring (``stage``, default ``(v - start) % S``), then render the rest of the body (the
    copies themselves were issued ahead)."""
    S = loop.num_stages
    stage = stage or f"({v} - {start}) % {S}"
    for c in copies:
        b = c.dst.buffer
        R.emit(f"{R.ctype(b.dtype)}* const {R.cname(b)} = {R.cname(b)}_ring + ({stage}) * "
               f"{prod(b.static_shape())};")
    for x in (loop.body.body if isinstance(loop.body, ir.Seq) else (loop.body,)):
        if x not in copies:
            R.stmt(x)


def render_tma_pipelined(R, loop: ir.For) -> None:
    """The same ring filled by TMA: stage s has mbarrier ``bars[s]``; iteration k waits on its
    stage's barrier with parity ``((k - start) / S) & 1`` (the stage's n-th fill completes phase n)."""
    S = loop.num_stages
    tiles = R.tma_loops[loop]
    bars = f"kf_bars{list(R.mbarrier_offsets).index(loop)}"
    start, v = R.expr(loop.start), R.var_name(loop.var)
    end = R.fresh("end")
    R.nonneg_vars.add(loop.var)
    R.emit(f"const int32_t {end} = {start} + {R.cast_to(loop.extent, I32)};")
    # persistent (cuda.persistent): the barriers live across tiles and the ring's running count
    # ``base`` offsets every stage index and parity; else they are set up per loop entry
    base = R.ring_base.get(loop)
    g = "" if base is None else f"{base} + "
    if base is None:
        cuda_tma.render_init(R, bars, S)

    def issue(k_expr: str, stage_expr: str) -> None:
        kv = R.fresh("k")
        R.emit(f"const int32_t {kv} = {k_expr};")
        R.open(f"if ({kv} < {end})")
        R.var_override[loop.var] = kv
        cuda_tma.render_issue(R, tiles, stage_expr, f"{bars} + ({stage_expr})")
        del R.var_override[loop.var]
        R.close()

    for s in range(S - 1):
        R.open("")
        issue(f"{start} + {s}", str(s) if base is None else f"({base} + {s}) % {S}")
        R.close()
    R.open(f"for (int32_t {v} = {start}; {v} < {end}; ++{v})")
    R.emit(f"kf::mbarrier_wait_parity({bars} + ({g}{v} - {start}) % {S}, (uint32_t)((({g}{v} - {start}) / {S}) & 1));")
    # every thread is done with the stage refilled next (generic reads/writes before async-proxy writes)
    R.emit("kf::fence_proxy_async(); __syncthreads();")
    R.open("")
    issue(f"{v} + {S - 1}", f"({g}{v} - {start} + {S - 1}) % {S}")
    R.close()
    _render_stage(R, loop, [t.copy for t in tiles], v, start, None if base is None else f"({g}{v} - {start}) % {S}")
    R.close()
    if base is None:
        cuda_tma.render_inval(R, bars, S)
    else:
        R.emit(f"{base} += {end} - {start};")


def render_release_ring(R, loop: ir.For) -> None:
    """A TMA ring released by wgmma completion (``pipeline_plan.plan_release_rings``): stage s has
    a *full* mbarrier ``bars[s]`` (one arrival: thread 0's expect_tx, plus the bytes) and an
    *empty* one ``bars[S + s]`` (one arrival per thread).  Iteration k (j = k - start):

    * every thread waits full[j % S] with parity ``(j / S) & 1``, issues the stage's wgmmas,
      commits and waits until one group is left in flight (``wgmma_wait<1>``): iteration k-1's
      group has retired, so the thread arrives on empty[(j - 1) % S];
    * thread 0 then refills that stage with iteration k + S - 1, after waiting for its release
      number ``(j - 1) / S`` (parity ``((j - 1) / S) & 1``); the first fill of each stage (the
      prologue and j = 0) has no earlier reader and waits for nothing.

    No block-wide barrier per iteration; the last group is waited for after the loop.  Each
    barrier's phases count its fills or releases, so the parities hold across ring wraps."""
    S = loop.num_stages
    tiles = R.tma_loops[loop]
    bars = f"kf_bars{list(R.mbarrier_offsets).index(loop)}"
    start, v = R.expr(loop.start), R.var_name(loop.var)
    end = R.fresh("end")
    R.nonneg_vars.add(loop.var)
    R.emit(f"const int32_t {end} = {start} + {R.cast_to(loop.extent, I32)};")
    R.open(f"if ({R.tid} == 0)")
    R.emit(f"for (int kf_s = 0; kf_s < {S}; ++kf_s) kf::mbarrier_init({bars} + kf_s, 1);")
    R.emit(f"for (int kf_s = 0; kf_s < {S}; ++kf_s) kf::mbarrier_init({bars} + {S} + kf_s, {R.k.threads});")
    R.emit("kf::mbarrier_init_fence();")
    R.close()
    R.emit("__syncthreads();")

    j = R.fresh("j")

    def issue(k_expr: str, stage_expr: str, release: Optional[str]) -> None:
        kv = R.fresh("k")
        R.emit(f"const int32_t {kv} = {k_expr};")
        R.open(f"if ({kv} < {end})")
        if release is not None:
            R.open(f"if ({R.tid} == 0 && {j} > 0)")
            R.emit(f"kf::mbarrier_wait_parity({bars} + {S} + ({stage_expr}), {release});")
            R.close()
        R.var_override[loop.var] = kv
        cuda_tma.render_issue(R, tiles, stage_expr, f"{bars} + ({stage_expr})")
        del R.var_override[loop.var]
        R.close()

    for s in range(S - 1):
        R.open("")
        issue(f"{start} + {s}", str(s), None)
        R.close()
    R.open(f"for (int32_t {v} = {start}; {v} < {end}; ++{v})")
    R.emit(f"const int32_t {j} = {v} - {start};")
    render_ring_consume(R, loop, tiles, v, start, j, bars, S)
    R.open("")
    issue(f"{v} + {S - 1}", f"({j} + {S - 1}) % {S}", f"(uint32_t)((({j} - 1) / {S}) & 1)")
    R.close()
    R.close()
    gemm = next(x for x in (loop.body.body if isinstance(loop.body, ir.Seq) else (loop.body,))
                if isinstance(x, ir.Gemm))
    R.emit("kf::wgmma_wait<0>();")
    R.emit(f"kf::wgmma_fence_operand({R.buffer_name(gemm.c.buffer)});")
    cuda_tma.render_inval(R, bars, 2 * S)
