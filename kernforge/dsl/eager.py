"""``@T.jit``: TileLang's eager kernel style, where one Python function is the kernel.

::

    @T.jit
    def matmul(A, B, block_M: int = 64, block_N: int = 64, block_K: int = 32):
        M, N, K = T.const("M, N, K")
        A: T.Tensor((M, K), T.float16)
        B: T.Tensor((K, N), T.float16)
        C = T.empty((M, N), T.float16)
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
            ...
        return C

    c = matmul(a, b)                       # specialise on a's and b's shapes, build, run
    k = matmul.compile(M=256, N=256, K=128, block_M=32)   # or specialise explicitly

The parameters annotated in the body are the kernel's tensors (or, with a dtype, its
runtime scalars); every other parameter is a compile-time value.  ``T.const`` names sizes
that are fixed per specialisation: on a call they are read from the tensors' shapes, in
``.compile`` they are passed by name (a size given to neither stays symbolic, bound at
every launch like ``T.symbolic``).  ``T.empty`` creates a global output: the returned ones
are the call's results; one that is not returned is a scratch tensor allocated per call.
Each specialisation (compile-time values, sizes, backend) is traced and built once and
cached on the function.  As in TileLang, an element access of a global tensor that cannot be
proven in bounds is safe: a store past the edge is skipped, a load there reads 0
(:mod:`kernforge.codegen.passes.safe_access`; ``@T.prim_func`` reports such an access instead).

Why two traces on a call: the sizes must be Python ints while the body runs (tile shapes,
``T.Parallel`` extents and ``range`` loops use them), but they are only known once the
tensors' annotations have been read.  So a first, partial trace runs the body with the sizes
symbolic and stops as soon as every tensor parameter is annotated; the shapes then give the
sizes, and the real trace runs with them.

A body may hold several ``with T.Kernel`` blocks: they are launched one after the other
over the same global tensors (:class:`Launch`).
"""
from __future__ import annotations

import inspect
import re
from typing import Any, Optional

from kernforge import dtypes
from kernforge.codegen import ir
from kernforge.dsl import builder as B
from kernforge.dsl.handles import TensorHandle
from kernforge.dsl.types import TensorType, dtype_arg


class JITError(ir.KernelError, TypeError):
    """A ``@T.jit`` function used in a way it cannot be specialised (a tensor parameter never
    annotated, a size no tensor determines, an unknown keyword), named at the author's line."""


class _Arg:
    """A parameter the call gave a tensor for (``value``), or that ``.compile`` left out
    (``value`` None): it must be annotated in the body, which turns it into a parameter."""

    __slots__ = ("name", "value")

    def __init__(self, name: str, value=None):
        self.name, self.value = name, value

    def __repr__(self) -> str:
        return f"<parameter {self.name} (not yet annotated)>"


class _ProbeDone(Exception):
    """Raised by the partial trace once every tensor parameter is annotated."""


class _Trace:
    def __init__(self, consts: dict, args: dict, probe: bool):
        self.consts = consts          # size name -> int (bound) ; missing: symbolic
        self.const_vars: dict = {}    # size name -> the ir.Var standing for it
        self.args = args              # parameter name -> _Arg
        self.probe = probe
        self.declared: dict = {}      # parameter name -> ir.Buffer / ir.Var
        self.empties: list = []       # T.empty buffers, in creation order
        self.read: set = set()        # every size name T.const was asked for


_STATE: list[_Trace] = []


def _current(what: str) -> _Trace:
    if not _STATE:
        raise JITError(f"{what} is only valid inside a @T.jit function being traced", ir.caller_loc())
    return _STATE[-1]


def const(names: str, dtype="int32"):
    """``M, N, K = T.const("M, N, K")``: sizes fixed per specialisation of a ``@T.jit``
    function.  Names are separated by commas or spaces; one name gives one value, several a
    tuple.  On a call each size is read from the first tensor whose annotated shape holds it
    as a dimension; ``.compile(M=...)`` passes it by name.  While the body runs the size is
    a Python int, so it can shape tiles and ``T.Parallel`` loops.  A size neither call nor
    ``.compile`` fixes stays a symbolic launch-time size (:func:`kernforge.dsl.symbolic`)."""
    tr = _current("T.const")
    dt = dtype_arg(dtype, "T.const")
    if not isinstance(names, str) or not names.strip():
        raise JITError(f"T.const takes a string of names such as \"M, N, K\", got {names!r}", ir.caller_loc())
    out = []
    for n in re.split(r"[\s,]+", names.strip()):
        if not n.isidentifier():
            raise JITError(f"T.const: {n!r} is not a name", ir.caller_loc())
        tr.read.add(n)
        if n in tr.consts:
            out.append(tr.consts[n])
        else:
            out.append(tr.const_vars.setdefault(n, ir.Var(n, dt)))
    return out[0] if len(out) == 1 else tuple(out)


def empty(shape, dtype="float32") -> TensorHandle:
    """``C = T.empty((M, N), dtype)``: a global output tensor of a ``@T.jit`` function,
    allocated at each call on the backend's device.  Returning it (``return C``, or a
    tuple) makes it a result; one that is not returned is scratch memory shared by the
    function's kernel blocks (a split-K partial sum) and dropped after the call.  Its
    shape may use ``T.const`` sizes; it is created outside ``with T.Kernel``."""
    tr = _current("T.empty")
    b = B.current()
    if b.inside("kernel"):
        raise JITError("T.empty inside `with T.Kernel`: create outputs before the kernel block",
                       ir.caller_loc())
    buf = TensorType(tuple(shape) if isinstance(shape, (tuple, list)) else (shape,),
                     dtype_arg(dtype, "T.empty")).make_buffer(b.unique("out"))
    b.add_global(buf)
    tr.empties.append(buf)
    return TensorHandle(buf, auto_named=True)


def annotate(old, name: str, annotation):
    """The tracer's rewrite of a bare ``name: annotation`` in a ``@T.jit`` body."""
    if not _STATE:
        return old
    tr = _STATE[-1]
    if not isinstance(old, _Arg):
        if isinstance(old, TensorHandle) or not isinstance(annotation, TensorType):
            return old  # a compile-time value annotated with its type, or a repeat
        raise JITError(f"{name}: T.Tensor annotation of a name that is not a tensor parameter of "
                       f"the function (got {old!r}); tensors are parameters, outputs T.empty",
                       ir.caller_loc())
    if name in tr.declared:
        raise JITError(f"parameter {name} annotated twice", ir.caller_loc())
    b = B.current()
    if isinstance(annotation, TensorType):
        node = annotation.make_buffer(name)
        b.add_global(node)
        result: Any = TensorHandle(node)
    else:
        try:
            dt = dtypes.dtype(annotation)
        except TypeError:
            raise JITError(f"parameter {name} needs a T.Tensor(shape, dtype) or scalar dtype "
                           f"annotation, got {annotation!r}", ir.caller_loc()) from None
        node = ir.Var(name, dt)
        b.names.add(name)
        result = node
    tr.declared[name] = node
    if tr.probe and all(n in tr.declared for n, a in tr.args.items() if a.value is not None):
        raise _ProbeDone()
    return result


def _is_tensor(x) -> bool:
    import numpy as np

    return dtypes.is_torch(x) and hasattr(x, "shape") or isinstance(x, np.ndarray)


def _key(v):
    if isinstance(v, dtypes.DType):
        return ("dtype", v.name)
    try:
        hash(v)
        return (type(v).__name__, v)
    except TypeError:
        return (type(v).__name__, repr(v))


class Specialization:
    """One traced specialisation: its kernels (a :class:`PrimFunc`), the parameter
    positions of the call's tensors, and how the function's return maps onto outputs."""

    def __init__(self, prim_func, inputs: list, out_idx: tuple, returns):
        self.prim_func = prim_func
        self.inputs = inputs      # parameter names the call passes, in order
        self.out_idx = out_idx    # parameter positions allocated by the launch
        self.returns = returns    # None | ("out", k) | ("in", name) | tuple of those


class JITFunction:
    """What ``@T.jit`` returns: call it on tensors (``f(a, b)`` returns the outputs), or
    specialise it with :meth:`compile`; :meth:`get_tir` shows the traced kernels."""

    def __init__(self, fn, backend: Optional[str] = None):
        self.fn = fn
        self.name = fn.__name__
        self.backend = backend
        self.signature = inspect.signature(fn)
        self._probes: dict = {}
        self._specs: dict = {}
        self._built: dict = {}
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    # ---------------------------------------------------------------- binding
    def _split(self, args, kwargs):
        """(compile-time values, tensor _Args, size bindings) for a call or ``compile``."""
        known = {k: v for k, v in kwargs.items() if k in self.signature.parameters}
        sizes = {k: v for k, v in kwargs.items() if k not in self.signature.parameters}
        try:
            bound = self.signature.bind_partial(*args, **known)
        except TypeError as e:
            raise JITError(f"{self.name}: {e}", ir.caller_loc()) from None
        values, targs = {}, {}
        for name, p in self.signature.parameters.items():
            if name in bound.arguments:
                v = bound.arguments[name]
                if _is_tensor(v):
                    targs[name] = _Arg(name, v)
                else:
                    values[name] = v
            elif p.default is not inspect.Parameter.empty:
                values[name] = p.default
            else:
                targs[name] = _Arg(name)
        return values, targs, sizes

    def _run(self, values: dict, targs: dict, consts: dict, probe: bool):
        from kernforge.dsl.prim_func import _HELPERS
        from kernforge.dsl import rewrite

        helpers = dict(_HELPERS, __kf_annotate=annotate)
        traced = rewrite.rewrite(self.fn, helpers, eager=True)
        if traced is None:
            raise JITError(f"{self.name}: @T.jit needs the function's source (its body's annotations "
                           "are read from it)", ir.SourceLoc(self.fn.__code__.co_filename,
                                                            self.fn.__code__.co_firstlineno))
        tr = _Trace(consts, targs, probe)
        b = B.Builder(self.name, ())
        call = {n: targs.get(n, values.get(n)) for n in self.signature.parameters}
        _STATE.append(tr)
        try:
            with B.tracing(b):
                try:
                    ret = traced(**call)
                except _ProbeDone:
                    return tr, b, None
        finally:
            _STATE.pop()
        return tr, b, ret

    def _loc(self):
        return ir.SourceLoc(self.fn.__code__.co_filename, self.fn.__code__.co_firstlineno)

    def _sizes_from(self, values: dict, targs: dict) -> dict:
        """The ``T.const`` sizes the call's tensors determine (the partial trace, memoised)."""
        ckey = (tuple((k, _key(v)) for k, v in values.items()), tuple(targs))
        probe = self._probes.get(ckey)
        if probe is None:
            tr, _, _ = self._run(values, {n: _Arg(n, a.value) for n, a in targs.items()}, {}, True)
            missing = [n for n, a in targs.items() if a.value is not None and n not in tr.declared]
            if missing:
                raise JITError(f"{self.name}: tensor argument(s) {', '.join(missing)} are never "
                               f"annotated in the body (`{missing[0]}: T.Tensor(shape, dtype)`)", self._loc())
            probe = {n: tr.declared[n] for n in targs if n in tr.declared}, dict(tr.const_vars)
            self._probes[ckey] = probe
        declared, const_vars = probe
        by_var = {id(v): n for n, v in const_vars.items()}
        sizes: dict = {}
        for name, node in declared.items():
            t = targs[name].value
            if not isinstance(node, ir.Buffer):
                continue
            shape = tuple(t.shape)
            if len(shape) != node.ndim:
                from kernforge.jit.kernel import ShapeError

                raise ShapeError(f"{self.name}: parameter {name!r} must have {node.ndim} dimensions, "
                                 f"got shape {shape}")
            for dim, got in zip(node.shape, shape):
                n = by_var.get(id(dim))
                if n is None:
                    continue
                if n in sizes and sizes[n] != got:
                    from kernforge.jit.kernel import ShapeError

                    raise ShapeError(f"{self.name}: size {n} = {got} in {name!r} but {sizes[n]} "
                                     f"elsewhere (shape {shape})")
                sizes[n] = int(got)
        return sizes

    def _specialize(self, values: dict, targs: dict, sizes: dict) -> Specialization:
        skey = (tuple((k, _key(v)) for k, v in values.items()), tuple(targs),
                tuple(sorted(sizes.items())))
        spec = self._specs.get(skey)
        if spec is not None:
            return spec
        compile_args = {n: _Arg(n) for n in targs}
        tr, b, ret = self._run(values, compile_args, dict(sizes), False)
        unused = sorted(set(sizes) - tr.read)
        if unused:
            raise JITError(f"{self.name}: {', '.join(unused)} is neither a parameter nor a T.const "
                           f"size of the function", self._loc())
        missing = [n for n in targs if n not in tr.declared]
        if missing:
            raise JITError(f"{self.name}: parameter(s) {', '.join(missing)} have no value and are never "
                           f"annotated in the body (`{missing[0]}: T.Tensor(shape, dtype)`)", self._loc())
        inputs = [n for n in targs]
        params = [tr.declared[n] for n in inputs]
        rets = ret if isinstance(ret, (tuple, list)) else (() if ret is None else (ret,))
        outs: list = []
        mapped = []
        for r in rets:
            if not isinstance(r, TensorHandle):
                raise JITError(f"{self.name} returns {r!r}: a @T.jit function returns its T.empty "
                               "outputs (or nothing)", self._loc())
            if r.buffer in tr.empties:
                if r.buffer not in outs:
                    outs.append(r.buffer)
                mapped.append(("out", outs.index(r.buffer)))
            else:
                name = next((n for n, p in tr.declared.items() if p is r.buffer), None)
                if name is None:
                    raise JITError(f"{self.name} returns {r.name}, which is neither an output nor a "
                                   "parameter", self._loc())
                mapped.append(("in", name))
        scratch = [e for e in tr.empties if e not in outs]
        all_params = tuple(params + outs + scratch)
        out_idx = tuple(range(len(params), len(all_params)))
        attrs = {k: (v.name if isinstance(v, dtypes.DType) else v) for k, v in values.items()
                 if isinstance(v, (int, float, str, bool, dtypes.DType))}
        attrs.update(sizes)
        from kernforge.codegen.passes.safe_access import safe_access
        from kernforge.dsl.prim_func import PrimFunc, build_kernels

        # TileLang's semantics: global accesses not provably in bounds are guarded
        kernels = tuple(safe_access(k) for k in build_kernels(b, self.name, all_params, attrs, self._loc()))
        returns = None if ret is None else (tuple(mapped) if isinstance(ret, (tuple, list)) else mapped[0])
        spec = Specialization(PrimFunc.from_kernels(self.fn, self.name, kernels), inputs, out_idx, returns)
        self._specs[skey] = spec
        return spec

    # ---------------------------------------------------------------- public
    def select_backend(self, tensors) -> str:
        """The backend a call runs on: the decorator's ``backend=``, else the default backend
        of the first tensor's device (CPU tensors: ``cpu``)."""
        from kernforge import backends

        if self.backend is not None:
            return self.backend
        if tensors:
            return backends.for_tensor(tensors[0])
        return backends.for_device("cpu")

    def get_tir(self, *args, **params):
        """The traced kernels of one specialisation (a :class:`PrimFunc`; ``.script()``
        prints them), for ``.compile``'s arguments."""
        values, targs, sizes = self._split(args, params)
        if any(a.value is not None for a in targs.values()):
            sizes = dict(self._sizes_from(values, targs), **sizes)
        return self._specialize(values, targs, sizes).prim_func

    def compile(self, *args, backend: Optional[str] = None, **params) -> "Launch":
        """Specialise and build: compile-time parameters and ``T.const`` sizes by name
        (``matmul.compile(M=256, N=256, K=128, block_M=32)``).  The result is called with
        the tensor parameters in order and returns the function's outputs."""
        values, targs, sizes = self._split(args, params)
        tensors = [a.value for a in targs.values() if a.value is not None]
        if tensors:
            sizes = dict(self._sizes_from(values, targs), **sizes)
            targs = {n: _Arg(n) for n in targs}
        return self._build(self._specialize(values, targs, sizes), backend or self.select_backend(tensors))

    def _build(self, spec: Specialization, backend: str) -> "Launch":
        key = (id(spec), backend)  # specs live in self._specs for the function's lifetime
        launch = self._built.get(key)
        if launch is None:
            launch = Launch(spec.prim_func, backend, spec.out_idx, returns=spec.returns,
                            inputs=spec.inputs)
            self._built[key] = launch
        return launch

    def __call__(self, *args, **kwargs):
        values, targs, sizes = self._split(args, kwargs)
        if sizes:
            raise JITError(f"{self.name}: unexpected keyword(s) {', '.join(sorted(sizes))} (sizes are "
                           "read from the tensors; pass them to .compile)", ir.caller_loc())
        missing = [n for n, a in targs.items() if a.value is None]
        if missing:
            raise JITError(f"{self.name}: missing tensor argument(s) {', '.join(missing)}", ir.caller_loc())
        tensors = [a.value for a in targs.values()]
        sizes = self._sizes_from(values, targs)
        spec = self._specialize(values, {n: _Arg(n) for n in targs}, sizes)
        return self._build(spec, self.select_backend(tensors))(*tensors)

    def __repr__(self) -> str:
        return f"<T.jit {self.name}>"


class Launch:
    """A function's kernels, built for one backend and launched in order over the same
    global tensors: ``launch(*inputs)`` allocates the outputs (``out_idx``) and the
    ``T.alloc_global`` scratch of a ``@T.prim_func`` (its trailing ``n_scratch`` parameters),
    runs every kernel block, and returns the outputs (or, for a ``@T.jit`` function, what it
    returns).  ``out_idx`` counts the function's declared parameters, as in TileLang, so a
    negative index never lands on scratch.  With one block and no scratch it is that block's
    :class:`kernforge.jit.kernel.CompiledKernel`."""

    def __init__(self, prim_func, backend: str, out_idx=None, arch: Optional[str] = None,
                 checks: bool = False, returns=None, inputs=None):
        from kernforge.dsl.prim_func import PrimFunc
        from kernforge.jit.kernel import ArgumentError, CompiledKernel

        self.prim_func = prim_func
        self.backend_name = backend
        n = len(prim_func.kernels[0].params)
        scratch = tuple(range(n - getattr(prim_func, "n_scratch", 0), n))
        own = n - len(scratch)
        outs = () if out_idx is None else (out_idx,) if isinstance(out_idx, int) else tuple(out_idx)
        for i in outs:
            if not -own <= i < own:
                raise ArgumentError(f"{prim_func.name}: out_idx {i} out of range for {own} parameters")
        self.n_outputs = len(outs)
        all_out = tuple(i % own for i in outs) + scratch
        self.parts = []
        for i, k in enumerate(prim_func.kernels):
            one = PrimFunc.from_kernels(prim_func.fn, k.name, [k])
            self.parts.append(CompiledKernel(one, backend, (all_out or None) if i == 0 else None, arch, checks))
        self.out_idx = self.parts[0].out_idx
        self.returns = returns
        self.inputs = inputs

    @property
    def kernels(self):
        """The compiled kernel of every block, in launch order."""
        return tuple(self.parts)

    def get_kernel_source(self) -> str:
        """The sources built for every block, in launch order."""
        return "\n".join(p.get_kernel_source() for p in self.parts)

    def __call__(self, *args):
        first = self.parts[0]
        outs = first(*args)
        out_list = [] if outs is None else (list(outs) if isinstance(outs, tuple) else [outs])
        if len(self.parts) > 1:
            made = dict(zip(self.out_idx, out_list))
            it = iter(args)
            full = [made[i] if i in made else next(it) for i in range(len(first.ir.params))]
            for part in self.parts[1:]:
                part(*full)
        if self.inputs is None:
            mine = out_list[:self.n_outputs]  # the scratch after them is dropped
            return None if not mine else mine[0] if len(mine) == 1 else tuple(mine)
        if self.returns is None:
            return None
        given = dict(zip(self.inputs, args))

        def one(r):
            return out_list[r[1]] if r[0] == "out" else given[r[1]]
        if isinstance(self.returns, tuple) and self.returns and isinstance(self.returns[0], tuple):
            return tuple(one(r) for r in self.returns)
        return one(self.returns)

    def __repr__(self) -> str:
        return f"<Launch {self.prim_func.name} backend={self.backend_name} kernels={len(self.parts)}>"


def jit(fn=None, *, backend: Optional[str] = None):
    """``@T.jit``: the eager kernel style (module docstring above): tensor parameters
    annotated in the body, ``T.const`` sizes, ``T.empty`` outputs returned.  Calling the
    result on tensors specialises, builds (on ``backend``, default: the tensors' device's
    default backend) and runs it, caching each specialisation; ``.compile(**params)``
    specialises explicitly.  ``@T.prim_func`` stays the way to write a traced-once kernel."""
    if fn is None:
        return lambda f: JITFunction(f, backend)
    return JITFunction(fn, backend)
