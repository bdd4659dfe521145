"""The CPU C++ renderer: tile IR -> one OpenMP C++ translation unit.

How each construct maps onto a CPU (see docs/backends/cpu.md):

* the grid is an OpenMP ``parallel for collapse(n)`` over blocks (a one-block
  grid stays on the calling thread: ``parallel if``); a block runs
  start to finish on one thread, so statements outside ``Parallel`` simply run
  once and on-chip buffers are private per-thread storage;
* shared/fragment tiles (and large locals) live in a 64-byte-aligned
  per-thread arena at offsets from the memory plan (``passes.allocate``);
  small locals are stack arrays the compiler keeps in registers;
* ``Copy``/``Fill`` are lowered by ``passes.masks`` into element maps with a
  whole-tile bounds test in front (unmasked fast path for interior tiles);
* ``Parallel`` is a loop nest whose innermost loop carries ``#pragma omp simd``
  when its body is only stores and branches (iterations are independent); one that only
  stores zero over a long contiguous run of global memory is a non-temporal fill
  (``kf::zero_stream``, :meth:`CpuRenderer.stream_zero`);
* ``Gemm``/``Reduce``/``Cumsum`` call the templates of ``kf/gemm.h`` and
  ``kf/tile.h`` with every shape and stride as a compile-time constant;
* ``Atomic`` on a global buffer is a real atomic (blocks run concurrently);
  on block-private buffers it is a plain read-modify-write.
"""
from __future__ import annotations

import functools
import math
import os
from typing import Optional

import jinja2

from kernforge import dtypes
from kernforge.codegen import ir
from kernforge.codegen.passes import (Analysis, buffer_bytes, lower_copies, nonneg_vars, plan_memory, simplify,
                                      simplify_expr)
from kernforge.codegen.passes.append import AppendLoop, match_append
from kernforge.backends.cpu import isa
from kernforge.backends.templates import environment as template_environment
from kernforge.codegen.passes.checks import insert_checks
from kernforge.codegen.passes.gemm_layout import NARROW, layout_for
from kernforge.codegen.passes.ranges import statements
from kernforge.codegen.passes.warps import has_shuffle, split_shuffles
from kernforge.codegen.renderer import CRenderer, NameTable, Program, Renderer, Target, entry_symbol

TEMPLATE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")
INCLUDE_DIR = os.path.join(TEMPLATE_DIR, "include")
ERR_GRID = 1  # a grid dimension is negative or does not fit int32
ERR_ALLOC = 2  # a thread could not allocate its arena
ERR_CHECK = 3  # checked mode: an access was out of bounds (the violation record says which)
#: a zero-storing map over at least this many contiguous bytes of global memory is a
#: non-temporal fill (CpuRenderer.stream_zero): one 4 KB page, a bf16 row of 2048
STREAM_MIN_BYTES = 4096


class CpuRenderer(CRenderer, Renderer):
    """``render(kernel, target) -> Program`` for the host; tile statements become loops and
    calls into ``kf/*.h``."""

    name = "cpu"
    transforms = (simplify, lower_copies, simplify)
    template = "kernel_module.cpp.j2"
    template_dir = TEMPLATE_DIR  # a variant renderer points this at its own folder's skeletons
    schedule = "guided"
    stack_bytes = 1024  # LOCAL buffers up to this size are stack arrays, larger ones go to the arena
    gemm_compute = {dtypes.float32: "float", dtypes.float16: "float", dtypes.bfloat16: "float",
                    dtypes.float8_e4m3: "float", dtypes.float64: "double", dtypes.int8: "int32_t"}
    native_bf16_dtypes = (dtypes.bfloat16, dtypes.float8_e4m3)  # what VDPBF16PS reads (fp8 widened exactly)
    reduce_op = {ir.Op.REDUCE_MAX: "kf::Reduce::Max", ir.Op.REDUCE_MIN: "kf::Reduce::Min",
                 ir.Op.REDUCE_SUM: "kf::Reduce::Sum"}
    atomic_op = {ir.Op.ATOMIC_ADD: "kf::atomic_add", ir.Op.ATOMIC_MAX: "kf::atomic_max"}
    # float32 exp2 is kf_exp2f (kf/math.h): branch-free, so the loops around it vectorise; a
    # glibc exp2f call kept the softmax of an attention tile scalar
    unary_table = {**CRenderer.unary_table,
                   ir.Op.EXP2: lambda a, e: f"kf_exp2f({a})" if e.dtype == dtypes.float32 else f"exp2({a})"}

    def __init__(self):
        super().__init__()
        self.names = NameTable()
        self.plan = None
        self.invariant: dict[int, str] = {}  # hoisted loop-invariant loads, by node identity
        self.n_invariant = 0

    def var_name(self, v: ir.Var) -> str:
        return self.names[v]

    def expr(self, e: ir.Expr) -> str:
        name = self.invariant.get(id(e))
        return name if name is not None else super().expr(e)

    def buffer_name(self, b: ir.Buffer) -> str:
        return self.names[b]

    def cast(self, e: ir.Expr, dt: dtypes.DType) -> str:
        """fp8 e4m3 -> bf16 (exact: the fp8 GEMM tiles the layout pass stores as bf16) on the
        integer bits, ``kf_fp8_to_bf16``: branch-free, so the tile copy vectorises, where the
        generic route through float (a subnormal branch, then RNE) stayed scalar."""
        if e.dtype == dtypes.float8_e4m3 and dt == dtypes.bfloat16:
            return f"kf_fp8_to_bf16({self.expr(e)})"
        return super().cast(e, dt)

    def in_arena(self, b: ir.Buffer) -> bool:
        return b.scope in (ir.Scope.SHARED, ir.Scope.FRAGMENT) or buffer_bytes(b) > self.stack_bytes

    # ------------------------------------------------------------------ kernel
    def pipeline(self, kernel: ir.Kernel, target: Target) -> tuple:
        """The transforms, then the analyses the emitter reads: C names, the variables
        proven non-negative (plain ``/`` and ``%``), and the on-chip arena's layout.  After
        the first simplify the GEMM operand tiles get the layout the target's micro-kernel
        reads (``passes.gemm_layout``; a path that multiplies bf16 natively keeps bf16 and
        fp8 tiles narrow).  Checked mode (``target.checks``) inserts its bounds tests next,
        before copies are lowered: the masked element loops of global copies are legal by
        definition."""
        path = self.isa_path(target)
        widen = tuple(d for d in NARROW if not (path in isa.NATIVE_BF16 and d in self.native_bf16_dtypes))
        # avx512bf16 reads a K-major (nt) bf16 B as (k, k+1) words: kf::gemm_bf16_nt
        k_major = (dtypes.bfloat16,) if path in isa.NATIVE_BF16 else ()
        # ... and stores fp8 operand tiles as bf16 (exact), converted once by their copy; an N-major bf16
        # B is read in place by any rows: kf::gemm_bf16_nn packs it into (k, k+1) pairs from the source
        to_bf16 = (dtypes.float8_e4m3,) if path in isa.NATIVE_BF16 else ()
        layout = layout_for(widen, direct=True, k_major_b=k_major, to_bf16=to_bf16, packed_b=k_major)
        transforms = self.transforms[:1] + (layout,) + self.transforms[1:]
        if target.checks:
            transforms = transforms[:2] + (insert_checks,) + transforms[2:]
        # warp shuffles first: the CPU runs a thread region as a loop, split at each shuffle
        shuffles = (split_shuffles,) if has_shuffle(kernel.body) else ()
        return shuffles + transforms + (
            Analysis("names", lambda k, facts: NameTable.for_kernel(k)),
            Analysis("nonneg_vars", lambda k, facts: nonneg_vars(k)),
            Analysis("memory", lambda k, facts: plan_memory(k, self.in_arena)),
        )

    @staticmethod
    def isa_path(target: Target) -> str:
        """The instruction-set path (``isa.PATHS``) to render for: ``target.arch``, else the
        machine's default.  Rendering any path is allowed; building one the compiler does
        not target fails in ``CpuBackend.target``."""
        return isa.check(target.arch) if target.arch else isa.default_path()

    def emit_program(self, k: ir.Kernel, facts: dict, target: Target) -> Program:
        return Program(self.emit_source(k, facts, target.checks, self.isa_path(target)), entry_symbol(k))

    def emit_source(self, k: ir.Kernel, facts: dict, checks: bool = False, path: str = "generic") -> str:
        """Source for a kernel that has already been through :meth:`pipeline`."""
        self.names = facts["names"]
        self.nonneg_vars = facts["nonneg_vars"]
        self.plan = facts["memory"]
        self.scratch: list[str] = []
        written = {n.buffer for n in statements(k.body) if isinstance(n, (ir.Store, ir.Atomic))}
        body: list[str] = []
        self.streamed = False
        self.stmt(k.body, body, 0)
        if self.streamed:   # non-temporal stores are weakly ordered: drain them before the barrier
            body.append("kf::stream_fence();")
        rank = len(k.grid)
        grid_names = [f"kf_grid{d}" for d in range(rank)]
        return _environment(self.template_dir).get_template(self.template).render({
            "kernel_name": k.name,
            "isa": path, "isa_level": isa.level(path),
            "entry": entry_symbol(k),
            "attrs": repr(dict(sorted(k.attrs.items()))),
            "buffers_bytes": self.plan.total,
            "scratch_terms": ", ".join(self.scratch) or "0",
            "param_lines": [self.param_line(i, p, p in written) for i, p in enumerate(k.params)]
            + [f"const {self.ctype(s.dtype)} {self.names[s]} = static_cast<{self.ctype(s.dtype)}>(dims[{i}]);"
               for i, s in enumerate(k.symbols)]
            + ([f"int64_t* const kf_check = static_cast<int64_t*>(args[{len(k.params)}]);"] if checks else []),
            "grid_lines": [f"const int64_t {g} = static_cast<int64_t>({self.expr(e)});"
                           for g, e in zip(grid_names, k.grid)],
            "grid_invalid": " || ".join(f"{g} < 0 || {g} > 2147483647" for g in grid_names),
            "err_grid": ERR_GRID, "err_alloc": ERR_ALLOC, "err_check": ERR_CHECK, "checks": checks,
            "grid_rank": rank,
            "grid_total": " * ".join(grid_names) or "1",
            "schedule": self.schedule,
            "block_loops": [f"for (int32_t {self.names[v]} = 0; {self.names[v]} < {g}; ++{self.names[v]})"
                            for v, g in reversed(list(zip(k.block_vars, grid_names)))],
            "body_lines": body,
        })

    def param_line(self, index: int, p, written: bool) -> str:
        if isinstance(p, ir.Var):
            t = self.ctype(p.dtype)
            return f"const {t} {self.names[p]} = *static_cast<const {t}*>(args[{index}]);"
        t = self.ctype(p.dtype) if written else f"const {self.ctype(p.dtype)}"
        return f"{t}* {self.names[p]} = static_cast<{t}*>(args[{index}]);"

    # ------------------------------------------------------------------ statements
    def stmt(self, s: ir.Stmt, out: list[str], depth: int) -> None:
        pad = "  " * depth
        getattr(self, "stmt_" + type(s).__name__)(s, out, pad, depth)

    def block(self, s: ir.Stmt, out: list[str], depth: int) -> None:
        if isinstance(s, ir.Seq):
            for x in s.body:
                self.stmt(x, out, depth)
        else:
            self.stmt(s, out, depth)

    def stmt_Seq(self, s: ir.Seq, out, pad, depth):
        scoped = any(isinstance(x, ir.Allocate) for x in s.body) and depth > 0
        if scoped:
            out.append(pad + "{")
        self.block(s, out, depth + 1 if scoped else depth)
        if scoped:
            out.append(pad + "}")

    def stmt_Check(self, s: ir.Check, out, pad, depth):
        out.append(pad + self.check_call(s))

    def stmt_Sync(self, s: ir.Sync, out, pad, depth):
        """A block runs on one thread here: a barrier has nothing to order."""

    def stmt_Allocate(self, s: ir.Allocate, out, pad, depth):
        b, t = s.buffer, self.ctype(s.buffer.dtype)
        if b in self.plan:
            out.append(f"{pad}{t}* __restrict__ {self.names[b]} = "
                       f"reinterpret_cast<{t}*>(kf_arena + {self.plan.offset(b)});")
        else:
            out.append(f"{pad}alignas(64) {t} {self.names[b]}[{buffer_bytes(b) // b.dtype.itemsize}];")

    def stmt_For(self, s: ir.For, out, pad, depth):
        v, t = self.names[s.var], self.ctype(s.var.dtype)
        end = simplify_expr(ir.binary(ir.Op.ADD, s.start, s.extent))
        out.append(f"{pad}const {t} kf_end_{v} = {self.cast_to(end, s.var.dtype)};")
        append = match_append(s)
        if append is not None:
            self.append_loop(append, out, pad, depth)
            return
        if s.kind == ir.LoopKind.UNROLLED:
            n = s.extent.value if isinstance(s.extent, ir.Const) else 8
            out.append(f"{pad}#pragma GCC unroll {max(1, min(int(n), 64))}")
        elif s.kind == ir.LoopKind.PIPELINED:
            out.append(f"{pad}// pipelined (num_stages={s.num_stages}): stages run in order on a CPU")
        out.append(f"{pad}for ({t} {v} = {self.cast_to(s.start, s.var.dtype)}; {v} < kf_end_{v}; ++{v}) {{")
        self.block(s.body, out, depth + 1)
        out.append(pad + "}")

    def append_loop(self, a: AppendLoop, out: list[str], pad: str, depth: int) -> None:
        """The append idiom (``passes.append``) in chunks of 16 lanes under AVX-512:
        the lanes' values and predicates are computed by a ``#pragma omp simd``
        loop into aligned scratch, the selected lanes are compressed
        (``vpcompressd`` into a register, then a masked store, which Zen 4 runs far
        faster than a compress to memory) and the counter advances by the popcount.
        The last lane is also kept when it is not selected, so that, as in the
        scalar loop, it is the value left at ``buf[cnt]``.  The remainder (and
        every iteration without AVX-512, or when an in-place compaction's counter
        starts ahead of the loop) runs the scalar loop."""
        s = a.loop
        v, t = self.names[s.var], self.ctype(s.var.dtype)
        n = self.n_invariant
        self.n_invariant += 1
        cnt = f"{self.names[a.counter]}[0]"
        needs = "defined(__AVX512F__)"
        if any(st.buffer.dtype.itemsize == 2 for st in a.stores):
            needs += " && defined(__AVX512BW__) && defined(__AVX512VL__)"
        p1, p2, p3 = pad + "  ", pad + "    ", pad + "      "
        out.append(f"{pad}{t} {v} = {self.cast_to(s.start, s.var.dtype)};")
        out.append(f"#if {needs}")
        guard = f"{cnt} <= {v}" if a.needs_trailing_counter else "true"
        out.append(f"{pad}if ({guard}) {{")
        out.append(f"{p1}for (; kf_end_{v} - {v} >= KF_APPEND_LANES; {v} += KF_APPEND_LANES) {{")
        lanes = [f"kf_ap{n}_{i}" for i in range(len(a.stores))]
        for name, st in zip(lanes, a.stores):
            out.append(f"{p2}alignas(64) {self.ctype(st.buffer.dtype)} {name}[KF_APPEND_LANES];")
        out.append(f"{p2}alignas(64) int32_t kf_ap{n}_p[KF_APPEND_LANES];")
        out.append(f"{p2}const {t} kf_ap{n}_j0 = {v};")
        out.append(f"{p2}#pragma omp simd")
        out.append(f"{p2}for (int32_t kf_ap{n}_l = 0; kf_ap{n}_l < KF_APPEND_LANES; ++kf_ap{n}_l) {{")
        out.append(f"{p3}const {t} {v} = kf_ap{n}_j0 + kf_ap{n}_l;")
        for name, st in zip(lanes, a.stores):
            out.append(f"{p3}{name}[kf_ap{n}_l] = {self.store_value(st.value, st.buffer.dtype)};")
        out.append(f"{p3}kf_ap{n}_p[kf_ap{n}_l] = static_cast<int32_t>({self.expr(a.predicate)});")
        out.append(f"{p2}}}")
        out.append(f"{p2}const __mmask16 kf_ap{n}_m = kf::append_nonzero(kf_ap{n}_p);")
        out.append(f"{p2}const __mmask16 kf_ap{n}_w = kf_ap{n}_m | __mmask16(1u << (KF_APPEND_LANES - 1));")
        out.append(f"{p2}const __mmask16 kf_ap{n}_s = kf::append_prefix(kf_ap{n}_w);")
        for name, st in zip(lanes, a.stores):
            out.append(f"{p2}kf::append_lanes({self.names[st.buffer]} + {cnt}, {name}, kf_ap{n}_w, kf_ap{n}_s);")
        out.append(f"{p2}{cnt} += __builtin_popcount(kf_ap{n}_m);")
        out.append(f"{p1}}}")
        out.append(f"{pad}}}")
        out.append("#endif")
        out.append(f"{pad}for (; {v} < kf_end_{v}; ++{v}) {{")
        self.block(s.body, out, depth + 1)
        out.append(pad + "}")

    def stmt_Parallel(self, s: ir.Parallel, out, pad, depth):
        stream = self.stream_zero(s)
        if stream is not None:
            out.append(f"{pad}{stream};")
            self.streamed = True
            return
        # ``omp simd`` over stores and branches, except a store under an ``if`` with no ``else``:
        # g++ 12 (its dominator optimisations) drops such a masked store when the condition
        # reads a variable of the enclosing ``omp for``, i.e. every edge tile's masked write-back
        # (tests/backends/test_cpu_gemm_paths.py found it; g++ vectorises these loops without it)
        simd = all(isinstance(n, (ir.Seq, ir.Store, ir.Check)) or (isinstance(n, ir.If) and n.orelse is not None)
                   for n in statements(s.body))
        hoisted = self.hoist_invariant_loads(s, out, pad)
        for level, (v, e) in enumerate(zip(s.vars, s.extents)):
            p = "  " * (depth + level)
            if simd and level == len(s.vars) - 1:
                out.append(p + "#pragma omp simd")
            name = self.names[v]
            out.append(f"{p}for ({self.ctype(v.dtype)} {name} = 0; {name} < {e}; ++{name}) {{")
        self.block(s.body, out, depth + len(s.vars))
        for level in reversed(range(len(s.vars))):
            out.append("  " * (depth + level) + "}")
        for key in hoisted:
            del self.invariant[key]

    def stream_zero(self, s: ir.Parallel) -> Optional[str]:
        """``kf::zero_stream(&buf[start], count)`` for a map whose body only stores zero into a
        global buffer over one contiguous run of at least ``STREAM_MIN_BYTES``: indices
        ``(..., v)`` over part of a row, or ``(..., x + r, c)`` with ``c`` over whole rows,
        the leading indices free of the map's variables.  Non-temporal stores write such a run
        without first reading it into the cache (kf/stream.h says why); anything else (a
        guard, a non-zero value, a strided or short run) is None, an ordinary loop."""
        st = s.body
        if (not isinstance(st, ir.Store) or st.buffer.scope != ir.Scope.GLOBAL or not _is_zero(st.value)
                or len(s.vars) > 2 or len(st.indices) < len(s.vars)):
            return None
        buf, idx, vs = st.buffer, st.indices, s.vars
        count = 1
        for e in s.extents:
            count *= e
        if count * buf.dtype.itemsize < STREAM_MIN_BYTES or idx[-1] is not vs[-1] or not _is(buf.strides[-1], 1):
            return None
        start = list(idx[:-1]) + [ir.const(0)]
        if len(vs) == 2:
            row, cols = idx[-2], s.extents[1]
            if not (_is(buf.shape[-1], cols) and _is(buf.strides[-2], cols)):
                return None
            if row is vs[0]:
                start[-2] = ir.const(0)
            elif isinstance(row, ir.Binary) and row.op == ir.Op.ADD and row.b is vs[0]:
                start[-2] = row.a
            else:
                return None
        if any(n is v for e in start for n in ir.walk(e) for v in vs):
            return None
        return f"kf::zero_stream(&{self.names[buf]}[{self.offset(buf, start)}], (int64_t){count})"

    def hoist_invariant_loads(self, s: ir.Parallel, out: list[str], pad: str) -> list[int]:
        """Evaluate, once before the loop nest, the subexpressions of ``s`` that read
        memory but do not depend on its variables (``block_table[bx, t]`` inside a
        paged copy's index).  g++ does not trust ``__restrict__`` on the arena tiles
        the loop stores to, so it would reload them every iteration and give up
        vectorising.  Only buffers the loop never writes, and only subexpressions
        the loop evaluates unconditionally (its statements and ``if`` conditions,
        not branches of ``?:``, ``&&``, ``||``), so nothing is read that the loop
        would not read anyway (extents are >= 1)."""
        loop_vars = set(map(id, s.vars))
        written = {id(b) for n in statements(s.body) if isinstance(n, (ir.Store, ir.Atomic))
                   for b in (n.buffer, getattr(n, "result", None)) if b is not None}
        found: dict[int, ir.Expr] = {}
        invariant_memo: dict[int, bool] = {}

        def invariant(e) -> bool:
            hit = invariant_memo.get(id(e))
            if hit is None:
                if isinstance(e, ir.Var):
                    hit = id(e) not in loop_vars
                elif isinstance(e, ir.Load):
                    hit = id(e.buffer) not in written and all(invariant(i) for i in e.indices)
                else:
                    hit = all(invariant(c) for c in ir.children(e) if isinstance(c, ir.Expr))
                invariant_memo[id(e)] = hit
            return hit

        def visit(e) -> None:
            if isinstance(e, (ir.Var, ir.Const)) or id(e) in found:
                return
            if invariant(e) and any(isinstance(n, ir.Load) for n in ir.walk(e)):
                found[id(e)] = e
                return
            if isinstance(e, ir.Select):
                visit(e.cond)
            elif isinstance(e, ir.Binary) and e.dtype.is_bool and e.op in (ir.Op.AND, ir.Op.OR):
                visit(e.a)
            else:
                for c in ir.children(e):
                    if isinstance(c, ir.Expr):
                        visit(c)

        def unconditional(st) -> None:
            if isinstance(st, ir.Seq):
                for x in st.body:
                    unconditional(x)
            elif isinstance(st, ir.If):
                visit(st.cond)
            elif isinstance(st, (ir.Store, ir.Atomic)):
                for e in st.indices + (st.value,):
                    visit(e)

        unconditional(s.body)
        for key, e in found.items():
            name = f"kf_inv{self.n_invariant}"
            self.n_invariant += 1
            out.append(f"{pad}const auto {name} = {self.expr(e)};")
            self.invariant[key] = name
        return list(found)

    def stmt_If(self, s: ir.If, out, pad, depth):
        out.append(f"{pad}if ({self.expr(s.cond)}) {{")
        self.block(s.then, out, depth + 1)
        if s.orelse is not None:
            out.append(pad + "} else {")
            self.block(s.orelse, out, depth + 1)
        out.append(pad + "}")

    def stmt_Store(self, s: ir.Store, out, pad, depth):
        out.append(f"{pad}{self.names[s.buffer]}[{self.offset(s.buffer, s.indices)}] = "
                   f"{self.store_value(s.value, s.buffer.dtype)};")

    def stmt_Atomic(self, s: ir.Atomic, out, pad, depth):
        ref = f"{self.names[s.buffer]}[{self.offset(s.buffer, s.indices)}]"
        value = self.store_value(s.value, s.buffer.dtype)
        if s.result is not None:
            self.fetch(s, ref, value, out, pad)
        elif s.buffer.scope == ir.Scope.GLOBAL:
            out.append(f"{pad}{self.atomic_op[s.op]}(&{ref}, {value});")
        elif s.op == ir.Op.ATOMIC_ADD:
            out.append(f"{pad}{ref} = {ref} + {value};")
        else:
            out.append(f"{pad}{ref} = kf::max_ignoring_nan({ref}, {value});")

    def fetch(self, s: ir.Atomic, ref: str, value: str, out, pad) -> None:
        """A fetch-and-op (``return_prev=True``): a real fetching atomic on global memory; on a
        block's own buffers a plain read-modify-write, exact because a block's threads run one
        after another here (thread maps are serial loops: no ``omp simd`` over an atomic), so
        same-element updates are numbered in thread order, as the interpreter numbers them."""
        res = f"{self.names[s.result]}[{self.offset(s.result, s.result_indices)}]"
        fn = {ir.Op.ATOMIC_ADD: "kf::atomic_fetch_add", ir.Op.ATOMIC_MAX: "kf::atomic_fetch_max"}[s.op]
        if s.buffer.scope == ir.Scope.GLOBAL:
            out.append(f"{pad}{res} = {fn}(&{ref}, {value});")
            return
        new = "kf_prev + kf_v" if s.op == ir.Op.ATOMIC_ADD else "kf::max_ignoring_nan(kf_prev, kf_v)"
        ct = self.ctype(s.buffer.dtype)
        out.append(f"{pad}{{ const {ct} kf_v = {value}; const {ct} kf_prev = {ref}; {ref} = {new}; "
                   f"{res} = kf_prev; }}")

    def stmt_Gemm(self, s: ir.Gemm, out, pad, depth):
        (m, ka), (a_rs, a_cs) = self.matrix(s.a, s.trans_a)
        (kb, n), (b_rs, b_cs) = self.matrix(s.b, s.trans_b)
        _, (c_rs, c_cs) = self.matrix(s.c, False)
        ct = self.gemm_compute[s.a.buffer.dtype]
        self.scratch.append(f"kf::gemm_scratch_bytes<{ct}, {m}, {n}, {ka}>()")
        out.append(f"{pad}kf::gemm<{ct}, {m}, {n}, {ka}, {a_rs}, {a_cs}, {b_rs}, {b_cs}, {c_rs}, {c_cs}, "
                   f"{'true' if s.clear_accum else 'false'}>({self.pointer(s.a)}, {self.pointer(s.b)}, "
                   f"{self.pointer(s.c)}, kf_scratch);")

    def stmt_Reduce(self, s: ir.Reduce, out, pad, depth):
        outer, n, inner = self.split(s.src, s.dim)
        low = s.src.dtype.is_low_precision or s.dst.dtype.is_low_precision
        ct = "float" if low else self.ctype(s.dst.dtype)
        out.append(f"{pad}kf::reduce<{self.reduce_op[s.op]}, {outer}, {n}, {inner}, "
                   f"{'true' if s.clear else 'false'}, {ct}>({self.names[s.src]}, {self.names[s.dst]});")

    def stmt_Cumsum(self, s: ir.Cumsum, out, pad, depth):
        outer, n, inner = self.split(s.src, s.dim)
        ct = "float" if s.dst.dtype.is_low_precision else self.ctype(s.dst.dtype)
        out.append(f"{pad}kf::cumsum<{outer}, {n}, {inner}, {'true' if s.reverse else 'false'}, {ct}>"
                   f"({self.names[s.src]}, {self.names[s.dst]});")

    # ------------------------------------------------------------------ tile operands
    def matrix(self, r: ir.Region, trans: bool) -> tuple[tuple[int, int], tuple[int, int]]:
        """Logical (rows, cols) of a 2-D tile operand and its element strides.  A global
        operand (``passes.gemm_layout``'s direct operands) has constant strides there."""
        if not all(isinstance(x, ir.Const) for x in r.buffer.strides):  # the layout pass guarantees this
            raise ir.KernelError(f"the CPU gemm needs constant operand strides, {r.buffer.name} has "
                                 f"{r.buffer.strides}")
        dims = [d for d, e in enumerate(r.extents) if e != 1] if len(r.extents) > 2 else [0, 1]
        dims = dims if len(dims) == 2 else list(range(len(r.extents)))[-2:]
        rows, cols = (r.extents[d] for d in dims)
        rs, cs = (int(r.buffer.strides[d].value) for d in dims)
        return ((cols, rows), (cs, rs)) if trans else ((rows, cols), (rs, cs))

    def pointer(self, r: ir.Region) -> str:
        return f"({self.names[r.buffer]} + {self.offset(r.buffer, r.starts)})"

    @staticmethod
    def split(b: ir.Buffer, dim: int) -> tuple[int, int, int]:
        shape = b.static_shape()
        outer = inner = 1
        for d in shape[:dim]:
            outer *= d
        for d in shape[dim + 1:]:
            inner *= d
        return outer, shape[dim], inner

    def stmt_Copy(self, s, out, pad, depth):
        raise ir.KernelError("internal: Copy reached the CPU renderer (the masks pass lowers it)", s.loc)

    stmt_Fill = stmt_Copy


@functools.lru_cache(maxsize=None)
def _environment(template_dir: str = TEMPLATE_DIR) -> jinja2.Environment:
    return template_environment(template_dir, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                                autoescape=False)


def _is(e, value: int) -> bool:
    return isinstance(e, ir.Const) and e.value == value


def _is_zero(e: ir.Expr) -> bool:
    """A constant whose bits are all zero (``+0.0``, not ``-0.0``), possibly under a cast."""
    while isinstance(e, ir.Cast):
        e = e.a
    return isinstance(e, ir.Const) and e.value == 0 and math.copysign(1.0, e.value) > 0
