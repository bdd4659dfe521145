"""``@T.prim_func`` (trace a kernel into IR) and ``@T.tunable`` (declare its tuning space)."""
from __future__ import annotations

import ast
import functools
import inspect
import itertools
import sys
import textwrap
from typing import Any, Optional

from kernforge import dtypes
from kernforge.codegen import ir
from kernforge.dsl import builder as B
from kernforge.dsl import control, loop, rewrite
from kernforge.dsl.handles import TensorHandle, VarHandle
from kernforge.dsl.kernel import name_with
from kernforge.dsl.types import DTypeError, TensorType

_UNBOUND = object()


def _assign(old, new, name):
    if isinstance(old, VarHandle) and new is not old:
        if isinstance(new, TensorHandle) and not isinstance(new, VarHandle):
            return new  # rebinding the name to a new tile is an ordinary Python rebinding
        return old.assign(new)
    if isinstance(new, TensorHandle) and new.auto_named and B._stack:
        # the Buffer is fresh (only its Allocate refers to it), so naming it in place is safe
        b = B.current()
        b.names.discard(new.buffer.name)
        object.__setattr__(new.buffer, "name", b.unique(name))
        new.auto_named = False
    return new


_HELPERS = {
    "__kf_branches": control.branches,
    "__kf_is_static": control.is_static,
    "__kf_truth": control.truth,
    "__kf_and": control.bool_and,
    "__kf_or": control.bool_or,
    "__kf_not": control.bool_not,
    "__kf_then": control.then_,
    "__kf_else": control.else_,
    "__kf_jump": control.runtime_jump,
    "__kf_lookup": lambda scope, name: scope.get(name, _UNBOUND),
    "__kf_assign": _assign,
    "__kf_name_loop": loop.name_loop,
    "__kf_loop_id": loop.loop_id,
    "__kf_name_with": name_with,
}


def _annotations(fn, caller_locals: Optional[dict] = None) -> dict:
    """Evaluate annotations.  Under ``from __future__ import annotations`` they are
    strings that may name the enclosing factory's locals (``T.Tensor((M, K))``),
    which a closure does not capture; so the decorating frame's locals are used."""
    raw = getattr(fn, "__annotations__", {})
    if not any(type(v) is str for v in raw.values()):  # a DType annotation is a str too, not source
        return dict(raw)
    scope = dict(fn.__globals__)
    scope.update(caller_locals or {})
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        scope[name] = cell.cell_contents
    out = {}
    for k, v in raw.items():
        try:
            out[k] = eval(v, scope) if type(v) is str else v
        except DTypeError as e:  # raised inside eval's "<string>": point at the parameter
            raise DTypeError(f"parameter {k!r}: {e.message}", _param_loc(fn, k)) from None
    return out


def _param_loc(fn, param: str) -> ir.SourceLoc:
    """The line of ``fn``'s parameter ``param`` in its source (the ``def`` line when the
    source is not available)."""
    loc = ir.SourceLoc(fn.__code__.co_filename, fn.__code__.co_firstlineno)
    try:
        src, start = inspect.getsourcelines(fn)
        tree = ast.parse(textwrap.dedent("".join(src)))
    except (OSError, TypeError, SyntaxError):
        return loc
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.arg == param:
            return ir.SourceLoc(loc.file, start + node.lineno - 1)
    return loc


class PrimFunc:
    """What ``@T.prim_func`` returns: a traced kernel, its IR in ``.ir`` (``print(f.script())``
    shows it), ready for ``kernforge.compile(f, backend=...)``.  Tracing happened at
    decoration, so mistakes inside the kernel body were already reported there."""

    def __init__(self, fn, name: Optional[str] = None, attrs: Optional[dict] = None,
                 caller_locals: Optional[dict] = None):
        self.fn = fn
        self.name = name or fn.__name__
        self.kernels: tuple[ir.Kernel, ...] = trace_all(fn, self.name, attrs or {}, caller_locals)
        #: trailing parameters that are ``T.alloc_global`` scratch, not the function's own
        self.n_scratch = len(self.kernels[0].params) - len(inspect.signature(fn).parameters)

    @classmethod
    def from_kernels(cls, fn, name: str, kernels, n_scratch: int = 0) -> "PrimFunc":
        """A PrimFunc over kernels traced elsewhere (``T.jit``'s specialisations)."""
        self = cls.__new__(cls)
        self.fn, self.name, self.kernels, self.n_scratch = fn, name, tuple(kernels), n_scratch
        return self

    @property
    def ir(self) -> ir.Kernel:
        """The kernel's IR.  A function with several ``with T.Kernel`` blocks has one IR
        kernel per block in :attr:`kernels`; it runs through ``T.jit`` or
        ``kernforge.tilelang.compile``, which launch them in order."""
        if len(self.kernels) != 1:
            raise ir.KernelError(f"{self.name} has {len(self.kernels)} `with T.Kernel` blocks: "
                                 "kernforge.compile builds one kernel; compile it with "
                                 "kernforge.tilelang.compile (or write it as a T.jit function), "
                                 "which launches the blocks in order", self.kernels[0].loc)
        return self.kernels[0]

    @property
    def params(self):
        """The kernel's parameters as IR nodes, in order: ``ir.Buffer`` for tensors (``.name``,
        ``.shape``, ``.dtype``), ``ir.Var`` for scalars."""
        return self.ir.params

    @property
    def artifact_name(self) -> str:
        """The build artifacts' name (JIT cache tag): :attr:`kernforge.codegen.ir.Kernel.artifact_name`."""
        return self.ir.artifact_name

    def script(self) -> str:
        """The kernel's IR as text: what the interp backend runs and ``emit`` shows for it."""
        return "\n".join(repr(k) for k in self.kernels)

    def __repr__(self) -> str:
        return f"<PrimFunc {self.name}>"


def trace(fn, name: str, attrs: dict, caller_locals: Optional[dict] = None) -> ir.Kernel:
    """``fn`` traced into its one IR kernel (see :func:`trace_all`)."""
    kernels = trace_all(fn, name, attrs, caller_locals)
    if len(kernels) != 1:
        raise ir.KernelError(f"{name} has {len(kernels)} `with T.Kernel` blocks; one is expected here",
                             kernels[1].loc)
    return kernels[0]


def trace_all(fn, name: str, attrs: dict, caller_locals: Optional[dict] = None) -> tuple:
    sig = inspect.signature(fn)
    ann = _annotations(fn, caller_locals)
    loc = ir.SourceLoc(fn.__code__.co_filename, fn.__code__.co_firstlineno)
    params, args = [], []
    for p in sig.parameters.values():
        a = ann.get(p.name)
        if isinstance(a, TensorType):
            buf = a.make_buffer(p.name)
            params.append(buf)
            args.append(TensorHandle(buf))
        elif isinstance(a, (dtypes.DType, str)):
            try:
                dt = dtypes.dtype(a)
            except TypeError as e:
                raise DTypeError(f"scalar parameter {p.name!r} of {name}: {e}", _param_loc(fn, p.name)) from None
            v = ir.Var(p.name, dt)
            params.append(v)
            args.append(v)
        else:
            raise ir.KernelError(f"parameter {p.name!r} of {name} needs a T.Tensor(shape, dtype) "
                                 f"or scalar dtype annotation (got {a!r})", loc)
    traced = rewrite.rewrite(fn, _HELPERS) or fn
    b = B.Builder(name, tuple(params))
    with B.tracing(b):
        traced(*args)
    # T.alloc_global scratch: parameters after the declared ones, allocated per call by Launch
    return build_kernels(b, name, tuple(params) + tuple(b.scratch), attrs, loc)


def build_kernels(b: B.Builder, name: str, params: tuple, attrs: dict, loc) -> tuple:
    """One verified IR kernel per closed ``with T.Kernel`` block of trace ``b``, all over
    ``params``.  A single block keeps ``name``; several are named ``<name>_k0``, ``_k1``..."""
    if not b.blocks:
        raise ir.KernelError(f"{name} has no `with T.Kernel(...)` block", loc)
    from kernforge.codegen.verify import verify

    symbols = _symbols(params)
    if b.hints:  # recorded TileLang hints: in attrs, so they show in the listing and artifact name
        attrs = dict(attrs, tilelang_hints=";".join(f"{k}({v})" for k, v in b.hints))
    if b.thread_vars:  # T.Parallel loops over these variables run the block's threads (kernforge.interp)
        attrs = dict(attrs, thread_maps=",".join(b.thread_vars))
    kernels = []
    for i, blk in enumerate(b.blocks):
        kname = name if len(b.blocks) == 1 else f"{name}_k{i}"
        kattrs = dict(attrs, persistent_schedule=blk["persistent"]) if "persistent" in blk else dict(attrs)  # T.persistent
        kernel = ir.Kernel(kname, params, blk["grid"], blk["vars"], blk["threads"], blk["body"],
                           symbols, kattrs, blk["loc"])
        verify(kernel)
        kernels.append(kernel)
    return tuple(kernels)


def _symbols(params) -> tuple:
    seen: list = []
    for p in params:
        if isinstance(p, ir.Buffer):
            for e in p.shape + p.strides:
                for n in ir.walk(e):
                    if isinstance(n, ir.Var) and not any(n is v for v in seen):  # `in` would build ==
                        seen.append(n)
    return tuple(seen)


def macro(fn):
    """A helper a kernel calls while being traced (TileLang's ``T.macro``): its body
    gets the same source rewrite as a prim_func, so runtime ``if`` and ``alloc_var``
    assignment work inside it.  Shared pieces of kernels (an online-softmax update,
    an epilogue) are written once this way."""
    rewritten = rewrite.rewrite(fn, _HELPERS)
    return functools.wraps(fn)(rewritten) if rewritten is not None else fn


def prim_func(fn=None, *, name: Optional[str] = None):
    """Trace ``fn`` into a kernel (a :class:`PrimFunc`), as ``@T.prim_func`` or
    ``@T.prim_func(name="...")``.

    Parameters are annotated with ``T.Tensor`` (global tensors) or a dtype (scalars, e.g.
    ``n: T.int32``); the body holds a ``with T.Kernel(...)`` (several in a row are consecutive
    launches, see :class:`kernforge.dsl.Kernel`).  The function runs
    once, now, with DSL objects for its arguments: Python control flow over compile-time
    values unrolls, an ``if`` on a runtime value becomes a branch in the kernel, and every
    mistake is reported as a ``KernelError`` at the author's file and line.  Usually
    defined inside a factory function whose arguments are the compile-time parameters."""
    caller = sys._getframe(1).f_locals
    if fn is None:
        return lambda f: PrimFunc(f, name, caller_locals=caller)
    return PrimFunc(fn, name, caller_locals=caller)


class KernelFactory:
    """What ``@T.tunable`` returns: a function of compile-time parameters that returns a
    PrimFunc, with a declared tuning space.  ``kernforge.compile(factory, **params)``
    specialises it (parameters left out take the function's defaults); a tuner iterates
    :meth:`configs`.  Each distinct parameter set is traced once and memoised, and its
    values are recorded in the kernel's ``attrs`` (and so in its artifact name)."""

    def __init__(self, fn, space: dict[str, tuple]):
        self.fn = fn
        self.name = fn.__name__
        self.space = {k: tuple(v) for k, v in space.items()}
        self.signature = inspect.signature(fn)
        for k in self.space:
            if k not in self.signature.parameters:
                raise TypeError(f"tunable {k!r} is not a parameter of {self.name}")
        self.defaults = {k: p.default for k, p in self.signature.parameters.items()
                         if p.default is not inspect.Parameter.empty}
        self._memo: dict = {}

    def configs(self):
        """Every point of the tuning space, as keyword dicts."""
        keys = list(self.space)
        for values in itertools.product(*(self.space[k] for k in keys)):
            yield dict(zip(keys, values))

    def bind(self, **params) -> dict[str, Any]:
        """All of the function's parameters for ``params``, defaults applied (a ``TypeError``
        naming the factory for unknown or missing ones)."""
        try:
            bound = self.signature.bind(**params)
        except TypeError as e:
            raise TypeError(f"{self.name}: {e}") from None
        bound.apply_defaults()
        return dict(bound.arguments)

    def __call__(self, **params) -> PrimFunc:
        args = self.bind(**params)
        key = tuple(sorted((k, repr(v)) for k, v in args.items()))
        if key not in self._memo:
            pf = self.fn(**args)
            if not isinstance(pf, PrimFunc):
                raise TypeError(f"{self.name} must return a @T.prim_func, got {type(pf).__name__}")
            for k in pf.kernels:
                k.attrs.update({n: _attr(v) for n, v in args.items()})
            self._memo[key] = pf
        return self._memo[key]

    def __repr__(self) -> str:
        return f"<KernelFactory {self.name} space={self.space}>"


def _attr(v):
    return v.name if isinstance(v, dtypes.DType) else v


def tunable(**space):
    """Declare the compile-time parameters a tuner may sweep::

        @T.tunable(block_M=[32, 64, 128], num_stages=[1, 2, 3])
        def matmul(M, N, K, block_M=64, num_stages=2, dtype="float16"):
            @T.prim_func
            def main(A: T.Tensor((M, K), dtype), ...): ...
            return main

    Every key must be a parameter of the function (a ``TypeError`` otherwise); the
    defaults are what ``kernforge.compile(matmul, M=..., N=..., K=...)`` uses.  The result
    is a :class:`KernelFactory`."""
    def deco(fn):
        return KernelFactory(fn, space)
    return deco
