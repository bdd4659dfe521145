"""``kernforge.compile`` and the compiled-kernel object users call.

The compiled kernel is where every argument is checked against the kernel's IR
before anything runs: count, type, dtype, rank, shape (binding symbolic
dimensions consistently), strides, device and scalar ranges.  A mistake raises
a typed error naming the parameter; no backend ever sees a bad pointer.
"""
from __future__ import annotations

import dataclasses
import os
import warnings
from typing import Optional, Sequence, Union

import numpy as np

from kernforge import backends, dtypes
from kernforge.dtypes import is_torch, to_numpy, torch_dtype  # noqa: F401  (re-exported)
from kernforge.codegen import arith, ir
from kernforge.dsl.prim_func import KernelFactory, PrimFunc


class ArgumentError(TypeError):
    """A kernel was called with arguments that do not match its parameters."""


class ShapeError(ArgumentError, ValueError):
    """A tensor's shape or strides do not match the kernel's declaration."""


class CompiledKernel:
    """A kernel specialised, built for one backend, and ready to call.

    ``kernel(*args)`` takes torch tensors or numpy arrays for every parameter
    except those listed in ``out_idx``, which it allocates and returns (as
    ``tilelang.compile(..., out_idx=...)`` does).  Outputs are numpy arrays when every
    buffer argument is one, torch tensors otherwise.  Any other object with
    ``__dlpack__`` (CuPy, JAX, a DLPack-only wrapper) is taken as a zero-copy torch view
    (``torch.from_dlpack``), so the kernel's writes land in the producer's memory and the
    outputs are torch tensors; torch and numpy arguments skip that conversion.

    :meth:`as_torch_op` registers the kernel as a torch custom op (docs/torch-ops.md)."""

    def __init__(self, prim_func: PrimFunc, backend: str = "interp",
                 out_idx: Optional[Union[int, Sequence[int]]] = None, arch: Optional[str] = None,
                 checks: bool = False):
        self.prim_func = prim_func
        self.ir: ir.Kernel = prim_func.ir
        self.backend_name = backend
        self.arch = arch
        self.backend = backends.get(backend)
        n = len(self.ir.params)
        if out_idx is None:
            out_idx = ()
        elif isinstance(out_idx, int):
            out_idx = (out_idx,)
        outs = []
        for i in out_idx:
            if not -n <= i < n:
                raise ArgumentError(f"out_idx {i} out of range for {n} parameters")
            p = self.ir.params[i % n]
            if not isinstance(p, ir.Buffer):
                raise ArgumentError(f"out_idx {i} names scalar parameter {p.name}")
            outs.append(i % n)
        self.out_idx = tuple(outs)
        # launch-time arithmetic (grid, shapes, strides) compiled to closures once, so a
        # call costs microseconds of checking, not a walk of the IR per argument
        self._grid = [arith.compile_int(g) for g in self.ir.grid]
        self._shape = {p: [arith.compile_int(d) for d in p.shape] for p in self.ir.buffer_params}
        self._strides = {p: [arith.compile_int(d) for d in p.strides] for p in self.ir.buffer_params}
        self._plans: dict = {}
        self.target = self.backend.target(arch, launch=True)
        if checks:
            if not getattr(self.backend, "supports_checks", False):
                raise ArgumentError(f"checks=True: backend {backend!r} has no checked mode "
                                    f"(docs/checked-mode.md lists the backends that do)")
            self.target = dataclasses.replace(self.target, checks=True)
        self.checks = self.target.checks
        self.launcher = self.backend.build(self.ir, self.target)
        self._launcher_takes_torch = getattr(self.launcher, "takes_torch", False)

    @property
    def name(self) -> str:
        return self.ir.name

    def get_kernel_source(self) -> str:
        """The source that was built for this kernel's launches (for the target it runs on)."""
        return self.launcher.program.source

    def as_torch_op(self, qualname: str):
        """Register this kernel as the torch custom op ``qualname`` (``"mylib::name"``) and
        return it (a ``torch.library.CustomOpDef``; ``torch.ops.mylib.name`` is the same op),
        so ``torch.compile(fullgraph=True)`` traces through a call instead of breaking the graph.

        The schema follows the parameters: every parameter not in ``out_idx`` is an argument
        in order (buffers ``Tensor``, scalars ``int`` / ``float`` / ``bool``), the ``out_idx``
        buffers are returned, and an argument buffer the kernel body writes is declared
        mutated (``Tensor(a!)``), which is what lets torch.compile and functionalization order
        the writes.  The fake implementation runs this kernel's argument checks on the
        tensors' metadata and returns the outputs' shapes (symbolic dimensions bound from the
        inputs), so bad shapes fail while tracing, with the same typed errors.  Autograd is
        not supported: an input that requires grad (with grad mode on) raises
        :class:`AutogradError`."""
        params = self.ir.params
        written = _written_params(self.ir)
        args, mutated = [], []
        for i, p in enumerate(params):
            if i in self.out_idx:
                continue
            if not isinstance(p, ir.Buffer):
                args.append(f"{'bool' if p.dtype.is_bool else 'int' if p.dtype.is_int else 'float'} {p.name}")
            elif p in written:
                args.append(f"Tensor(a{len(mutated)}!) {p.name}")
                mutated.append(p.name)
            else:
                args.append(f"Tensor {p.name}")
        rets = ", ".join("Tensor" for _ in self.out_idx)
        schema = f"({', '.join(args)}) -> " + (rets if len(self.out_idx) == 1 else f"({rets})")

        def run(*args):
            return self(*args)

        def fake(*args):
            _, _, shapes, _, _ = self._plan(args)
            outs = tuple(self._empty(params[i], shape, True) for i, shape in zip(self.out_idx, shapes))
            return outs[0] if len(outs) == 1 else (outs or None)

        return register_torch_op(qualname, run, schema, fake, mutated)

    # ------------------------------------------------------------------ calling
    def __call__(self, *args):
        params = self.ir.params
        key = _signature(args)
        plan = self._plans.get(key) if key is not None else None
        if plan is None:
            if key is None:  # off the torch/numpy fast path: DLPack producers become torch views
                args = self._from_dlpack(args)
                key = _signature(args)
            plan = self._plan(args)
            if key is not None:
                if len(self._plans) >= _PLAN_CACHE_SIZE:
                    self._plans.clear()
                self._plans[key] = plan
        dims, grid, out_shapes, use_torch, bound = plan
        if not self.out_idx:
            full = args
        else:
            it = iter(args)
            full = [None if i in self.out_idx else next(it) for i in range(len(params))]
            for i, shape in zip(self.out_idx, out_shapes):
                full[i] = self._empty(params[i], shape, use_torch)
        if bound is not None:
            bound(full)
        elif all(g > 0 for g in grid):
            launch_args = [self._device_view(a) if isinstance(p, ir.Buffer) else a
                           for p, a in zip(params, full)]
            self.launcher(launch_args, dims, grid)
        outs = [full[i] for i in self.out_idx]
        if not outs:
            return None
        return outs[0] if len(outs) == 1 else tuple(outs)

    def bind(self, *args):
        """Check ``args`` as a call would and return ``run(args)``, the launch for arguments of
        the same signature (dtypes, shapes, strides, device, scalar values): ``run`` reads the
        buffers' pointers and nothing else.  None when the backend cannot bind (no ``bind`` on
        its launcher, a checked build, numpy buffers, an empty grid) or the kernel allocates
        outputs (``out_idx``).  For callers that key their own cache on that signature (the
        dense GEMM ops), so a repeated call skips even the signature lookup here."""
        if self.out_idx:
            return None
        return self._plan(args)[4]

    def _plan(self, args) -> tuple:
        """Check every argument against the IR and work out the launch: symbol values,
        grid, output shapes, and (for a launcher that can ``bind``, when every buffer is a
        torch tensor and the grid is not empty) the launch with the symbols and scalars
        fixed.  Memoised by the arguments' signature (dtype, shape, strides, device, scalar
        values), which is everything the checks depend on, so an inference loop that repeats
        shapes pays for the checks, and the launcher's boxing, once."""
        params = self.ir.params
        expected = len(params) - len(self.out_idx)
        if len(args) != expected:
            names = [p.name for i, p in enumerate(params) if i not in self.out_idx]
            raise ArgumentError(f"{self.name} takes {expected} arguments ({', '.join(names)}), "
                                f"got {len(args)}")
        it = iter(args)
        full = [None if i in self.out_idx else next(it) for i in range(len(params))]
        use_torch = any(is_torch(a) for a in args) or not args
        env: dict = {}
        for p, a in zip(params, full):
            if a is None:
                continue
            if isinstance(p, ir.Buffer):
                self._bind_buffer(p, a, env)
            else:
                env[p] = self._check_scalar(p, a)
        out_shapes = []
        for i in self.out_idx:
            shape = self._out_shape(params[i], env)
            self._bind_buffer(params[i], self._empty(params[i], shape, use_torch), env)
            out_shapes.append(shape)
        dims = [env[s] for s in self.ir.symbols]
        grid = [g(env) for g in self._grid]
        if any(g < 0 for g in grid):
            raise ShapeError(f"{self.name}: negative grid {grid} for these shapes")
        bound = None
        bind = getattr(self.launcher, "bind", None) if self._launcher_takes_torch else None
        if bind is not None and use_torch and all(g > 0 for g in grid) and \
                all(is_torch(a) for p, a in zip(params, full) if isinstance(p, ir.Buffer) and a is not None):
            bound = bind(dims, {i: a for i, (p, a) in enumerate(zip(params, full)) if not isinstance(p, ir.Buffer)})
        return dims, grid, tuple(out_shapes), use_torch, bound

    def _bind_buffer(self, p: ir.Buffer, a, env: dict) -> None:
        where = f"{self.name}: parameter {p.name!r}"
        if is_torch(a):
            import torch

            if not isinstance(a, torch.Tensor):
                raise ArgumentError(f"{where} expects a tensor, got {type(a).__name__}")
            dev = a.device.type
            if dev != self.backend.device:
                raise ArgumentError(f"{where} is on {dev}, backend {self.backend_name!r} needs "
                                    f"{self.backend.device} tensors")
            shape, dt = tuple(a.shape), torch_dtype(a.dtype)
            strides = tuple(a.stride())
        elif isinstance(a, np.ndarray):
            if self.backend.device != "cpu":
                raise ArgumentError(f"{where}: backend {self.backend_name!r} needs "
                                    f"{self.backend.device} torch tensors, got a numpy array")
            shape, dt = a.shape, dtypes.dtype(a.dtype)
            if any(s % a.itemsize for s in a.strides):
                raise ShapeError(f"{where}: strides {a.strides} are not multiples of the element size")
            strides = tuple(s // a.itemsize for s in a.strides)
        else:
            raise ArgumentError(f"{where} expects a torch tensor or numpy array, got {type(a).__name__}")
        if dt is not p.dtype and dt != p.dtype:
            raise ArgumentError(f"{where} must be {p.dtype}, got {dt}")
        if len(shape) != p.ndim:
            raise ShapeError(f"{where} must have {p.ndim} dimensions {_fmt(p.shape)}, got shape {shape}")
        for d, (want, got, fn) in enumerate(zip(p.shape, shape, self._shape[p])):
            self._bind(want, got, fn, env, f"{where} dim {d}", shape)
        for d, (want, got, n, fn) in enumerate(zip(p.strides, strides, shape, self._strides[p])):
            if got < 0:
                raise ShapeError(f"{where}: negative stride {strides}")
            if isinstance(want, ir.Var) and want not in env:
                env[want] = got
            elif n > 1:
                value = fn(env)
                if value != got:
                    raise ShapeError(f"{where}: stride {d} must be {value} (declared {_fmt(p.strides)}, "
                                     f"contiguous unless T.StridedTensor), got strides {strides}")

    @staticmethod
    def _bind(want: ir.Expr, got: int, fn, env: dict, where: str, shape) -> None:
        if isinstance(want, ir.Var):
            if want in env and env[want] != got:
                raise ShapeError(f"{where}: {want.name} = {got} here but {env[want]} elsewhere "
                                 f"(shape {shape})")
            if got >= 2 ** (want.dtype.bits - 1):
                raise ShapeError(f"{where}: {got} does not fit {want.name}'s {want.dtype}")
            env[want] = got
        elif fn(env) != got:
            raise ShapeError(f"{where} must be {want}, got {got} (shape {shape})")

    @staticmethod
    def _check_scalar(p: ir.Var, a):
        if is_torch(a) or isinstance(a, np.ndarray):
            raise ArgumentError(f"scalar parameter {p.name!r} got an array")
        if p.dtype.is_bool:
            return bool(a)
        if p.dtype.is_int:
            if isinstance(a, float) or not isinstance(a, (int, np.integer)):
                raise ArgumentError(f"scalar parameter {p.name!r} ({p.dtype}) got {a!r}")
            info = np.iinfo(p.dtype.np_dtype)
            if not info.min <= int(a) <= info.max:
                raise ArgumentError(f"scalar parameter {p.name!r} = {a} does not fit {p.dtype}")
            return int(a)
        if not isinstance(a, (int, float, np.floating, np.integer)):
            raise ArgumentError(f"scalar parameter {p.name!r} ({p.dtype}) got {a!r}")
        return float(a)

    def _out_shape(self, p: ir.Buffer, env: dict) -> tuple:
        try:
            return tuple(fn(env) for fn in self._shape[p])
        except ir.KernelError:
            raise ShapeError(f"{self.name}: cannot infer the shape {_fmt(p.shape)} of output "
                             f"{p.name!r} from the inputs") from None

    def _empty(self, p: ir.Buffer, shape: tuple, use_torch: bool):
        if use_torch:
            import torch

            return torch.empty(shape, dtype=p.dtype.torch, device=self.backend.device)
        return np.empty(shape, dtype=p.dtype.np_dtype)

    def _from_dlpack(self, args) -> tuple:
        """``args`` with every buffer argument that is neither torch nor numpy but has
        ``__dlpack__`` replaced by ``torch.from_dlpack(arg)`` (a view: no copy)."""
        inputs = [p for i, p in enumerate(self.ir.params) if i not in self.out_idx]
        if len(inputs) != len(args):
            return args  # _plan names the count mismatch
        out = []
        for p, a in zip(inputs, args):
            if isinstance(p, ir.Buffer) and not is_torch(a) and not isinstance(a, np.ndarray) \
                    and hasattr(a, "__dlpack__"):
                import torch

                a = torch.from_dlpack(a)
            out.append(a)
        return tuple(out)

    def _device_view(self, a):
        """What the launcher takes for buffer ``a``: CPU launchers that read a torch tensor's
        pointer themselves (``takes_torch``) get the tensor, the others a numpy view."""
        if self.backend.device == "cpu" and is_torch(a) and not self._launcher_takes_torch:
            return to_numpy(a)
        return a

    def __repr__(self) -> str:
        return f"<CompiledKernel {self.name} backend={self.backend_name}{' checked' if self.checks else ''}>"


_PLAN_CACHE_SIZE = 64


def _signature(args) -> Optional[tuple]:
    """What the argument checks depend on, as a hashable key (None: not memoisable)."""
    key = []
    for a in args:
        if isinstance(a, np.ndarray):
            key.append((a.dtype, a.shape, a.strides))
        elif is_torch(a) and hasattr(a, "stride"):
            key.append((a.dtype, a.shape, a.stride(), a.device))
        elif isinstance(a, (bool, int, float)):
            key.append((type(a), a))
        else:
            return None
    return tuple(key)


def _fmt(exprs) -> str:
    return "(" + ", ".join(str(e) for e in exprs) + ")"


# ---------------------------------------------------------------- torch custom ops


class AutogradError(ArgumentError, RuntimeError):
    """A kernforge torch op was called with an input that requires grad while grad mode is on:
    the ops are inference-only (no backward formula exists)."""


def _written_params(kernel: ir.Kernel) -> set:
    """The buffers the kernel body writes (stores, atomics, tile-op destinations).  A
    statement type this table does not know counts every buffer it names as written, so a
    new tile op can only make the declared mutations pessimistic, never wrong."""
    written: set = set()
    for n in ir.nodes(kernel.body):
        if isinstance(n, (ir.Store, ir.Atomic)):
            written.add(n.buffer)
        elif isinstance(n, (ir.Copy, ir.Fill)):
            written.add(n.dst.buffer)
        elif isinstance(n, ir.Gemm):
            written.add(n.c.buffer)
        elif isinstance(n, (ir.Reduce, ir.Cumsum)):
            written.add(n.dst)
        elif isinstance(n, ir.OnlineSoftmax):
            written.update((n.scores, n.row_max, n.row_sum, n.rescale))
        elif isinstance(n, ir.RadixFindBucket):
            written.update((n.above, n.need, n.bucket))
        elif isinstance(n, ir.Stmt) and not isinstance(n, _READ_ONLY_STMTS):
            written.update(x for x in ir.walk(n) if isinstance(x, ir.Buffer))
    return written


_READ_ONLY_STMTS = (ir.Seq, ir.Allocate, ir.For, ir.Parallel, ir.If, ir.Sync, ir.Check)
# one Library per op for the autograd kernels below: re-registering an op replaces its library
_AUTOGRAD_LIBS: dict = {}


def register_torch_op(qualname: str, fn, schema: str, fake, mutates_args=()):
    """``torch.library.custom_op(qualname, fn, schema=schema)`` with fake implementation
    ``fake`` and an Autograd kernel that refuses inputs requiring grad *before* ``fn`` runs
    (custom_op's own would run the kernel and fail only at backward).  Shared by
    :meth:`CompiledKernel.as_torch_op` and :mod:`kernforge.ops.torch_library`."""
    import torch

    op = torch.library.custom_op(qualname, fn, mutates_args=tuple(mutates_args), schema=schema)
    op.register_fake(fake)
    namespace, name = qualname.split("::")
    overload = getattr(getattr(torch.ops, namespace), name).default
    arg_names = [a.name for a in overload._schema.arguments if not a.kwarg_only]

    def no_autograd(keyset, *args, **kwargs):
        if torch.is_grad_enabled() and torch._C._any_requires_grad(*args, **kwargs):
            named = list(zip(arg_names, args)) + list(kwargs.items())
            culprit = next((n for n, v in named if _requires_grad(v)), "an input")
            raise AutogradError(f"{qualname}: argument {culprit!r} requires grad, but kernforge ops "
                                "are inference-only (no backward); call under torch.no_grad() / "
                                "torch.inference_mode() or pass a detached tensor")
        with torch._C._AutoDispatchBelowAutograd():
            return overload.redispatch(keyset & torch._C._after_autograd_keyset, *args, **kwargs)

    old = _AUTOGRAD_LIBS.pop(qualname, None)
    if old is not None:
        old._destroy()
    lib = torch.library.Library(namespace, "FRAGMENT")
    with warnings.catch_warnings():
        # replacing custom_op's own Autograd kernel is the point; torch warns about any override
        warnings.filterwarnings("ignore", message="Warning only once for all operators")
        lib.impl(name, no_autograd, "Autograd", with_keyset=True)
    _AUTOGRAD_LIBS[qualname] = lib
    return op


def _requires_grad(v) -> bool:
    if isinstance(v, (list, tuple)):
        return any(_requires_grad(x) for x in v)
    return getattr(v, "requires_grad", False) is True


def checks_default() -> bool:
    """``KERNFORGE_CHECKS``: ``1`` turns checked mode on for every ``compile`` that does not
    say ``checks=``; unset, empty or ``0`` leaves it off."""
    value = os.environ.get("KERNFORGE_CHECKS", "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise ArgumentError(f"KERNFORGE_CHECKS must be 0 or 1, got {value!r}")


def compile(func, backend: str = "interp", out_idx=None, arch: Optional[str] = None,
            target: Optional[str] = None, checks: Optional[bool] = None, **params) -> CompiledKernel:
    """Specialise ``func`` (a PrimFunc, or a ``@T.tunable`` factory with ``params``),
    build it for ``backend`` and return a callable kernel (TileLang's ``tilelang.compile``).

    ``checks=True`` (default: the ``KERNFORGE_CHECKS`` environment variable) builds the
    checked mode: every global, shared and fragment access is bounds-tested and a
    violation raises :class:`kernforge.CheckError` naming the buffer, index, shape and
    the author's line (docs/checked-mode.md)."""
    if target is not None:
        backend = target
    if isinstance(func, KernelFactory):
        func = func(**params)
    elif isinstance(func, PrimFunc):
        if params:
            raise ArgumentError(f"{func.name} has no tunable parameters; got {sorted(params)}")
    elif callable(func):  # a plain factory function of compile-time parameters
        func = func(**params)
    if not isinstance(func, PrimFunc):
        raise ArgumentError(f"kernforge.compile expects a @T.prim_func or @T.tunable factory, "
                            f"got {type(func).__name__}")
    if checks is None:
        checks = checks_default()
    elif not isinstance(checks, bool):
        raise ArgumentError(f"checks must be True or False, got {checks!r}")
    return CompiledKernel(func, backend, out_idx, arch, checks)
