"""The tile IR: what a kernel author wrote, typed and checked.

One IR serves every backend.  It stays at *tile level*: a ``Copy`` moves a
whole tile (with edge masks implied by the buffer shape), a ``Gemm`` multiplies
whole tiles, a ``Parallel`` loop is an element-wise map over a tile.  Each
renderer decomposes these nodes for its machine (loops on CPU, fragments and
tensor-core instructions on CUDA, vector instructions on Ascend); the numpy
interpreter executes them directly and is the semantic oracle.

Nodes are frozen dataclasses compared by *identity* (``eq=False``) so that an
``==`` between two expressions can build an ``EQ`` node, as TVM/TileLang
users expect; use :func:`structural_equal` for structural comparison.

Semantics every backend implements identically (the interpreter, kernforge/interp, is their executable form):

* Arithmetic on float16/bfloat16/fp8 happens in float32; values round (RNE)
  only when stored into a low-precision buffer or cast explicitly.
* ``FLOORDIV``/``MOD`` on integers follow Python (floor) semantics; on floats
  ``MOD`` has the sign of the divisor (Python/numpy ``%``).
* ``MAX``/``MIN`` propagate NaN (as ``numpy.maximum`` / ``torch.maximum``).
* Float->int casts truncate toward zero; shifts by >= the bit width are undefined.
* A ``Copy`` that reads outside its source buffer writes 0 to those
  destination elements; one that writes outside its destination skips them.
* Statements outside a ``Parallel`` loop are executed "by the block": their
  effect is as if executed once per block.
"""
from __future__ import annotations

import enum
import contextlib
import os
import sys
from dataclasses import dataclass, field, fields, replace
from typing import Any, Iterator, Optional, Sequence, Union

from kernforge import dtypes
from kernforge.dtypes import DType


class Op(enum.Enum):
    """Every operation kind in the IR: expression operators and tile statements."""

    # binary arithmetic
    ADD = "+"
    SUB = "-"
    MUL = "*"
    DIV = "/"
    FLOORDIV = "//"
    MOD = "%"
    MAX = "max"
    MIN = "min"
    POW = "pow"
    # comparison (result bool)
    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="
    EQ = "=="
    NE = "!="
    # logical on bool, bitwise on integers
    AND = "&"
    OR = "|"
    XOR = "^"
    SHL = "<<"
    SHR = ">>"
    # unary
    NEG = "neg"
    NOT = "not"
    EXP = "exp"
    EXP2 = "exp2"
    LOG = "log"
    LOG2 = "log2"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    RCP = "rcp"
    ABS = "abs"
    FLOOR = "floor"
    CEIL = "ceil"
    TANH = "tanh"
    ISNAN = "isnan"
    # tile statements
    COPY = "copy"
    FILL = "fill"
    GEMM = "gemm"
    REDUCE_MAX = "reduce_max"
    REDUCE_MIN = "reduce_min"
    REDUCE_SUM = "reduce_sum"
    CUMSUM = "cumsum"
    ATOMIC_ADD = "atomic_add"
    ATOMIC_MAX = "atomic_max"
    ONLINE_SOFTMAX = "online_softmax"
    RADIX_FIND_BUCKET = "radix_find_bucket"


COMPARISONS = frozenset({Op.LT, Op.LE, Op.GT, Op.GE, Op.EQ, Op.NE})
BITWISE = frozenset({Op.AND, Op.OR, Op.XOR, Op.SHL, Op.SHR})
FLOAT_UNARY = frozenset({Op.EXP, Op.EXP2, Op.LOG, Op.LOG2, Op.SQRT, Op.RSQRT, Op.RCP, Op.FLOOR,
                         Op.CEIL, Op.TANH})


class Scope(enum.Enum):
    """Where a buffer lives.  ``FRAGMENT`` is a tile private to a block, spread over
    its threads; ``LOCAL`` is per-thread scalar storage (``alloc_local``/``alloc_var``)."""

    GLOBAL = "global"
    SHARED = "shared"
    FRAGMENT = "fragment"
    LOCAL = "local"


class LoopKind(enum.Enum):
    SERIAL = "serial"
    PIPELINED = "pipelined"
    UNROLLED = "unrolled"


class GemmWarpPolicy(enum.Enum):
    """TileLang's ``T.GemmWarpPolicy``: how a gemm's warps split its ``(M, N)`` accumulator.
    ``Gemm.policy`` None is kernforge's own choice (as many warps along M as fit, as FullRow)."""

    Square = "square"  # per-warp tiles as close to square as the warp count allows
    FullRow = "full_row"  # warps along M first (each warp spans a band of whole rows)
    FullCol = "full_col"  # warps along N first (each warp spans a band of whole columns)

    @property
    def tilelang_value(self) -> int:
        return {"square": 0, "full_row": 1, "full_col": 2}[self.value]


@dataclass(frozen=True)
class SourceLoc:
    """The kernel author's file and line, carried by every node for error messages."""

    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


_INTERNAL_DIRS = tuple(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), d) + os.sep
                       for d in ("dsl", "codegen"))
# the DSL's context managers (T.Kernel, runtime branches) are entered through contextlib's frames
_PASS_THROUGH = frozenset({os.path.abspath(contextlib.__file__)})


# whether an absolute code file name is the author's (not a DSL, IR or contextlib module)
_AUTHOR_FILE: dict[str, bool] = {}


def _is_author_file(filename: str) -> bool:
    known = _AUTHOR_FILE.get(filename)
    if known is not None:
        return known
    path = os.path.abspath(filename)
    mine = not path.startswith(_INTERNAL_DIRS) and path not in _PASS_THROUGH
    if os.path.isabs(filename):  # a relative name's meaning follows the working directory
        _AUTHOR_FILE[filename] = mine
    return mine


def caller_loc() -> Optional[SourceLoc]:
    """File and line of the innermost caller outside kernforge's DSL and IR modules:
    the kernel author's line.  Every traced statement asks, through several DSL frames, so
    the answer per file name is remembered."""
    f = sys._getframe(1)
    while f is not None:
        if _is_author_file(f.f_code.co_filename):
            return SourceLoc(f.f_code.co_filename, f.f_lineno)
        f = f.f_back
    return None


class KernelError(Exception):
    """A mistake in a kernel, reported at the author's file and line."""

    def __init__(self, message: str, loc: Optional[SourceLoc] = None):
        self.message = message
        self.loc = loc
        super().__init__(f"{loc}: {message}" if loc else message)


class CheckError(KernelError):
    """Checked mode found an out-of-bounds access while the kernel ran: ``buffer``, ``index``
    (a region's start for tile ops), ``shape`` and ``kind`` name it; the message reads like
    the interpreter's (``file:line: out-of-bounds read A[5, 130] (shape (4, 128))``)."""

    def __init__(self, kind: str, buffer: str, index: Sequence[int], shape: Sequence[int],
                 loc: Optional[SourceLoc] = None, extents: Sequence[int] = ()):
        self.kind, self.buffer = kind, buffer
        self.index, self.shape, self.extents = tuple(index), tuple(shape), tuple(extents)
        if extents:
            where = "[" + ", ".join(f"{i}:+{e}" for i, e in zip(self.index, self.extents)) + "]"
            text = f"out-of-bounds {kind} {buffer}{where} (shape {self.shape})"
        else:
            text = f"out-of-bounds {kind} {buffer}{list(self.index)} (shape {self.shape})"
        super().__init__(text, loc)


# ---------------------------------------------------------------- expressions


class Expr:
    """Base of scalar expressions.  Python operators build IR nodes (TVM-style)."""

    dtype: DType

    # arithmetic sugar -------------------------------------------------------
    def __add__(self, o): return binary(Op.ADD, self, o)
    def __radd__(self, o): return binary(Op.ADD, o, self)
    def __sub__(self, o): return binary(Op.SUB, self, o)
    def __rsub__(self, o): return binary(Op.SUB, o, self)
    def __mul__(self, o): return binary(Op.MUL, self, o)
    def __rmul__(self, o): return binary(Op.MUL, o, self)
    def __truediv__(self, o): return binary(Op.DIV, self, o)
    def __rtruediv__(self, o): return binary(Op.DIV, o, self)
    def __floordiv__(self, o): return binary(Op.FLOORDIV, self, o)
    def __rfloordiv__(self, o): return binary(Op.FLOORDIV, o, self)
    def __mod__(self, o): return binary(Op.MOD, self, o)
    def __rmod__(self, o): return binary(Op.MOD, o, self)
    def __lt__(self, o): return binary(Op.LT, self, o)
    def __le__(self, o): return binary(Op.LE, self, o)
    def __gt__(self, o): return binary(Op.GT, self, o)
    def __ge__(self, o): return binary(Op.GE, self, o)
    def __eq__(self, o): return binary(Op.EQ, self, o)  # type: ignore[override]
    def __ne__(self, o): return binary(Op.NE, self, o)  # type: ignore[override]
    def __and__(self, o): return binary(Op.AND, self, o)
    def __rand__(self, o): return binary(Op.AND, o, self)
    def __or__(self, o): return binary(Op.OR, self, o)
    def __ror__(self, o): return binary(Op.OR, o, self)
    def __xor__(self, o): return binary(Op.XOR, self, o)
    def __rxor__(self, o): return binary(Op.XOR, o, self)
    def __lshift__(self, o): return binary(Op.SHL, self, o)
    def __rlshift__(self, o): return binary(Op.SHL, o, self)
    def __rshift__(self, o): return binary(Op.SHR, self, o)
    def __rrshift__(self, o): return binary(Op.SHR, o, self)
    def __neg__(self): return unary(Op.NEG, self)
    def __invert__(self): return unary(Op.NOT, self)
    def __pos__(self): return self
    __hash__ = object.__hash__

    def __bool__(self):
        raise KernelError(
            f"the truth value of a symbolic expression ({self}) is only known when the kernel "
            "runs: use `if` directly on it inside a @T.prim_func (it becomes a runtime branch), "
            "T.if_then_else / T.where, or & | ~ instead of and / or / not", caller_loc())

    def __index__(self):
        raise KernelError(f"symbolic expression {self} used where a Python int is required "
                          "(for example a tile shape or range()); tile sizes must be compile-time", caller_loc())

    def __repr__(self) -> str:
        from kernforge.codegen.printer import format_expr

        return format_expr(self)

    __str__ = __repr__


@dataclass(frozen=True, eq=False, repr=False)
class Const(Expr):
    value: Union[int, float, bool]
    dtype: DType


@dataclass(frozen=True, eq=False, repr=False)
class Var(Expr):
    """A named scalar: block index, loop variable, symbolic shape/stride, scalar param."""

    name: str
    dtype: DType = dtypes.int32


@dataclass(frozen=True, eq=False, repr=False)
class Binary(Expr):
    op: Op
    a: Expr
    b: Expr
    dtype: DType


@dataclass(frozen=True, eq=False, repr=False)
class Unary(Expr):
    op: Op
    a: Expr
    dtype: DType


@dataclass(frozen=True, eq=False, repr=False)
class Cast(Expr):
    """Value conversion (float->int truncates toward zero; to low-precision floats rounds RNE)."""

    a: Expr
    dtype: DType


@dataclass(frozen=True, eq=False, repr=False)
class Bitcast(Expr):
    """Reinterpret the bits of ``a`` as ``dtype`` (same width)."""

    a: Expr
    dtype: DType


@dataclass(frozen=True, eq=False, repr=False)
class Select(Expr):
    cond: Expr
    a: Expr
    b: Expr
    dtype: DType


@dataclass(frozen=True, eq=False, repr=False)
class Load(Expr):
    """One element of a buffer.  Indices are in elements, one per dimension."""

    buffer: "Buffer"
    indices: tuple[Expr, ...]

    @property
    def dtype(self) -> DType:  # type: ignore[override]
        return self.buffer.dtype


#: warp shuffle kinds: CUDA's ``__shfl_{xor,down,up}_sync`` and ``__shfl_sync`` (``idx``)
SHUFFLE_KINDS = ("xor", "down", "up", "idx")


@dataclass(frozen=True, eq=False, repr=False)
class Shuffle(Expr):
    """``value`` as another thread of the same warp computed it (TileLang's ``T.shfl_*``).

    ``thread`` is the thread-region variable (``threadIdx.x``, the lane is ``thread % 32``);
    ``arg`` is the lane mask (``xor``), the lane distance (``down``/``up``) or the source lane
    (``idx``) within segments of ``width`` lanes (a power of two <= 32).  The source lane
    follows PTX ``shfl.sync`` (a source outside the segment reads the thread's own value);
    :func:`kernforge.codegen.passes.warps.shuffle_source` spells it.

    It reads values other iterations of its thread ``Parallel`` produced, so it may appear only
    as the value of a ``Store`` at the top level of that ``Parallel``'s body, reached by every
    thread (the DSL ensures it): CUDA renders ``__shfl_*_sync``; the interpreter runs the map
    in lockstep anyway; the CPU splits the map there (:mod:`kernforge.codegen.passes.warps`)."""

    kind: str
    value: Expr
    arg: Expr
    width: int
    thread: Var

    @property
    def dtype(self) -> DType:  # type: ignore[override]
        return self.value.dtype


# ---------------------------------------------------------------- buffers


@dataclass(frozen=True, eq=False)
class Buffer:
    """A typed, shaped array in one scope.  Global buffers may have symbolic shape
    and strides (``Var``); on-chip buffers have constant shapes and are row-major."""

    name: str
    shape: tuple[Expr, ...]
    dtype: DType
    scope: Scope
    strides: tuple[Expr, ...] = ()

    def __post_init__(self):
        if not self.strides:
            object.__setattr__(self, "strides", row_major_strides(self.shape))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def static_shape(self) -> tuple[int, ...]:
        """The shape as ints; raises if any dimension is symbolic."""
        out = []
        for s in self.shape:
            if not isinstance(s, Const):
                raise KernelError(f"buffer {self.name} has a symbolic dimension {s}")
            out.append(int(s.value))
        return tuple(out)

    @property
    def is_static(self) -> bool:
        return all(isinstance(s, Const) for s in self.shape)

    def __repr__(self) -> str:
        return f"{self.scope.value} {self.dtype}{list(self.shape)} {self.name}"


def row_major_strides(shape: Sequence[Expr]) -> tuple[Expr, ...]:
    strides: list[Expr] = []
    acc: Expr = const(1)
    for s in reversed(shape):
        strides.append(acc)
        acc = fold(binary(Op.MUL, acc, s))
    return tuple(reversed(strides))


@dataclass(frozen=True, eq=False)
class Region:
    """A rectangular tile of a buffer: ``starts`` (exprs) and static ``extents``.

    Extents of 1 may be dropped when matching another region's shape, as TileLang
    does for ``T.copy(A[by * BM, k * BK], A_shared)``."""

    buffer: Buffer
    starts: tuple[Expr, ...]
    extents: tuple[int, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        return self.extents

    def squeezed(self) -> tuple[int, ...]:
        return tuple(e for e in self.extents if e != 1)

    def __repr__(self) -> str:
        parts = [f"{s}:+{e}" for s, e in zip(self.starts, self.extents)]
        return f"{self.buffer.name}[{', '.join(parts)}]"


def whole(buffer: Buffer) -> Region:
    return Region(buffer, tuple(const(0) for _ in buffer.shape), buffer.static_shape())


# ---------------------------------------------------------------- statements


class Stmt:
    loc: Optional[SourceLoc]

    def __repr__(self) -> str:
        from kernforge.codegen.printer import format_stmt

        return format_stmt(self)


_LOC = field(default=None, compare=False)


@dataclass(frozen=True, eq=False, repr=False)
class Seq(Stmt):
    body: tuple[Stmt, ...]
    loc: Optional[SourceLoc] = _LOC


@dataclass(frozen=True, eq=False, repr=False)
class Allocate(Stmt):
    """Declares an on-chip buffer; it is live until the end of the enclosing ``Seq``."""

    buffer: Buffer
    loc: Optional[SourceLoc] = _LOC


@dataclass(frozen=True, eq=False, repr=False)
class For(Stmt):
    """A sequential loop ``for var in range(start, start + extent)``."""

    var: Var
    extent: Expr
    body: Stmt
    kind: LoopKind = LoopKind.SERIAL
    num_stages: int = 0
    start: Expr = field(default_factory=lambda: const(0))
    loc: Optional[SourceLoc] = _LOC


@dataclass(frozen=True, eq=False, repr=False)
class Parallel(Stmt):
    """``for i, j in T.Parallel(M, N)``: an element-wise map over a tile.

    Iterations are independent (no iteration reads what another writes, except
    through atomics); every backend may run them in any order or at once."""

    vars: tuple[Var, ...]
    extents: tuple[int, ...]
    body: Stmt
    loc: Optional[SourceLoc] = _LOC


@dataclass(frozen=True, eq=False, repr=False)
class If(Stmt):
    cond: Expr
    then: Stmt
    orelse: Optional[Stmt] = None
    loc: Optional[SourceLoc] = _LOC


@dataclass(frozen=True, eq=False, repr=False)
class Store(Stmt):
    buffer: Buffer
    indices: tuple[Expr, ...]
    value: Expr
    loc: Optional[SourceLoc] = _LOC


@dataclass(frozen=True, eq=False, repr=False)
class Copy(Stmt):
    """Tile copy with dtype conversion; out-of-bounds reads give 0, out-of-bounds writes skip."""

    src: Region
    dst: Region
    loc: Optional[SourceLoc] = _LOC
    disable_tma: bool = False  # T.copy(disable_tma=True): never a TMA load (CUDA uses cp.async)


@dataclass(frozen=True, eq=False, repr=False)
class Fill(Stmt):
    dst: Region
    value: Expr
    loc: Optional[SourceLoc] = _LOC


@dataclass(frozen=True, eq=False, repr=False)
class Gemm(Stmt):
    """``C (+)= op(A) @ op(B)``, accumulating in C's dtype (float32 for low precision inputs)."""

    a: Region
    b: Region
    c: Region
    trans_a: bool = False
    trans_b: bool = False
    clear_accum: bool = False
    loc: Optional[SourceLoc] = _LOC
    policy: Optional[GemmWarpPolicy] = None  # T.gemm(policy=): CUDA's warp split; None = backend's choice


@dataclass(frozen=True, eq=False, repr=False)
class Reduce(Stmt):
    """Reduce ``src`` along ``dim`` into ``dst`` (src's shape without ``dim``).
    With ``clear=False`` the result is combined with dst's current values."""

    op: Op
    src: Buffer
    dst: Buffer
    dim: int
    clear: bool = True
    loc: Optional[SourceLoc] = _LOC


@dataclass(frozen=True, eq=False, repr=False)
class Cumsum(Stmt):
    """Inclusive prefix sum along ``dim`` (suffix sum with ``reverse``); dst may be src."""

    src: Buffer
    dst: Buffer
    dim: int
    reverse: bool = False
    loc: Optional[SourceLoc] = _LOC


@dataclass(frozen=True, eq=False, repr=False)
class Atomic(Stmt):
    """``buffer[indices] = op(buffer[indices], value)`` atomically; op is ATOMIC_ADD/MAX.

    With a ``result`` buffer it is a fetch-and-op (TileLang's ``return_prev=True``): the value
    ``buffer[indices]`` held just before this update is stored to ``result[result_indices]``
    (a thread's own element, in thread-level code).  Updates of one element by several threads
    are ordered somehow on a GPU; the interpreter and the CPU number them in thread order."""

    op: Op
    buffer: Buffer
    indices: tuple[Expr, ...]
    value: Expr
    loc: Optional[SourceLoc] = _LOC
    result: Optional[Buffer] = None
    result_indices: tuple[Expr, ...] = ()


@dataclass(frozen=True, eq=False, repr=False)
class OnlineSoftmax(Stmt):
    """One tile step of a streaming (online) softmax over the rows of ``scores``.

    ``scores`` (M, N) holds a tile of raw scores (``-inf`` = masked) and receives the
    tile's unnormalised probabilities; ``row_max`` and ``row_sum`` (M,) are the running
    max and sum across tiles; ``rescale`` (M,) receives the factor earlier accumulations
    must be multiplied by.  With ``s = scale_log2`` (the softmax scale times log2(e)):

    * ``m = max(row_max, max_j scores)`` (NaN-propagating), ``shift = 0 if m == -inf else m``
      (a row that has seen only masked keys stays at ``-inf`` and yields 0, not NaN);
    * ``rescale = exp2((row_max - shift) * s)``, ``scores = exp2((scores - shift) * s)``;
    * ``row_sum = row_sum * rescale + sum_j scores``, ``row_max = m``.

    A *composite* op: :func:`kernforge.codegen.passes.composites.expand_online_softmax`
    spells it in Copy/Reduce/Parallel for backends without a native lowering; the CUDA
    renderer calls ``kf::online_softmax_step`` (``kf/softmax.cuh``)."""

    scores: Buffer
    row_max: Buffer
    row_sum: Buffer
    rescale: Buffer
    scale_log2: Expr
    loc: Optional[SourceLoc] = _LOC


@dataclass(frozen=True, eq=False, repr=False)
class RadixFindBucket(Stmt):
    """Which bucket of a radix-select digit histogram holds the ``need``-th largest key.

    ``hist`` (nb,) holds the count of keys per digit value; ``above`` (nb,) receives the
    suffix counts ``above[b] = hist[b] + ... + hist[nb - 1]``; ``need`` and ``bucket`` are
    one-element locals.  With ``reached`` = the number of ``b`` with ``above[b] >= need``
    (the buckets whose suffix count reaches ``need``, a prefix since ``above`` never grows):
    ``bucket = reached - 1`` (``-1`` when fewer than ``need`` keys were counted) and, when
    ``reached < nb``, ``need -= above[reached]`` (the rank inside the bucket).

    A composite op (:func:`kernforge.codegen.passes.composites.expand_radix_find_bucket`);
    the CUDA renderer calls ``kf::radix_find_bucket`` (``kf/radix.cuh``)."""

    hist: Buffer
    above: Buffer
    need: Buffer
    bucket: Buffer
    loc: Optional[SourceLoc] = _LOC


@dataclass(frozen=True, eq=False, repr=False)
class Sync(Stmt):
    """A barrier among the threads of ``scope`` (only ``"block"``): every thread waits here
    until all have arrived, and memory the block shares (on-chip shared tiles) written
    before it is visible to every thread after it.

    Authors do not write it: a target's barrier pass
    (:mod:`kernforge.codegen.passes.barriers`) inserts it where a statement would race an
    earlier one.  It changes no value, so the interpreter and backends that run a block
    on one thread (CPU) ignore it.  Like any block statement it must be reached by every
    thread of the block; inside a ``Parallel`` map it is only meaningful to a backend that
    runs the map as a loop in every thread (the CUDA renderer's thread-local maps)."""

    scope: str = "block"
    loc: Optional[SourceLoc] = _LOC


@dataclass(frozen=True, eq=False, repr=False)
class Check(Stmt):
    """Checked mode's bounds test (``kernforge.compile(..., checks=True)``): when ``cond`` is
    false, the ``kind`` access ("read", "write", "atomic", or a tile op's "copy region", ...)
    of buffer ``name`` (its ``shape``) at ``indices`` is out of bounds.

    Authors do not write it: :mod:`kernforge.codegen.passes.checks` puts one before every
    access it cannot prove in bounds, and guards the access itself with ``cond`` so a
    violation never touches memory.  A backend records the first violation of a launch
    (``site``, the index and shape values) and its launcher raises :class:`CheckError`;
    the interpreter raises it at once.  ``extents`` is the tile of a region check (empty
    for an element access)."""

    cond: Expr
    name: str
    indices: tuple[Expr, ...]
    shape: tuple[Expr, ...]
    kind: str
    site: int
    extents: tuple[int, ...] = ()
    loc: Optional[SourceLoc] = _LOC


#: tile ops that passes.composites can spell in primitive statements
COMPOSITES = (OnlineSoftmax, RadixFindBucket)


@dataclass(eq=False)
class Kernel:
    """One specialised kernel: parameters, grid, threads and a tile-level body.

    ``symbols`` are the symbolic shape/stride variables of the global parameters,
    bound from the actual tensors at launch (in this order in the launch ABI's
    ``dims`` array).  ``attrs`` holds the compile-time parameter values it was
    specialised with; they are part of the artifact name and the cache key."""

    name: str
    params: tuple[Union[Buffer, Var], ...]
    grid: tuple[Expr, ...]
    block_vars: tuple[Var, ...]
    threads: int
    body: Stmt
    symbols: tuple[Var, ...] = ()
    attrs: dict[str, Any] = field(default_factory=dict)
    loc: Optional[SourceLoc] = None

    @property
    def buffer_params(self) -> tuple[Buffer, ...]:
        return tuple(p for p in self.params if isinstance(p, Buffer))

    @property
    def scalar_params(self) -> tuple[Var, ...]:
        return tuple(p for p in self.params if isinstance(p, Var))

    def with_body(self, body: Stmt) -> "Kernel":
        return replace(self, body=body)

    @property
    def artifact_name(self) -> str:
        """The name of this specialisation's build artifacts (the JIT cache tag): ``name``,
        then, when the name is short, its first three int/str parameters (readable in a
        cache directory: ``topk_select_kernel_k512_float32_int64``), then 8 hex digits of a
        sha1 of the sorted compile-time parameters (``attrs``).  Variants of one factory
        that share a kernel name (every TopK) differ here; equal parameters give the same
        name in every process (no ``hash()``).  ``name`` itself, the source's entry symbol
        ``kf_<name>``, is unchanged."""
        import hashlib
        import re

        digest = hashlib.sha1(repr(sorted(self.attrs.items())).encode()).hexdigest()[:8]
        parts = [self.name]
        if len(self.name) < 32:
            shown = [(k, v) for k, v in self.attrs.items() if isinstance(v, (int, str)) and not isinstance(v, bool)]
            parts += [f"{k}{v}" if isinstance(v, int) else v for k, v in shown[:3]]
        return re.sub(r"[^A-Za-z0-9_]", "_", "_".join(parts + [digest]))

    def __repr__(self) -> str:
        from kernforge.codegen.printer import format_kernel

        return format_kernel(self)


# ---------------------------------------------------------------- builders


def const(value, dt: Optional[DType] = None) -> Const:
    if dt is None:
        if isinstance(value, bool):
            dt = dtypes.bool_
        elif isinstance(value, int):
            dt = dtypes.int32 if -2**31 <= value < 2**31 else dtypes.int64
        elif isinstance(value, float):
            dt = dtypes.float32
        else:
            raise KernelError(f"cannot make a constant from {value!r} ({type(value).__name__})")
    if dt.is_bool:
        value = bool(value)
    elif dt.is_int:
        value = int(value)
    else:
        value = float(value)
    return Const(value, dt)


def as_expr(x, like: Optional[DType] = None) -> Expr:
    """Convert a Python number (taking ``like``'s dtype, as TVM literals do) or an
    object with ``__kf_expr__`` (DSL handles) to an :class:`Expr`."""
    if isinstance(x, Expr):
        return x
    conv = getattr(x, "__kf_expr__", None)
    if conv is not None:
        return conv()
    if isinstance(x, (bool, int, float)) or type(x).__module__ == "numpy":
        py = x.item() if hasattr(x, "item") else x
        if like is not None and not (isinstance(py, float) and like.is_int):
            if like.is_bool and not isinstance(py, bool):
                return const(py)
            return const(py, like)
        return const(py)
    raise KernelError(f"expected a scalar expression, got {type(x).__name__}: {x!r}")


def _pair(a, b) -> tuple[Expr, Expr]:
    if isinstance(a, Expr) or hasattr(a, "__kf_expr__"):
        ea = as_expr(a)
        return ea, as_expr(b, ea.dtype)
    eb = as_expr(b)
    return as_expr(a, eb.dtype), eb


def binary(op: Op, a, b) -> Expr:
    ea, eb = _pair(a, b)
    if op in COMPARISONS:
        return Binary(op, ea, eb, dtypes.bool_)
    if op in BITWISE:
        for e in (ea, eb):
            if e.dtype.is_float:
                raise KernelError(f"bitwise {op.value} on floating-point value {e}; "
                                  "use T.reinterpret to operate on the bits")
        if ea.dtype.is_bool and eb.dtype.is_bool:
            return Binary(op, ea, eb, dtypes.bool_)
        if op in (Op.SHL, Op.SHR):
            return Binary(op, ea, eb, ea.dtype)
    if op == Op.DIV and ea.dtype.is_int and eb.dtype.is_int:
        raise KernelError(f"integer division {ea} / {eb}: use // (floor division)")
    dt = dtypes.promote(ea.dtype, eb.dtype)
    if dt.is_bool and op not in BITWISE:
        dt = dtypes.int32
    return Binary(op, ea, eb, dt)


def unary(op: Op, a) -> Expr:
    ea = as_expr(a)
    if op == Op.ISNAN:
        return Unary(op, ea, dtypes.bool_)
    if op == Op.NOT:
        if ea.dtype.is_float:
            raise KernelError(f"~ on floating-point value {ea}")
        return Unary(op, ea, ea.dtype)
    if op in FLOAT_UNARY:
        dt = ea.dtype if ea.dtype == dtypes.float64 else dtypes.float32
        return Unary(op, ea, dt)
    dt = dtypes.float32 if ea.dtype.is_low_precision else ea.dtype
    return Unary(op, ea, dt)


def cast(x, dt) -> Expr:
    dt = dtypes.dtype(dt)
    e = as_expr(x, dt)
    if e.dtype == dt:
        return e
    if isinstance(e, Const) and not dt.is_low_precision:
        return const(e.value, dt)
    return Cast(e, dt)


def select(cond, a, b) -> Expr:
    c = as_expr(cond)
    ea, eb = _pair(a, b)
    dt = ea.dtype if ea.dtype == eb.dtype else dtypes.promote(ea.dtype, eb.dtype)
    if ea.dtype == eb.dtype:
        return Select(c, ea, eb, dt)
    return Select(c, cast(ea, dt), cast(eb, dt), dt)


def fold(e: Expr) -> Expr:
    """Constant-fold one level of integer arithmetic (keeps shapes and strides readable)."""
    if isinstance(e, Binary) and isinstance(e.a, Const) and isinstance(e.b, Const) \
            and e.dtype.is_int and e.a.dtype.is_int and e.b.dtype.is_int:
        a, b = e.a.value, e.b.value
        table = {Op.ADD: lambda: a + b, Op.SUB: lambda: a - b, Op.MUL: lambda: a * b,
                 Op.FLOORDIV: lambda: a // b if b else None, Op.MOD: lambda: a % b if b else None,
                 Op.MAX: lambda: max(a, b), Op.MIN: lambda: min(a, b)}
        f = table.get(e.op)
        if f is not None and (v := f()) is not None:
            return const(v, e.dtype)
    if isinstance(e, Binary) and e.op == Op.MUL:
        if isinstance(e.a, Const) and e.a.value == 1:
            return e.b
        if isinstance(e.b, Const) and e.b.value == 1:
            return e.a
    return e


def ceildiv(a, b) -> Expr:
    ea, eb = _pair(a, b)
    return fold(binary(Op.FLOORDIV, fold(binary(Op.SUB, fold(binary(Op.ADD, ea, eb)), 1)), eb))


# ---------------------------------------------------------------- traversal


def children(node) -> Iterator[Any]:
    """Immediate IR children (exprs, stmts, buffers, regions) of a node, in field order."""
    for name in field_names(node):
        v = getattr(node, name)
        if isinstance(v, tuple):
            for x in v:
                if isinstance(x, (Expr, Stmt, Region, Buffer)):
                    yield x
        elif isinstance(v, (Expr, Stmt, Region, Buffer)):
            yield v


def walk(node) -> Iterator[Any]:
    """Pre-order walk over every node reachable from ``node`` (buffers' shapes included)."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        if isinstance(n, Buffer):
            stack.extend(reversed(n.shape + n.strides))
            continue
        stack.extend(reversed(list(children(n))))


_IR_NODE = (Expr, Stmt, Region, Buffer)
_FIELDS: dict[type, tuple[str, ...]] = {}


def field_names(node) -> tuple[str, ...]:
    """``node``'s dataclass field names but ``loc``, looked up once per node type: every
    traversal asks this for each node it visits, and ``dataclasses.fields`` rebuilds its
    answer on each call (it was the largest single cost of verifying and lowering TopK)."""
    names = _FIELDS.get(type(node))
    if names is None:
        names = _FIELDS.setdefault(type(node), tuple(f.name for f in fields(node) if f.name != "loc"))
    return names


def nodes(root):
    """Pre-order walk of ``root`` like :func:`walk`, but without descending into buffers' shapes
    and strides: analyses that walk large bodies many times (CUDA's plans, the barrier pass)
    only need the tree, and the field names are looked up once per node type."""
    stack = [root]
    while stack:
        n = stack.pop()
        yield n
        if isinstance(n, (Buffer, Var, Const)):
            continue
        for name in reversed(field_names(n)):
            v = getattr(n, name)
            if isinstance(v, tuple):
                stack.extend(x for x in reversed(v) if isinstance(x, _IR_NODE))
            elif isinstance(v, _IR_NODE):
                stack.append(v)


def structural_equal(a, b) -> bool:
    """Structural equality of two IR trees (Vars and Buffers compare by identity)."""
    if isinstance(a, (Var, Buffer)) or isinstance(b, (Var, Buffer)):
        return a is b
    if type(a) is not type(b):
        return False
    if isinstance(a, Const):
        return a.value == b.value and a.dtype == b.dtype
    for name in field_names(a):
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, tuple):
            if len(x) != len(y) or not all(_eq_item(p, q) for p, q in zip(x, y)):
                return False
        elif not _eq_item(x, y):
            return False
    return True


def _eq_item(x, y) -> bool:
    if isinstance(x, (Expr, Stmt, Region, Buffer)):
        return structural_equal(x, y)
    return x == y


class Mutator:
    """Rebuilds a tree bottom-up; subclasses override ``visit_<Class>`` for the nodes
    they change.  Passes are written as small Mutators (pure IR -> IR)."""

    def visit(self, node):
        if node is None:
            return None
        method = getattr(self, "visit_" + type(node).__name__, None)
        if method is not None:
            return method(node)
        return self.generic(node)

    def generic(self, node):
        if isinstance(node, (Var, Const, Buffer)):
            return node
        changes = {}
        for name in field_names(node):
            v = getattr(node, name)
            if isinstance(v, tuple):
                nv = tuple(self.visit(x) if isinstance(x, (Expr, Stmt, Region)) else x for x in v)
                if any(p is not q for p, q in zip(nv, v)):
                    changes[name] = nv
            elif isinstance(v, (Expr, Stmt, Region)):
                nv = self.visit(v)
                if nv is not v:
                    changes[name] = nv
        return replace(node, **changes) if changes else node


def seq(stmts: Sequence[Stmt], loc: Optional[SourceLoc] = None) -> Stmt:
    """A Seq, flattening nested Seqs; a single statement is returned as is."""
    flat: list[Stmt] = []
    for s in stmts:
        if isinstance(s, Seq) and not any(isinstance(x, Allocate) for x in s.body):
            flat.extend(s.body)
        elif s is not None:
            flat.append(s)
    if len(flat) == 1 and not isinstance(flat[0], Allocate):
        return flat[0]
    return Seq(tuple(flat), loc)
