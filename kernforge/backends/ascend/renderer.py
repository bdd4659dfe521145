"""The Ascend C renderer: tile IR -> an AIV kernel (or a MIX kernel for ``T.gemm``) in Ascend C
(docs/backends/ascend.md).

How each construct maps onto an AI Core (dav-c220 = 910B/A3 and dav-3510 = 950):

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
  row; float ``T.Parallel`` maps of whole tiles are vector instructions (:func:`vector_map`);
  other reductions and maps run on the scalar unit (``GetValue``/``SetValue``): Ascend has no
  vector op for the integer key arithmetic, the gathers and the compactions of the library
  kernels, so the scalar form is the fallback (docs/backends/ascend.md lists what is vectorised);
* ``T.gemm`` makes the kernel ``KERNEL_TYPE_MIX_AIC_1_2`` (:mod:`.cube`, ``kf/cube.h``): the AIVs
  run the body above and hand each gemm's UB tiles to their group's AIC through a GM workspace
  (the last parameter, ``kf_gm_workspace``); the AIC serves the requests with Nd2Nz DataCopy,
  LoadData, Mmad and Fixpipe; on dav-3510 the tiles go UB -> L1 and the product L0C -> UB
  directly, the workspace keeping only the op words; L1/L0A/L0B/L0C capacities are checked at
  render time;
* the pipes are synchronised explicitly around every DMA, vector and cube instruction
  (``SetFlag``/``WaitFlag`` pairs, ``kf/sync.h``), so the ascend-emu shim's hazard tracking can
  check them; scalar stores to GM are flushed with ``DataCacheCleanAndInvalid`` at the end.

Not lowered (a typed :class:`AscendRenderError` at the author's line): gemms off the cube path
(:func:`cube.gemm_problem`), atomics on global buffers, fp8 tiles.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from typing import Optional

import jinja2

from kernforge import dtypes
from kernforge.backends.ascend import copies, cube, stages
from kernforge.backends.templates import environment as template_environment
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
    fp8: bool = False  # fp8 e4m3 tiles, buffers and cube operands (950 only)
    direct_cv: bool = False  # UB -> L1 and L0C -> UB paths: T.gemm's data skips GM (950 only, cube.py)

    def capacity(self, memory: str) -> int:
        return getattr(self, memory.lower())


ARCHS = {
    "dav-c220": Arch("dav-c220", 2201, "dav-2201", "dav-c220", ub=192 * 1024, l1=512 * 1024 - 128,
                     l0a=64 * 1024, l0b=64 * 1024, l0c=128 * 1024),
    "dav-3510": Arch("dav-3510", 3510, "dav-3510", "dav-c310", ub=248 * 1024, l1=512 * 1024,
                     l0a=64 * 1024, l0b=64 * 1024, l0c=256 * 1024, fp8=True, direct_cv=True),
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
    mix: bool = False  # T.gemm: a MIX kernel (1 AIC + 2 AIV per group) with a GM workspace
    workspace_group_bytes: int = 0  # workspace bytes per group (the last parameter, kind "workspace")
    direct_cv: bool = False  # dav-3510: the gemms' data goes UB -> L1 / L0C -> UB, the workspace holds op words


@dataclass(frozen=True)
class UbPlan:
    """Where every UB tile lives, plus the vector reductions' work area at the end."""

    memory: object  # passes.allocate.MemoryPlan
    scratch_offset: int
    scratch_bytes: int
    stages: tuple = ()  # stages.Stage: tiles in double-buffered TQues, carved after the TBuf

    @property
    def total(self) -> int:
        """Bytes of the TBuf (the arena plus the work area)."""
        return self.scratch_offset + self.scratch_bytes

    @property
    def queue_bytes(self) -> int:
        return sum(2 * s.bytes for s in self.stages)


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


def plan_ub(kernel: ir.Kernel, arch: Arch, cube_plan: Optional[cube.CubePlan] = None, staged: tuple = ()) -> UbPlan:
    """The UB plan; :class:`AscendCapacityError` naming the first buffer past the arch's UB.
    The work area at the end serves the vector reductions and the gemms' fp32 products; the
    staged tiles' double buffers (``staged``) follow the TBuf."""
    queued = {id(s.tile) for s in staged}
    mem = plan_memory(kernel, lambda b: copies.in_ub(b) and id(b) not in queued, align=32)
    scratch = cube_plan.product_bytes if cube_plan else 0
    for n in ranges.statements(kernel.body):
        if isinstance(n, ir.Reduce) and vector_reduce(n):
            scratch = max(scratch, _round32(n.src.static_shape()[-1] * n.src.dtype.itemsize) + 32)
    plan = UbPlan(mem, mem.total, scratch, tuple(staged))
    end = plan.total
    for s in staged:
        end += 2 * s.bytes
        if end > arch.ub:
            raise AscendCapacityError(
                f"ascend {arch.name}: the tiles need {plan.total + plan.queue_bytes} bytes of UB, {arch.ub} exist; "
                f"the double buffer of T.Pipelined tile {s.tile.name!r} ends past the end of UB",
                buffer=s.tile.name, memory="UB", needed=plan.total + plan.queue_bytes, capacity=arch.ub, loc=s.loop.loc)
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
        self.arch = ARCHS[DEFAULT_ARCH]
        self.names = NameTable()
        self.plan: Optional[UbPlan] = None
        self.gm_written: set = set()
        self.n_scalars = 0  # loop-invariant scalar operands of vector maps (kf_vs<n>)

    def ctype(self, dt: dtypes.DType) -> str:
        if dt == dtypes.float8_e4m3:  # fp8_e4m3fn_t on dav-3510; scalar bytes on dav-c220 (kf/scalar.h)
            return "kf_fp8_e4m3"
        if dt.is_float and dt.bits == 8:
            raise AscendRenderError(f"ascend {self.arch.name}: {dt} is not supported (only float8_e4m3)")
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
        arch = self.arch = arch_info(target.arch)
        check_fp8(kernel, arch)
        # warp shuffles: Ascend runs a thread region as a loop over threads, split at each shuffle
        shuffles = (split_shuffles,) if has_shuffle(kernel.body) else ()
        return shuffles + (simplify, copies.lower_other_copies, simplify,
                Analysis("names", lambda k, facts: NameTable.for_kernel(k)),
                Analysis("nonneg_vars", lambda k, facts: nonneg_vars(k)),
                Analysis("var_ranges", lambda k, facts: ranges.var_ranges(k)),
                Analysis("cube_plan", lambda k, facts: cube.plan_cube(k, arch, AscendCapacityError, AscendRenderError)),
                Analysis("stages", lambda k, facts: stages.plan_stages(k, facts["var_ranges"])),
                Analysis("ub_plan", lambda k, facts: plan_ub(k, arch, facts["cube_plan"], facts["stages"])))

    def emit_program(self, k: ir.Kernel, facts: dict, target: Target) -> AscendProgram:
        arch = self.arch = arch_info(target.arch)
        self.names = facts["names"]
        self.nonneg_vars = facts["nonneg_vars"]
        self.table = facts["var_ranges"]
        self.plan = facts["ub_plan"]
        self.cube = facts["cube_plan"]
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
        if self.cube:
            params.append(("kf_gm_workspace", "GM_ADDR", "workspace"))
        symbol_lines = [f"const {self.ctype(s.dtype)} {self.names[s]} = static_cast<{self.ctype(s.dtype)}>"
                        f"(kf_sym_{self.names[s]});" for s in k.symbols]
        grid = [f"kf_grid{d}" for d in range(len(k.grid))]
        usage = [("UB", s.buffer.name, s.offset, s.size) for s in self.plan.memory.slots]
        if self.plan.scratch_bytes:
            usage.append(("UB", "(reduction / gemm product work area)", self.plan.scratch_offset,
                          self.plan.scratch_bytes))
        offset = _round32(self.plan.total)
        for st in self.plan.stages:
            for half in (0, 1):
                usage.append(("UB", f"{st.tile.name} (T.Pipelined buffer {half})", offset, st.bytes))
                offset += st.bytes
        if self.cube:
            usage += cube.usage(self.cube)
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
            ub_bytes=max(32, self.plan.total), queue_lines=self.queue_lines(),
            grid_lines=[f"const int64_t {g} = static_cast<int64_t>({self.expr(e)});" for g, e in zip(grid, k.grid)],
            grid_total=" * ".join(grid) or "1", block_lines=block_lines, body_lines=body, flush_lines=flush,
            usage=usage, cube=self.cube, cube_lines=self.cube_server() if self.cube else [])
        return AscendProgram(source, entry_symbol(k), arch=arch.name, npu_arch=arch.npu_arch, params=params,
                             ub_bytes=self.plan.total + self.plan.queue_bytes, usage=usage, kernel_name=k.name,
                             mix=self.cube is not None,
                             workspace_group_bytes=self.cube.group_bytes if self.cube else 0,
                             direct_cv=bool(self.cube and self.cube.direct))

    def queue_lines(self) -> list[str]:
        """A TQue of two buffers per staged T.Pipelined tile, carved after the TBuf."""
        out = []
        for st in self.plan.stages:
            out.append(f"AscendC::TQue<AscendC::TPosition::VECIN, 1> kf_q{st.queue};")
            out.append(f"kf_pipe.InitBuffer(kf_q{st.queue}, 2, {st.bytes});")
        return out

    def cube_server(self) -> list[str]:
        """The AIC's loop: each round (both AIVs asked, mode 2) serve each AIV's op, then
        write the group's done word (1 when both were idle) and answer."""
        p = self.cube
        lines = [f"switch (kf::gm_load_word(kf_slot)) {{"]
        for s in p.sites:
            if p.direct:  # L1 half of AIV kf_sub -> its UB work area (dav-3510)
                a_half, b_half = p.l1_halves
                lines.append(f"  case {s.op}: kf::cube_gemm_direct<{self.ctype(s.dtype)}, {s.m}, {s.n}, {s.k}, "
                             f"{str(s.stmt.trans_a).lower()}, {str(s.stmt.trans_b).lower()}>(kf_sub, {a_half}, "
                             f"{b_half}, kf_cb, kf_ub_view.GetWithOffset<float>({s.m * _round16(s.n)}, "
                             f"{self.plan.scratch_offset})); kf_live = true; break;")
                continue
            lines.append(f"  case {s.op}: kf::cube_gemm<{self.ctype(s.dtype)}, {s.m}, {s.n}, {s.k}, "
                         f"{str(s.stmt.trans_a).lower()}, {str(s.stmt.trans_b).lower()}>(kf_slot, {p.a_off}, "
                         f"{p.b_off}, {p.c_off}, kf_cb); kf_live = true; break;")
        lines.append("  default: break;")
        lines.append("}")
        return lines

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
        if any(st.tile is b for st in self.plan.stages):
            return  # a T.Pipelined stage: each iteration's tensor comes from its queue's DeQue
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
        staged = [st for st in self.plan.stages if st.loop is s]
        if staged:
            self.emit_staged_loop(s, staged, out, pad, depth)
            return
        if s.kind == ir.LoopKind.PIPELINED:
            out.append(f"{pad}// T.Pipelined(num_stages={s.num_stages}): stages run in order (each copy waits)")
        out.append(f"{pad}for ({t} {v} = {self.cast_to(s.start, s.var.dtype)}; {v} < kf_end_{v}; ++{v}) {{")
        self.block(s.body, out, depth + 1)
        out.append(pad + "}")

    def emit_staged_loop(self, s: ir.For, staged: list, out: list[str], pad: str, depth: int) -> None:
        """A T.Pipelined loop with double-buffered TQue stages (:mod:`.stages`): the first
        iteration's copies before the loop; in iteration k, DeQue k's tiles, issue k + 1's copies
        into the other buffers, run the rest of the body, FreeTensor."""
        v, t = self.names[s.var], self.ctype(s.var.dtype)
        inner = pad + "  "

        def issue(lines_pad: str, copy_of) -> None:
            for st in staged:
                tt = self.ctype(st.tile.dtype)
                out.append(f"{lines_pad}{{")
                out.append(f"{lines_pad}  AscendC::LocalTensor<{tt}> kf_next = kf_q{st.queue}.AllocTensor<{tt}>();")
                out.append(f"{lines_pad}  " + self.copy_line(copy_of(st), "kf_next", wait=False))
                out.append(f"{lines_pad}  kf_q{st.queue}.EnQue(kf_next);")
                out.append(f"{lines_pad}}}")

        out.append(f"{pad}// T.Pipelined(num_stages={s.num_stages}): double-buffered TQue stages for "
                   + ", ".join(st.tile.name for st in staged))
        out.append(f"{pad}if ({self.cast_to(s.start, s.var.dtype)} < kf_end_{v}) {{")
        issue(inner, stages.first_copy)
        out.append(pad + "}")
        out.append(f"{pad}for ({t} {v} = {self.cast_to(s.start, s.var.dtype)}; {v} < kf_end_{v}; ++{v}) {{")
        for st in staged:
            tt = self.ctype(st.tile.dtype)
            out.append(f"{inner}AscendC::LocalTensor<{tt}> {self.names[st.tile]} = kf_q{st.queue}.DeQue<{tt}>();")
        out.append(f"{inner}kf::sync<AscendC::HardEvent::MTE2_S>();  // scalar readers of the stages")
        out.append(f"{inner}if ({v} + 1 < kf_end_{v}) {{")
        issue(inner + "  ", stages.next_copy)
        out.append(inner + "}")
        copies_ = {id(st.copy) for st in staged}
        body = s.body.body if isinstance(s.body, ir.Seq) else (s.body,)
        for x in body:
            if id(x) not in copies_:
                self.stmt(x, out, depth + 1)
        for st in staged:
            out.append(f"{inner}kf_q{st.queue}.FreeTensor({self.names[st.tile]});")
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
        out.append(pad + self.copy_line(s))

    def copy_line(self, s: ir.Copy, ub_name: Optional[str] = None, wait: bool = True) -> str:
        """``kf::copy_in/copy_out`` of a DMA copy (``ub_name``: the UB tensor to use instead of
        the tile's; ``wait`` False: a staged copy, ordered by its queue instead of flags)."""
        p = copies.dma_plan(s, self.table)
        if p is None:
            raise AscendRenderError("internal: a non-DMA Copy reached the Ascend renderer", s.loc)
        gm, ub = self.names[p.gm.buffer], ub_name or self.names[p.ub.buffer]
        gm_off = self.offset(p.gm.buffer, p.gm_start)
        args = (f"{p.rows}, {p.cols}, {p.ub_pitch}, {self.expr(p.valid_rows)}, {self.expr(p.valid_cols)}, "
                f"static_cast<uint64_t>({self.expr(p.gm_pitch)})")
        if p.direction == "in":
            return f"kf::copy_in({ub}[{p.ub_start}], {gm}[{gm_off}], {args}{'' if wait else ', false'});"
        return f"kf::copy_out({gm}[{gm_off}], {ub}[{p.ub_start}], {args});"

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
        """A request to the group's AIC through this AIV's workspace slot (kf/cube.h)."""
        site, p = self.cube.site(s), self.cube
        if p.direct:  # UB -> L1 and L0C -> UB (dav-3510): the product lands in rows of 16*ceil(N/16)
            a_half, b_half = p.l1_halves
            product = f"kf_ub.GetWithOffset<float>({site.m * _round16(site.n)}, {self.plan.scratch_offset})"
            out.append(f"{pad}kf::gemm_direct<{self.ctype(site.dtype)}, {site.m}, {site.n}, {site.k}, "
                       f"{str(s.trans_a).lower()}, {str(s.trans_b).lower()}, {str(s.clear_accum).lower()}>("
                       f"kf_slot, {site.op}, kf_l1a, kf_l1b, {a_half}, {b_half}, {self.names[s.a.buffer]}, "
                       f"{self.names[s.b.buffer]}, {self.names[s.c.buffer]}, {product});")
            return
        pitch = _round32(site.n * 4) // 4  # the product's UB rows are whole 32-byte blocks
        product = f"kf_ub.GetWithOffset<float>({site.m * pitch}, {self.plan.scratch_offset})"
        out.append(f"{pad}kf::gemm<{self.ctype(site.dtype)}, {site.m}, {site.n}, {site.k}, "
                   f"{str(s.trans_a).lower()}, {str(s.trans_b).lower()}, {str(s.clear_accum).lower()}>("
                   f"kf_slot, {p.a_off}, {p.b_off}, {p.c_off}, {site.op}, {self.names[s.a.buffer]}, "
                   f"{self.names[s.b.buffer]}, {self.names[s.c.buffer]}, {product});")


def _round16(n: int) -> int:
    return (n + 15) // 16 * 16


def _fp8_buffers(kernel: ir.Kernel):
    """``(buffer, loc)`` of every fp8 parameter and tile of ``kernel``."""
    for p in kernel.buffer_params:
        if p.dtype.is_float and p.dtype.bits == 8:
            yield p, None
    for n in ranges.statements(kernel.body):
        if isinstance(n, ir.Allocate) and n.buffer.dtype.is_float and n.buffer.dtype.bits == 8:
            yield n.buffer, n.loc


def check_fp8(kernel: ir.Kernel, arch: Arch) -> None:
    """fp8 buffers need an arch with fp8 (dav-3510) and the e4m3 format: else a typed error
    naming the first such buffer."""
    for b, loc in _fp8_buffers(kernel):
        if not arch.fp8:
            raise AscendRenderError(f"ascend {arch.name}: buffer {b.name!r} is {b.dtype}: 910B/A3 (dav-c220) has no "
                                    f"fp8 data type; render for dav-3510 (950)", loc)
        if b.dtype != dtypes.float8_e4m3:
            raise AscendRenderError(f"ascend {arch.name}: buffer {b.name!r} is {b.dtype}: only float8_e4m3 "
                                    f"(fp8_e4m3fn_t) is lowered", loc)


def unsupported(kernel: ir.Kernel, arch: Optional[str] = None) -> Optional[str]:
    """Why the Ascend renderer cannot lower ``kernel`` for ``arch`` (None: it can), for tools
    that run every library kernel (``kernforge demo``) and must skip rather than fail what is
    not written yet."""
    info = arch_info(arch)
    try:
        check_fp8(kernel, info)
    except AscendRenderError as e:
        return str(e).split(": ", 1)[-1] if e.loc else str(e)
    for n in ranges.statements(kernel.body):
        if isinstance(n, ir.Gemm) and cube.gemm_problem(n, info):
            return cube.gemm_problem(n, info)
        if isinstance(n, ir.Atomic) and n.buffer.scope == ir.Scope.GLOBAL:
            return "atomics on global buffers are not lowered yet"
    return None


@functools.lru_cache(maxsize=None)
def _environment() -> jinja2.Environment:
    return template_environment(TEMPLATE_DIR, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                                autoescape=False)


def render_ascend(kernel: ir.Kernel, arch: Optional[str] = None) -> AscendProgram:
    return AscendRenderer().render(kernel, Target("ascend", arch_info(arch).name))
