"""The Ascend C renderer: tile IR -> one AIV kernel in Ascend C (docs/backends/ascend.md).

How each construct maps onto an AI Core's vector side (dav-c220 = 910B/A3 and dav-3510 = 950):

* the kernel is ``extern "C" __global__ __aicore__ void kf_<name>(GM_ADDR ..., scalars, int64_t
  symbols)`` of type ``KERNEL_TYPE_AIV_ONLY``; the grid is flattened and strided over the
  launched blocks (``GetBlockIdx``/``GetBlockNum``), so any grid runs on any core count;
* global buffers are ``GlobalTensor<T>``; every on-chip tile (shared, fragment, large locals)
  is a ``LocalTensor<T>`` carved from one ``TBuf<VECCALC>`` at the 32-byte-aligned offsets of
  the UB plan (``passes.allocate`` with liveness reuse); the plan must fit the arch's UB, or
  rendering fails with :class:`AscendCapacityError` naming the buffer that overflows;
* ``T.copy`` GM<->UB is ``DataCopyPad`` through ``kf_copy_in``/``kf_copy_out`` when
  :func:`copies.dma_plan` allows (32-byte-aligned UB rows, padded tails, out-of-bounds rows
  and columns clamped and zero-filled); other copies are element loops;
* ``T.fill`` of a whole tile is ``Duplicate``; ``T.reduce_max/min/sum`` of float/half rows
  whose length is a whole number of 32-byte blocks is ``ReduceMax/ReduceMin/ReduceSum`` per
  row; other reductions and every ``T.Parallel`` body run on the scalar unit
  (``GetValue``/``SetValue``): Ascend has no vector op for the integer key arithmetic, the
  gathers and the compactions of the library kernels, so the scalar form is the fallback
  (docs/backends/ascend.md lists what is vectorised);
* the pipes are synchronised explicitly around every DMA and vector instruction
  (``SetFlag``/``WaitFlag`` pairs, ``kf/sync.h``), so the ascend-emu shim's hazard tracking can
  check them; scalar stores to GM are flushed with ``DataCacheCleanAndInvalid`` at the end.

Not lowered (a typed :class:`AscendRenderError` at the author's line): ``T.gemm`` (the cube
path LoadData + Mmad + Fixpipe, which needs an AIC kernel and a GM workspace on 2201), atomics
on global buffers, fp8 tiles.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from typing import Optional

import jinja2

from kernforge import dtypes
from kernforge.backends.ascend import copies
from kernforge.codegen import ir
from kernforge.codegen.passes import Analysis, buffer_bytes, nonneg_vars, plan_memory, simplify, simplify_expr
from kernforge.codegen.passes import ranges
from kernforge.codegen.passes.warps import has_shuffle, split_shuffles
from kernforge.codegen.renderer import CRenderer, NameTable, Program, Renderer, Target, entry_symbol

TEMPLATE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")
INCLUDE_DIR = os.path.join(TEMPLATE_DIR, "include")


@dataclass(frozen=True)
class Arch:
    """One Ascend target: ``__NPU_ARCH__``, bisheng's arch names and the on-chip capacities (bytes)."""

    name: str
    npu_arch: int
    bisheng: str  # --npu-arch= (CANN >= 9, asc-devkit)
    legacy: str  # --cce-aicore-arch= (older CANN)
    ub: int
    l1: int
    l0a: int
    l0b: int
    l0c: int

    def capacity(self, memory: str) -> int:
        return getattr(self, memory.lower())


ARCHS = {
    "dav-c220": Arch("dav-c220", 2201, "dav-2201", "dav-c220", ub=192 * 1024, l1=512 * 1024 - 128,
                     l0a=64 * 1024, l0b=64 * 1024, l0c=128 * 1024),
    "dav-3510": Arch("dav-3510", 3510, "dav-3510", "dav-c310", ub=248 * 1024, l1=512 * 1024,
                     l0a=64 * 1024, l0b=64 * 1024, l0c=256 * 1024),
}
ALIASES = {"2201": "dav-c220", "dav-2201": "dav-c220", "910b": "dav-c220", "a3": "dav-c220",
           "3510": "dav-3510", "950": "dav-3510", "dav-c310": "dav-3510"}
DEFAULT_ARCH = "dav-c220"
# blocks a launch uses at most (910B: 24 AI cores x 2 AIV); the kernel strides over the rest of the grid
MAX_BLOCKS = 48


def arch_info(arch: Optional[str]) -> Arch:
    name = ALIASES.get((arch or DEFAULT_ARCH).lower(), (arch or DEFAULT_ARCH).lower())
    if name not in ARCHS:
        raise ValueError(f"ascend: unknown arch {arch!r}; known: {', '.join(ARCHS)} "
                         f"(aliases {', '.join(sorted(ALIASES))})")
    return ARCHS[name]


class AscendRenderError(ir.KernelError):
    """A construct the Ascend renderer does not lower (named, at the author's line)."""


class AscendCapacityError(ir.KernelError):
    """The kernel's tiles do not fit an on-chip memory of the target arch."""

    def __init__(self, message: str, *, buffer: str, memory: str, needed: int, capacity: int, loc=None):
        super().__init__(message, loc)
        self.buffer, self.memory, self.needed, self.capacity = buffer, memory, needed, capacity


@dataclass
class AscendProgram(Program):
    """A rendered Ascend C kernel and what launchers and ``kernforge build`` need."""

    arch: str = DEFAULT_ARCH
    npu_arch: int = 2201
    params: list = field(default_factory=list)  # (C name, C type, kind: gm|scalar|symbol)
    ub_bytes: int = 0
    usage: list = field(default_factory=list)  # (memory, buffer, offset, bytes) per placed buffer
    kernel_name: str = ""


@dataclass(frozen=True)
class UbPlan:
    """Where every UB tile lives, plus the vector reductions' work area at the end."""

    memory: object  # passes.allocate.MemoryPlan
    scratch_offset: int
    scratch_bytes: int

    @property
    def total(self) -> int:
        return self.scratch_offset + self.scratch_bytes


def _round32(n: int) -> int:
    return (n + 31) // 32 * 32


def vector_reduce(s: ir.Reduce) -> bool:
    """A row reduction the vector unit does: float/half rows of whole 32-byte blocks, last dim."""
    shape = s.src.static_shape() if s.src.is_static else ()
    return (s.op in (ir.Op.REDUCE_MAX, ir.Op.REDUCE_MIN, ir.Op.REDUCE_SUM) and copies.in_ub(s.src)
            and copies.in_ub(s.dst)
            and s.src.dtype == s.dst.dtype and s.src.dtype in (dtypes.float32, dtypes.float16)
            and bool(shape) and s.dim == len(shape) - 1 and (shape[-1] * s.src.dtype.itemsize) % 32 == 0)


_VEC_BINARY = {ir.Op.ADD: "Add", ir.Op.SUB: "Sub", ir.Op.MUL: "Mul", ir.Op.DIV: "Div", ir.Op.MAX: "Max",
               ir.Op.MIN: "Min"}
_VEC_SCALAR = {ir.Op.ADD: "Adds", ir.Op.SUB: "Adds", ir.Op.MUL: "Muls", ir.Op.MAX: "Maxs", ir.Op.MIN: "Mins"}
_VEC_UNARY = {ir.Op.EXP: "Exp", ir.Op.LOG: "Ln", ir.Op.SQRT: "Sqrt", ir.Op.ABS: "Abs"}
_COMMUTATIVE = (ir.Op.ADD, ir.Op.MUL, ir.Op.MAX, ir.Op.MIN)


def _dense(b: ir.Buffer, extents) -> bool:
    """``b`` is a static UB tile of shape ``extents`` in row-major order."""
    if not (copies.in_ub(b) and b.is_static and b.static_shape() == tuple(extents)):
        return False
    stride = 1
    for n, st in zip(reversed(b.static_shape()), reversed(b.strides)):
        if not (isinstance(st, ir.Const) and int(st.value) == stride):
            return False
        stride *= n
    return True


def vector_map(s: ir.Parallel) -> Optional[list]:
    """The vector form of a ``T.Parallel`` map, or None (scalar loops).  Matches one store of a
    whole dense float tile ``dst[vars] = f(...)`` whose value is a chain of element-wise ops
    (Add Sub Mul Div Max Min between tiles; Adds Muls Maxs Mins with a loop-invariant scalar;
    Exp Ln Sqrt Abs), each evaluated in place in ``dst``: a list of ``(op, first source tile,
    other operand: tile, scalar expression or None)`` steps, innermost first.  Every step
    rounds to the tile's dtype, so chains are float32 only (half: one op, which is what the
    IR's compute-in-float-then-round gives)."""
    body = s.body.body[0] if isinstance(s.body, ir.Seq) and len(s.body.body) == 1 else s.body
    if not isinstance(body, ir.Store) or body.buffer.dtype not in (dtypes.float32, dtypes.float16):
        return None
    dst, vars_ = body.buffer, tuple(s.vars)
    if len(body.indices) != len(vars_) or any(i is not v for i, v in zip(body.indices, vars_)):
        return None
    if not _dense(dst, s.extents):
        return None
    loop = set(map(id, vars_))

    def tile(e) -> Optional[ir.Buffer]:
        if (isinstance(e, ir.Load) and e.dtype == dst.dtype and len(e.indices) == len(vars_)
                and all(i is v for i, v in zip(e.indices, vars_)) and _dense(e.buffer, s.extents)):
            return e.buffer
        return None

    def scalar(e) -> bool:
        return e.dtype == dst.dtype and not any((isinstance(n, ir.Var) and id(n) in loop)
                                                or (isinstance(n, ir.Load) and n.buffer is dst) for n in ir.walk(e))

    steps = []
    node = body.value
    while True:
        if tile(node) is not None:
            break
        if isinstance(node, ir.Unary) and node.op in _VEC_UNARY and node.dtype == dst.dtype:
            steps.append((node.op, None))
            node = node.a
        elif isinstance(node, ir.Binary) and node.op in _VEC_BINARY and node.dtype == dst.dtype:
            a, b = node.a, node.b
            if node.op in _COMMUTATIVE and (tile(a) is not None or scalar(a)) and tile(b) is None and not scalar(b):
                a, b = b, a
            if tile(b) is not None:
                steps.append((node.op, tile(b)))
            elif scalar(b) and node.op in _VEC_SCALAR:
                steps.append((node.op, b))
            else:
                return None
            node = a
        else:
            return None
    if not steps or (len(steps) > 1 and dst.dtype != dtypes.float32):
        return None
    first = tile(node)
    steps.reverse()
    # after the first step dst holds partial results: later steps must not read the old dst
    if any(isinstance(o, ir.Buffer) and o is dst for _, o in steps[1:]):
        return None
    return [(op, first, other) for op, other in steps]


def plan_ub(kernel: ir.Kernel, arch: Arch) -> UbPlan:
    """The UB plan; :class:`AscendCapacityError` naming the first buffer past the arch's UB."""
    mem = plan_memory(kernel, copies.in_ub, align=32)
    scratch = 0
    for n in ranges.statements(kernel.body):
        if isinstance(n, ir.Reduce) and vector_reduce(n):
            scratch = max(scratch, _round32(n.src.static_shape()[-1] * n.src.dtype.itemsize) + 32)
    plan = UbPlan(mem, mem.total, scratch)
    if plan.total > arch.ub:
        over = [s for s in mem.slots if s.offset + s.size > arch.ub]
        name = over[0].buffer.name if over else "reduction work area"
        loc = next((n.loc for n in ranges.statements(kernel.body)
                    if over and isinstance(n, ir.Allocate) and n.buffer is over[0].buffer), None)
        raise AscendCapacityError(
            f"ascend {arch.name}: the tiles need {plan.total} bytes of UB, {arch.ub} exist; buffer {name!r} "
            f"ends past the end of UB (largest: "
            + ", ".join(f"{s.buffer.name} {s.size} B" for s in sorted(mem.slots, key=lambda s: -s.size)[:4]) + ")",
            buffer=name, memory="UB", needed=plan.total, capacity=arch.ub, loc=loc)
    return plan


class AscendRenderer(CRenderer, Renderer):
    """``render(kernel, target) -> AscendProgram``: one AIV kernel in Ascend C."""

    name = "ascend"
    type_map = {**CRenderer.type_map, dtypes.float16: "half", dtypes.bfloat16: "bfloat16_t"}
    reduce_helper = {ir.Op.REDUCE_MAX: "kf::Reduce::Max", ir.Op.REDUCE_MIN: "kf::Reduce::Min",
                     ir.Op.REDUCE_SUM: "kf::Reduce::Sum"}
    vector_reduce_op = {ir.Op.REDUCE_MAX: "ReduceMax", ir.Op.REDUCE_MIN: "ReduceMin", ir.Op.REDUCE_SUM: "ReduceSum"}

    def __init__(self):
        super().__init__()
        self.names = NameTable()
        self.plan: Optional[UbPlan] = None
        self.gm_written: set = set()
        self.n_scalars = 0  # loop-invariant scalar operands of vector maps (kf_vs<n>)

    def ctype(self, dt: dtypes.DType) -> str:
        if dt.is_float and dt.bits == 8:
            raise AscendRenderError(f"ascend: {dt} tiles are not supported (no fp8 on 910B; the 950 path is not "
                                    f"written yet)")
        return self.type_map[dt]

    def var_name(self, v: ir.Var) -> str:
        return self.names[v]

    def buffer_name(self, b: ir.Buffer) -> str:
        return self.names[b]

    # ------------------------------------------------------------------ pipeline
    def pipeline(self, kernel: ir.Kernel, target: Target) -> tuple:
        """simplify, lower the copies that cannot be DMA (edge masks), simplify; then the C
        names, the non-negative variables and the UB plan (whose capacity check is the render-time
        error of a tile that does not fit)."""
        if target.checks:
            raise AscendRenderError("ascend: checked mode is not supported (the ascend-emu shim checks every "
                                    "access itself)")
        arch = arch_info(target.arch)
        # warp shuffles: Ascend runs a thread region as a loop over threads, split at each shuffle
        shuffles = (split_shuffles,) if has_shuffle(kernel.body) else ()
        return shuffles + (simplify, copies.lower_other_copies, simplify,
                Analysis("names", lambda k, facts: NameTable.for_kernel(k)),
                Analysis("nonneg_vars", lambda k, facts: nonneg_vars(k)),
                Analysis("var_ranges", lambda k, facts: ranges.var_ranges(k)),
                Analysis("ub_plan", lambda k, facts: plan_ub(k, arch)))

    def emit_program(self, k: ir.Kernel, facts: dict, target: Target) -> AscendProgram:
        arch = arch_info(target.arch)
        self.names = facts["names"]
        self.nonneg_vars = facts["nonneg_vars"]
        self.table = facts["var_ranges"]
        self.plan = facts["ub_plan"]
        self.gm_written = {n.buffer for n in ranges.statements(k.body)
                           if isinstance(n, (ir.Store, ir.Atomic)) and n.buffer.scope == ir.Scope.GLOBAL}
        body: list[str] = []
        self.block(k.body, body, 0)
        params, gm_lines = [], []
        for p in k.params:
            n = self.names[p]
            if isinstance(p, ir.Buffer):
                t = self.ctype(p.dtype)
                params.append((f"kf_gm_{n}", "GM_ADDR", "gm"))
                gm_lines.append(f"AscendC::GlobalTensor<{t}> {n};")
                gm_lines.append(f"{n}.SetGlobalBuffer(reinterpret_cast<__gm__ {t}*>(kf_gm_{n}));")
            else:
                params.append((n, self.ctype(p.dtype), "scalar"))
        for s in k.symbols:
            params.append((f"kf_sym_{self.names[s]}", "int64_t", "symbol"))
        symbol_lines = [f"const {self.ctype(s.dtype)} {self.names[s]} = static_cast<{self.ctype(s.dtype)}>"
                        f"(kf_sym_{self.names[s]});" for s in k.symbols]
        grid = [f"kf_grid{d}" for d in range(len(k.grid))]
        usage = [("UB", s.buffer.name, s.offset, s.size) for s in self.plan.memory.slots]
        if self.plan.scratch_bytes:
            usage.append(("UB", "(reduction work area)", self.plan.scratch_offset, self.plan.scratch_bytes))
        flush = [f"AscendC::DataCacheCleanAndInvalid<{self.ctype(b.dtype)}, AscendC::CacheLine::ENTIRE_DATA_CACHE, "
                 f"AscendC::DcciDst::CACHELINE_OUT>({self.names[b]});"
                 for b in k.params if isinstance(b, ir.Buffer) and b in self.gm_written]
        # block index -> block variables, innermost grid dimension fastest
        block_lines, rest = [], "kf_block"
        for d, (v, g) in enumerate(zip(k.block_vars, grid)):
            last = d == len(grid) - 1
            block_lines.append(f"const int32_t {self.names[v]} = static_cast<int32_t>("
                               + (f"{rest});" if last else f"{rest} % {g});"))
            if not last:
                block_lines.append(f"const int64_t kf_block{d + 1} = {rest} / {g};")
                rest = f"kf_block{d + 1}"
        source = _environment().get_template("kernel.cpp.j2").render(
            kernel_name=k.name, entry=entry_symbol(k), arch=arch, attrs=repr(dict(sorted(k.attrs.items()))),
            params=", ".join(f"{t} {n}" for n, t, _ in params), gm_lines=gm_lines, symbol_lines=symbol_lines,
            ub_bytes=max(32, self.plan.total), grid_lines=[f"const int64_t {g} = static_cast<int64_t>({self.expr(e)});"
                                                           for g, e in zip(grid, k.grid)],
            grid_total=" * ".join(grid) or "1", block_lines=block_lines, body_lines=body, flush_lines=flush,
            usage=usage)
        return AscendProgram(source, entry_symbol(k), arch=arch.name, npu_arch=arch.npu_arch, params=params,
                             ub_bytes=self.plan.total, usage=usage, kernel_name=k.name)

    # ------------------------------------------------------------------ memory access
    def on_stack(self, b: ir.Buffer) -> bool:
        return b.scope != ir.Scope.GLOBAL and not copies.in_ub(b)

    def load(self, e: ir.Load) -> str:
        b = e.buffer
        if self.on_stack(b):
            return f"{self.names[b]}[{self.offset(b, e.indices)}]"
        return f"{self.names[b]}.GetValue({self.offset(b, e.indices)})"

    def store(self, b: ir.Buffer, indices, value: str) -> str:
        if self.on_stack(b):
            return f"{self.names[b]}[{self.offset(b, indices)}] = {value};"
        return f"{self.names[b]}.SetValue({self.offset(b, indices)}, {value});"

    # ------------------------------------------------------------------ statements
    def stmt(self, s: ir.Stmt, out: list[str], depth: int) -> None:
        fn = getattr(self, "stmt_" + type(s).__name__, None)
        if fn is None:
            raise AscendRenderError(f"ascend: {type(s).__name__} is not supported by the Ascend renderer", s.loc)
        fn(s, out, "  " * depth, depth)

    def block(self, s: ir.Stmt, out: list[str], depth: int) -> None:
        for x in (s.body if isinstance(s, ir.Seq) else (s,)):
            self.stmt(x, out, depth)

    def stmt_Seq(self, s: ir.Seq, out, pad, depth):
        scoped = depth > 0 and any(isinstance(x, ir.Allocate) for x in s.body)
        if scoped:
            out.append(pad + "{")
        self.block(s, out, depth + 1 if scoped else depth)
        if scoped:
            out.append(pad + "}")

    def stmt_Sync(self, s, out, pad, depth):
        """One AIV runs the block: the pipes are ordered by the flags around each instruction."""

    def stmt_Allocate(self, s: ir.Allocate, out, pad, depth):
        b, t = s.buffer, self.ctype(s.buffer.dtype)
        if self.on_stack(b):
            out.append(f"{pad}{t} {self.names[b]}[{buffer_bytes(b) // b.dtype.itemsize}];")
        else:
            slot = self.plan.memory.offset(b)
            # the tensor spans the buffer's whole 32-byte-rounded slot: DataCopyPad pads rows to 32 bytes
            out.append(f"{pad}AscendC::LocalTensor<{t}> {self.names[b]} = "
                       f"kf_ub.GetWithOffset<{t}>({_round32(buffer_bytes(b)) // b.dtype.itemsize}, {slot});")

    def stmt_For(self, s: ir.For, out, pad, depth):
        v, t = self.names[s.var], self.ctype(s.var.dtype)
        end = simplify_expr(ir.binary(ir.Op.ADD, s.start, s.extent))
        out.append(f"{pad}const {t} kf_end_{v} = {self.cast_to(end, s.var.dtype)};")
        if s.kind == ir.LoopKind.PIPELINED:
            out.append(f"{pad}// T.Pipelined(num_stages={s.num_stages}): stages run in order (each copy waits)")
        out.append(f"{pad}for ({t} {v} = {self.cast_to(s.start, s.var.dtype)}; {v} < kf_end_{v}; ++{v}) {{")
        self.block(s.body, out, depth + 1)
        out.append(pad + "}")

    def stmt_Parallel(self, s: ir.Parallel, out, pad, depth):
        steps = vector_map(s)
        if steps is not None:
            self.emit_vector_map(s, steps, out, pad)
            return
        for level, (v, e) in enumerate(zip(s.vars, s.extents)):
            name = self.names[v]
            out.append(f"{'  ' * (depth + level)}for ({self.ctype(v.dtype)} {name} = 0; {name} < {e}; ++{name}) {{")
        self.block(s.body, out, depth + len(s.vars))
        for level in reversed(range(len(s.vars))):
            out.append("  " * (depth + level) + "}")

    def emit_vector_map(self, s: ir.Parallel, steps: list, out: list[str], pad: str) -> None:
        """A :func:`vector_map` as vector instructions on whole tiles (count form: the API
        masks the tail of the last 256-byte repeat), between S->V and V->S flags."""
        dst = self.names[s.body.buffer]
        t = self.ctype(s.body.buffer.dtype)
        n = 1
        for e in s.extents:
            n *= e
        lines = []
        for i, (op, src, other) in enumerate(steps):
            a = self.names[src] if i == 0 else dst
            if other is None:
                lines.append(f"AscendC::{_VEC_UNARY[op]}({dst}, {a}, {n});")
            elif isinstance(other, ir.Buffer):
                lines.append(f"AscendC::{_VEC_BINARY[op]}({dst}, {a}, {self.names[other]}, {n});")
            else:
                value = self.store_value(other, s.body.buffer.dtype)
                if op == ir.Op.SUB:
                    value = f"-({value})"
                name = f"kf_vs{self.n_scalars}"
                self.n_scalars += 1
                out.append(f"{pad}const {t} {name} = static_cast<{t}>({value});")
                lines.append(f"AscendC::{_VEC_SCALAR[op]}({dst}, {a}, {name}, {n});")
        out.append(f"{pad}kf::sync<AscendC::HardEvent::S_V>();")
        out.extend(pad + x for x in lines)
        out.append(f"{pad}kf::sync<AscendC::HardEvent::V_S>();")

    def stmt_If(self, s: ir.If, out, pad, depth):
        out.append(f"{pad}if ({self.expr(s.cond)}) {{")
        self.block(s.then, out, depth + 1)
        if s.orelse is not None:
            out.append(pad + "} else {")
            self.block(s.orelse, out, depth + 1)
        out.append(pad + "}")

    def stmt_Store(self, s: ir.Store, out, pad, depth):
        out.append(pad + self.store(s.buffer, s.indices, self.store_value(s.value, s.buffer.dtype)))

    def stmt_Atomic(self, s: ir.Atomic, out, pad, depth):
        if s.buffer.scope == ir.Scope.GLOBAL:
            raise AscendRenderError("ascend: atomics on global buffers (SetAtomicAdd + DataCopy) are not lowered "
                                    "yet", s.loc)
        old = self.load(ir.Load(s.buffer, s.indices))
        value = self.store_value(s.value, s.buffer.dtype)
        t = self.ctype(s.buffer.dtype)
        new = (f"static_cast<{t}>({old} + {value})" if s.op == ir.Op.ATOMIC_ADD
               else f"kf_max({old}, {value})")
        out.append(pad + self.store(s.buffer, s.indices, new))

    def stmt_Copy(self, s: ir.Copy, out, pad, depth):
        p = copies.dma_plan(s, self.table)
        if p is None:
            raise AscendRenderError("internal: a non-DMA Copy reached the Ascend renderer", s.loc)
        gm, ub = self.names[p.gm.buffer], self.names[p.ub.buffer]
        gm_off = self.offset(p.gm.buffer, p.gm_start)
        args = (f"{p.rows}, {p.cols}, {p.ub_pitch}, {self.expr(p.valid_rows)}, {self.expr(p.valid_cols)}, "
                f"static_cast<uint64_t>({self.expr(p.gm_pitch)})")
        if p.direction == "in":
            out.append(f"{pad}kf::copy_in({ub}[{p.ub_start}], {gm}[{gm_off}], {args});")
        else:
            out.append(f"{pad}kf::copy_out({gm}[{gm_off}], {ub}[{p.ub_start}], {args});")

    def stmt_Fill(self, s: ir.Fill, out, pad, depth):
        if not copies.duplicate_fill(s):
            raise AscendRenderError("internal: a non-Duplicate Fill reached the Ascend renderer", s.loc)
        b = s.dst.buffer
        t = self.ctype(b.dtype)
        out.append(f"{pad}kf::fill({self.names[b]}, static_cast<{t}>({self.store_value(s.value, b.dtype)}), "
                   f"{buffer_bytes(b) // b.dtype.itemsize});")

    def stmt_Reduce(self, s: ir.Reduce, out, pad, depth):
        shape = s.src.static_shape()
        outer = inner = 1
        for d in shape[:s.dim]:
            outer *= d
        for d in shape[s.dim + 1:]:
            inner *= d
        n = shape[s.dim]
        clear = "true" if s.clear else "false"
        if vector_reduce(s):
            t = self.ctype(s.src.dtype)
            work = f"kf_ub.GetWithOffset<{t}>({(self.plan.scratch_bytes - 32) // s.src.dtype.itemsize}, " \
                   f"{self.plan.scratch_offset})"
            res = f"kf_ub.GetWithOffset<{t}>({32 // s.src.dtype.itemsize}, " \
                  f"{self.plan.scratch_offset + self.plan.scratch_bytes - 32})"
            out.append(f"{pad}kf::vector_reduce<kf::VReduce::{self.vector_reduce_op[s.op][6:]}, {outer}, {n}, {clear}>("
                       f"{self.names[s.src]}, {self.names[s.dst]}, {work}, {res});")
            return
        if self.on_stack(s.src) or self.on_stack(s.dst):
            raise AscendRenderError("ascend: reductions over small local arrays are not lowered", s.loc)
        low = s.src.dtype.is_low_precision or s.dst.dtype.is_low_precision
        ct = "float" if low else self.ctype(s.dst.dtype)
        out.append(f"{pad}kf::reduce<{self.reduce_helper[s.op]}, {outer}, {n}, {inner}, {clear}, {ct}>("
                   f"{self.names[s.src]}, {self.names[s.dst]});")

    def stmt_Cumsum(self, s: ir.Cumsum, out, pad, depth):
        shape = s.src.static_shape()
        outer = inner = 1
        for d in shape[:s.dim]:
            outer *= d
        for d in shape[s.dim + 1:]:
            inner *= d
        ct = "float" if s.dst.dtype.is_low_precision else self.ctype(s.dst.dtype)
        out.append(f"{pad}kf::cumsum<{outer}, {shape[s.dim]}, {inner}, {'true' if s.reverse else 'false'}, {ct}>("
                   f"{self.names[s.src]}, {self.names[s.dst]});")

    def stmt_Gemm(self, s: ir.Gemm, out, pad, depth):
        raise AscendRenderError("ascend: T.gemm (LoadData + Mmad + Fixpipe on the cube core, with a GM workspace "
                                "between AIC and AIV on dav-c220) is not lowered yet", s.loc)


def unsupported(kernel: ir.Kernel) -> Optional[str]:
    """Why the Ascend renderer cannot lower ``kernel`` (None: it can), for tools that run every
    library kernel (``kernforge demo``) and must skip rather than fail what is not written yet."""
    for n in ranges.statements(kernel.body):
        if isinstance(n, ir.Gemm):
            return "T.gemm needs the cube path (LoadData + Mmad + Fixpipe), not lowered yet"
        if isinstance(n, ir.Atomic) and n.buffer.scope == ir.Scope.GLOBAL:
            return "atomics on global buffers are not lowered yet"
        if isinstance(n, ir.Allocate) and n.buffer.dtype.is_float and n.buffer.dtype.bits == 8:
            return f"{n.buffer.dtype} tiles are not supported"
    for p in kernel.buffer_params:
        if p.dtype.is_float and p.dtype.bits == 8:
            return f"{p.dtype} buffers are not supported"
    return None


@functools.lru_cache(maxsize=None)
def _environment() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATE_DIR), undefined=jinja2.StrictUndefined,
                              trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True, autoescape=False)


def render_ascend(kernel: ir.Kernel, arch: Optional[str] = None) -> AscendProgram:
    return AscendRenderer().render(kernel, Target("ascend", arch_info(arch).name))
