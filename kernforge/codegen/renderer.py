"""The renderer contract every backend follows, and the base the C-like renderers share.

**The contract.**  ``Renderer.render(kernel, target, dump=None) -> Program``:
verify the kernel, run the target's pipeline (transforms, then analyses; see
:mod:`kernforge.codegen.passes.pipeline`), then ``emit_program`` the text from the
lowered kernel and the analyses' results.  A :class:`Program` is the source, its
entry symbol and whatever the launcher needs (threads, shared memory, tensor
maps).  Because every step is a pipeline entry, ``dump`` and verification work
the same on every backend.

**Identifiers.**  :class:`NameTable` turns author names into C identifiers
once for every C-like target: invalid characters replaced, keywords and the
names generated code uses suffixed, clashes numbered.

**The C expression printer.**  A C-family renderer (CPU C++, CUDA C++, Ascend C)
subclasses :class:`CRenderer` and overrides *tables* -- ``type_map``,
``unary_table``, ``binary_table``.  Everything that is the same C expression on
every target lives here once, so the backends cannot drift apart on, e.g.,
floor division or bf16 rounding.

Semantics rendered here (they match the interpreter, see ``ir`` docstring):
* integer ``//`` and ``%`` are floor division/modulo, emitted as plain ``/``
  ``%`` only when both operands are provably non-negative;
* arithmetic on low-precision floats is done in float32 (``kf_to_float``),
  and a value is rounded (RNE) when cast or stored (``kf_from_float<T>``).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from kernforge import dtypes
from kernforge.codegen import arith, ir
from kernforge.codegen.passes.checks import sites as check_sites
from kernforge.codegen.passes.pipeline import run_pipeline
from kernforge.codegen.verify import verify


@dataclass(frozen=True)
class Target:
    """What to render for: the backend, its architecture (``sm_90a``; None: the backend's
    default) and a backend-specific ``variant`` (CUDA: ``"cp.async"`` renders the pipelines
    without TMA).  ``checks`` renders checked mode: a bounds test before every access
    (:mod:`kernforge.codegen.passes.checks`), off by default and then byte-identical."""

    backend: str
    arch: Optional[str] = None
    variant: str = ""
    checks: bool = False


@dataclass
class Program:
    """A rendered kernel: its source text and the symbol the launcher calls.  Backends
    subclass it for the launch metadata they need.  ``checks`` is None for an unchecked
    build, else the checks of a checked one by site (``passes.checks.sites``): the launcher
    passes a violation record and names a violation from it."""

    source: str
    entry: str
    checks: Optional[dict] = field(default=None, kw_only=True)


class Renderer:
    """``render(kernel, target) -> Program``; subclasses give ``pipeline``, ``native`` and ``emit_program``.

    ``render`` emits through a fresh instance (``emitter()``), so a renderer object can be
    shared while each rendering keeps its own naming and scratch state."""

    name = ""

    def pipeline(self, kernel: ir.Kernel, target: Target) -> Sequence:
        """The ordered transforms and analyses for ``target``."""
        raise NotImplementedError

    def native(self, kernel: ir.Kernel, target: Target) -> tuple[type, ...]:
        """Composite tile ops this renderer lowers itself (the rest are expanded first)."""
        return ()

    def emit_program(self, kernel: ir.Kernel, facts: dict, target: Target) -> Program:
        raise NotImplementedError

    def emitter(self) -> "Renderer":
        return type(self)()

    def lower(self, kernel: ir.Kernel, target: Target, dump=None) -> tuple[ir.Kernel, dict]:
        """The kernel after this target's pipeline, and the analyses' results."""
        verify(kernel)
        facts: dict = {}
        lowered = run_pipeline(kernel, self.pipeline(kernel, target), dump, native=self.native(kernel, target),
                               facts=facts)
        return lowered, facts

    def render(self, kernel: ir.Kernel, target: Target, dump=None) -> Program:
        lowered, facts = self.lower(kernel, target, dump)
        program = self.emitter().emit_program(lowered, facts, target)
        if target.checks:
            program.checks = check_sites(lowered)
        return program


def c_identifier(name: str) -> str:
    """``name`` with every character a C identifier cannot hold replaced by ``_``."""
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


def entry_symbol(kernel: ir.Kernel) -> str:
    """The exported symbol of a kernel in every C-like launch ABI: ``kf_<name>``."""
    return "kf_" + c_identifier(kernel.name)


# C/C++ keywords, CUDA's built-in names, and the names generated code itself uses
RESERVED = frozenset("""
alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t char32_t
class compl concept const consteval constexpr constinit const_cast continue co_await co_return co_yield
decltype default delete do double dynamic_cast else enum explicit export extern false float for friend
goto if inline int long mutable namespace new noexcept not not_eq nullptr operator or or_eq private
protected public register reinterpret_cast requires return short signed sizeof static static_assert
static_cast struct switch template this thread_local throw true try typedef typeid typename union
unsigned using virtual void volatile wchar_t while xor xor_eq restrict
args dims std kf main NULL errno
int8_t int16_t int32_t int64_t uint8_t uint16_t uint32_t uint64_t size_t ptrdiff_t intptr_t uintptr_t
threadIdx blockIdx blockDim gridDim warpSize
""".split())


def safe_identifier(name: str) -> str:
    """A C identifier for ``name`` that cannot collide with a keyword or a generated name:
    keywords, the ``kf_`` prefix of generated names, ``__`` and ``_X`` get a ``_`` suffix."""
    base = c_identifier(name) or "v"
    if base[0].isdigit() or base in RESERVED or base.startswith(("kf_", "__")) or re.match(r"_[A-Z]", base):
        base += "_"
    return base


class NameTable:
    """C identifiers for a kernel's variables and buffers (keyed by identity).

    Author names are kept where possible so the source reads like the DSL
    (:func:`safe_identifier`), and clashes get ``_<n>``."""

    def __init__(self):
        self._names: dict[int, str] = {}
        self._used: set[str] = set()

    @classmethod
    def for_kernel(cls, kernel: ir.Kernel) -> "NameTable":
        table = cls()
        for node in list(kernel.params) + list(kernel.symbols) + list(kernel.block_vars):
            table.add(node)
        seen, stack = set(), [kernel.body]
        while stack:  # each node once: expressions are shared DAGs
            n = stack.pop()
            if id(n) in seen:
                continue
            seen.add(id(n))
            if isinstance(n, (ir.Var, ir.Buffer)):
                table.add(n)
            if not isinstance(n, ir.Buffer):
                stack.extend(reversed(list(ir.children(n))))
        return table

    def add(self, node) -> None:
        if id(node) in self._names:
            return
        base = safe_identifier(node.name)
        name, n = base, 1
        while name in self._used:
            name, n = f"{base}_{n}", n + 1
        self._used.add(name)
        self._names[id(node)] = name

    def __getitem__(self, node) -> str:
        return self._names[id(node)]

    def __contains__(self, node) -> bool:
        return id(node) in self._names


class CRenderer:
    """Tables and the expression printer for C-family targets."""

    name = "c"
    type_map: dict[dtypes.DType, str] = {
        dtypes.float32: "float", dtypes.float64: "double", dtypes.float16: "kf_half",
        dtypes.bfloat16: "kf_bf16", dtypes.float8_e4m3: "kf_fp8e4m3", dtypes.int8: "int8_t",
        dtypes.int16: "int16_t", dtypes.int32: "int32_t", dtypes.int64: "int64_t",
        dtypes.uint8: "uint8_t", dtypes.uint16: "uint16_t", dtypes.uint32: "uint32_t",
        dtypes.uint64: "uint64_t", dtypes.bool_: "bool",
    }
    # float32 spellings; float64 variants drop the 'f' suffix via ``_libm``
    unary_table: dict[ir.Op, Callable[[str, ir.Unary], str]] = {
        ir.Op.NEG: lambda a, e: f"(-{a})",
        ir.Op.NOT: lambda a, e: f"(!{a})" if e.dtype.is_bool else f"(~{a})",
        ir.Op.EXP: lambda a, e: f"{_libm('exp', e)}({a})",
        ir.Op.EXP2: lambda a, e: f"{_libm('exp2', e)}({a})",
        ir.Op.LOG: lambda a, e: f"{_libm('log', e)}({a})",
        ir.Op.LOG2: lambda a, e: f"{_libm('log2', e)}({a})",
        ir.Op.SQRT: lambda a, e: f"{_libm('sqrt', e)}({a})",
        ir.Op.RSQRT: lambda a, e: f"(1.0f / {_libm('sqrt', e)}({a}))" if e.dtype == dtypes.float32
        else f"(1.0 / sqrt({a}))",
        ir.Op.RCP: lambda a, e: f"(1.0f / {a})" if e.dtype == dtypes.float32 else f"(1.0 / {a})",
        ir.Op.ABS: lambda a, e: f"{_libm('fabs', e)}({a})" if e.dtype.is_float else f"kf_abs({a})",
        ir.Op.FLOOR: lambda a, e: f"{_libm('floor', e)}({a})",
        ir.Op.CEIL: lambda a, e: f"{_libm('ceil', e)}({a})",
        ir.Op.TANH: lambda a, e: f"{_libm('tanh', e)}({a})",
        ir.Op.ISNAN: lambda a, e: f"kf_isnan({a})",
    }
    binary_table: dict[ir.Op, Callable[[str, str, ir.Binary], str]] = {
        ir.Op.ADD: lambda a, b, e: f"({a} + {b})",
        ir.Op.SUB: lambda a, b, e: f"({a} - {b})",
        ir.Op.MUL: lambda a, b, e: f"({a} * {b})",
        ir.Op.DIV: lambda a, b, e: f"({a} / {b})",
        ir.Op.MAX: lambda a, b, e: f"kf_max({a}, {b})",
        ir.Op.MIN: lambda a, b, e: f"kf_min({a}, {b})",
        ir.Op.POW: lambda a, b, e: f"{_libm('pow', e)}({a}, {b})",
        ir.Op.LT: lambda a, b, e: f"({a} < {b})",
        ir.Op.LE: lambda a, b, e: f"({a} <= {b})",
        ir.Op.GT: lambda a, b, e: f"({a} > {b})",
        ir.Op.GE: lambda a, b, e: f"({a} >= {b})",
        ir.Op.EQ: lambda a, b, e: f"({a} == {b})",
        ir.Op.NE: lambda a, b, e: f"({a} != {b})",
        # bool & | stay bitwise: the IR evaluates both operands anyway (no short circuit),
        # and bitwise keeps serial loops branch-free
        ir.Op.AND: lambda a, b, e: f"(bool)({a} & {b})" if e.dtype.is_bool else f"({a} & {b})",
        ir.Op.OR: lambda a, b, e: f"(bool)({a} | {b})" if e.dtype.is_bool else f"({a} | {b})",
        ir.Op.XOR: lambda a, b, e: f"({a} != {b})" if e.dtype.is_bool else f"({a} ^ {b})",
        ir.Op.SHL: lambda a, b, e: f"({a} << {b})",
        ir.Op.SHR: lambda a, b, e: f"({a} >> {b})",
    }

    def __init__(self):
        self.nonneg_vars: set = set()

    # names --------------------------------------------------------------------
    def ctype(self, dt: dtypes.DType) -> str:
        return self.type_map[dt]

    def var_name(self, v: ir.Var) -> str:
        return v.name

    def buffer_name(self, b: ir.Buffer) -> str:
        return b.name

    # loads --------------------------------------------------------------------
    def offset(self, buf: ir.Buffer, indices) -> str:
        """Flat element offset of ``buf[indices]`` (64-bit for global buffers)."""
        terms = []
        wide = buf.scope == ir.Scope.GLOBAL
        for i, s in zip(indices, buf.strides):
            if isinstance(s, ir.Const) and s.value == 0:
                continue
            ie = self.expr(i)
            if wide and not isinstance(i, ir.Const):
                ie = f"(int64_t){ie}"
            if isinstance(s, ir.Const) and s.value == 1:
                terms.append(ie)
            else:
                terms.append(f"{ie} * {self.expr(s)}")
        return " + ".join(terms) or "0"

    def load(self, e: ir.Load) -> str:
        return f"{self.buffer_name(e.buffer)}[{self.offset(e.buffer, e.indices)}]"

    def check_call(self, s: ir.Check) -> str:
        """An ``ir.Check`` as one C statement: when the condition fails, ``kf_check_fail``
        (``kf/check.h``, ``kf/check.cuh``) records the site, index and shape values in the
        launch's violation record ``kf_check``."""
        idx = ", ".join(f"(int64_t)({self.expr(i)})" for i in s.indices) or "0"
        shape = ", ".join(f"(int64_t)({self.expr(d)})" for d in s.shape) or "0"
        return (f"if (!({self.expr(s.cond)})) {{ const int64_t kf_ci[] = {{{idx}}}; "
                f"const int64_t kf_cs[] = {{{shape}}}; kf_check_fail(kf_check, {s.site}, {len(s.indices)}, "
                f"kf_ci, kf_cs); }}")

    # expressions ---------------------------------------------------------------
    def literal(self, c: ir.Const) -> str:
        dt = c.dtype
        if dt.is_bool:
            return "true" if c.value else "false"
        if dt.is_int:
            v = int(c.value)
            if dt == dtypes.int32 and v == -2**31:
                return "(-2147483647 - 1)"
            if dt == dtypes.int32:
                return str(v)
            if dt == dtypes.int64 and v == -2**63:
                return "((int64_t)(-9223372036854775807LL - 1))"
            # spell the exact type: int64_t is `long` on LP64, and `3LL` (long long) would
            # not deduce the same template argument in helpers like kf_floordiv(a, b)
            return f"(({self.ctype(dt)}){v}{'ULL' if dt == dtypes.uint64 else 'LL' if dt.bits == 64 else ''})"
        v = float(c.value)
        if math.isnan(v):
            s = "kf_nan<float>()"
        elif math.isinf(v):
            s = "kf_inf<float>()" if v > 0 else "(-kf_inf<float>())"
        else:
            s = repr(v) + ("f" if dt != dtypes.float64 else "")
            if "e" not in s and "." not in s:
                s = s.replace("f", ".0f")
        if dt.is_low_precision:
            return f"kf_from_float<{self.ctype(dt)}>({s})"
        if dt == dtypes.float64 and "kf_" in s:
            s = s.replace("<float>", "<double>")
        return s

    def as_compute(self, e: ir.Expr) -> str:
        """``e`` in its compute type: low-precision floats widen to float."""
        s = self.expr(e)
        return f"kf_to_float({s})" if e.dtype.is_low_precision else s

    def expr(self, e: ir.Expr) -> str:
        if isinstance(e, ir.Const):
            return self.literal(e)
        if isinstance(e, ir.Var):
            return self.var_name(e)
        if isinstance(e, ir.Load):
            return self.load(e)
        if isinstance(e, ir.Cast):
            return self.cast(e.a, e.dtype)
        if isinstance(e, ir.Bitcast):
            # the operand is cast to its own type first: C promotes narrow integer
            # arithmetic (uint16 ^ uint16) to int, which has the wrong width
            return f"kf_bitcast<{self.ctype(e.dtype)}>(static_cast<{self.ctype(e.a.dtype)}>({self.expr(e.a)}))"
        if isinstance(e, ir.Select):
            return f"({self.expr(e.cond)} ? {self.cast_to(e.a, e.dtype)} : {self.cast_to(e.b, e.dtype)})"
        if isinstance(e, ir.Unary):
            return self.unary_table[e.op](self.cast_to(e.a, e.dtype) if e.op != ir.Op.ISNAN
                                          else self.as_compute(e.a), e)
        if isinstance(e, ir.Binary):
            return self.binary(e)
        raise NotImplementedError(f"{self.name} renderer: expression {type(e).__name__}")

    def binary(self, e: ir.Binary) -> str:
        operand_dt = e.dtype if e.op not in ir.COMPARISONS else dtypes.promote(e.a.dtype, e.b.dtype)
        if e.dtype.is_bool and e.op in ir.BITWISE:
            operand_dt = dtypes.bool_
        a, b = self.cast_to(e.a, operand_dt), self.cast_to(e.b, operand_dt)
        if e.op in (ir.Op.FLOORDIV, ir.Op.MOD):
            if operand_dt.is_int:
                if arith.nonnegative(e.a, self.nonneg_vars) and arith.nonnegative(e.b, self.nonneg_vars):
                    return f"({a} {'/' if e.op == ir.Op.FLOORDIV else '%'} {b})"
                return f"kf_{'floordiv' if e.op == ir.Op.FLOORDIV else 'floormod'}({a}, {b})"
            if e.op == ir.Op.FLOORDIV:
                return f"{_libm('floor', e)}({a} / {b})"
            return f"kf_fmod_floor({a}, {b})"
        return self.binary_table[e.op](a, b, e)

    def cast_to(self, e: ir.Expr, dt: dtypes.DType) -> str:
        """``e`` converted to compute type ``dt`` (no-op when already there)."""
        if e.dtype == dt:
            return self.expr(e)
        if dt.is_low_precision:
            return self.cast(e, dt)
        if e.dtype.is_low_precision:
            s = f"kf_to_float({self.expr(e)})"
            return s if dt == dtypes.float32 else f"(({self.ctype(dt)}){s})"
        if isinstance(e, ir.Const) and (dt.is_float or e.dtype.is_int):
            return self.literal(ir.const(e.value, dt))
        return f"(({self.ctype(dt)}){self.expr(e)})"

    def cast(self, e: ir.Expr, dt: dtypes.DType) -> str:
        """An explicit conversion with kernforge's semantics (RNE into low precision,
        truncation toward zero into integers)."""
        src = e.dtype
        if src == dt:
            return self.expr(e)
        if dt.is_low_precision:
            return f"kf_from_float<{self.ctype(dt)}>({self.as_compute(e) if src.is_float else f'(float){self.expr(e)}'})"
        if src.is_low_precision:
            return f"(({self.ctype(dt)})kf_to_float({self.expr(e)}))"
        return f"(({self.ctype(dt)}){self.expr(e)})"

    def store_value(self, value: ir.Expr, dt: dtypes.DType) -> str:
        """The C expression stored into a ``dt`` element (values arrive already typed)."""
        return self.expr(value) if value.dtype == dt else self.cast(value, dt)


def _libm(fn: str, e: ir.Expr) -> str:
    return fn if e.dtype == dtypes.float64 else fn + "f"

