"""``tilelang.jit`` and ``tilelang.compile`` on kernforge.

Both of TileLang's styles are accepted by one decorator:

* the prim_func factory (``def matmul(M, N, K, ...)`` returning a ``@T.prim_func``): the
  call returns a compiled :class:`JITKernel`, cached per argument set;
* the eager style (``T.const`` sizes, in-body ``A: T.Tensor(...)`` annotations, ``T.empty``
  outputs returned): :class:`kernforge.dsl.eager.JITFunction` does the work; the call on
  tensors returns the outputs, ``.compile(**params)`` a :class:`JITKernel`.

Which one a function is follows from its source: an eager function opens ``with
T.Kernel`` in its own body, a factory only inside the prim_func it defines.

The backend (:func:`select_backend`): ``$KERNFORGE_TILELANG_BACKEND`` if set (``cpu``,
``interp``, ``cuda-emu``, ``cuda``, any registered backend), else TileLang's ``target``
(``"cuda"`` -> kernforge's cuda, ``"cpu"``/``"c"``/``"llvm"`` -> cpu, or a kernforge backend
name), else (``"auto"``) the inputs' device: CPU tensors run on ``cpu``.
"""
from __future__ import annotations

import ast
import inspect
import os
import textwrap
from typing import Optional

from kernforge import backends
from kernforge.codegen import ir
from kernforge.dsl.compat import UnsupportedError
from kernforge.dsl.eager import JITFunction, Launch
from kernforge.dsl.prim_func import PrimFunc
from kernforge.tilelang.profiler import Profiler, TensorSupplyType

ENV = "KERNFORGE_TILELANG_BACKEND"
_TARGETS = {"cuda": "cuda", "cpu": "cpu", "c": "cpu", "llvm": "cpu"}


class BackendChoiceError(ValueError):
    """``$KERNFORGE_TILELANG_BACKEND`` or ``target=`` names no kernforge backend."""


def select_backend(target=None, tensors=()) -> str:
    """The kernforge backend for TileLang's ``target`` and the call's tensors (module doc)."""
    env = os.environ.get(ENV)
    if env:
        if env not in backends.names():
            raise BackendChoiceError(f"{ENV}={env!r} is not a kernforge backend; choices: "
                                     f"{', '.join(backends.names())}")
        return env
    t = target if isinstance(target, str) or target is None else str(target)
    t = (t or "auto").split()[0]
    if t != "auto":
        if t in backends.names():
            return t
        if t in _TARGETS:
            return _TARGETS[t]
        if t in ("hip", "rocm", "metal", "webgpu"):
            raise UnsupportedError(f"target={target!r}: kernforge has no {t} backend; its backends are "
                                   f"{', '.join(backends.names())}")
        raise BackendChoiceError(f"target={target!r} is not a TileLang target kernforge knows (cuda, "
                                 f"cpu, auto, or a kernforge backend: {', '.join(backends.names())})")
    for x in tensors:
        if type(x).__module__ == "numpy":
            return backends.for_device("cpu")
        if hasattr(x, "device") and hasattr(x.device, "type"):
            return backends.for_tensor(x)
    try:
        import torch

        if torch.cuda.is_available():
            return backends.for_device("cuda")
    except ImportError:
        pass
    return backends.for_device("cpu")


def tilelang_semantics(pf: PrimFunc) -> PrimFunc:
    """``pf`` with TileLang's safe global accesses (:mod:`kernforge.codegen.passes.safe_access`):
    a prim_func handed to the TileLang surface runs as TileLang runs it, while kernforge's own
    ``@T.prim_func`` keeps reporting out-of-bounds accesses."""
    from kernforge.codegen.passes.safe_access import safe_access

    kernels = tuple(safe_access(k) for k in pf.kernels)
    if all(a is b for a, b in zip(kernels, pf.kernels)):
        return pf
    return PrimFunc.from_kernels(pf.fn, pf.name, kernels, getattr(pf, "n_scratch", 0))


class JITKernel:
    """A compiled TileLang kernel: ``kernel(*inputs)`` runs it (outputs in ``out_idx`` are
    allocated and returned), ``get_kernel_source()``, ``get_profiler()``.  With ``target``
    "auto" the backend is fixed by the first call's tensors (and built then); otherwise at
    construction."""

    def __init__(self, prim_func: PrimFunc, out_idx=None, target=None, launch: Optional[Launch] = None):
        # an eager function's launch was built from kernels that already have the safe accesses
        self.prim_func = prim_func if launch is not None else tilelang_semantics(prim_func)
        self.out_idx = out_idx
        self.target = target
        self._launch = launch
        self._launches: dict = {}
        if launch is None and (os.environ.get(ENV) or (target or "auto") != "auto"):
            self._launch = self._build(select_backend(target))

    def _build(self, backend: str) -> Launch:
        if backend not in self._launches:
            self._launches[backend] = Launch(self.prim_func, backend, self.out_idx)
        return self._launches[backend]

    @property
    def launch(self) -> Launch:
        if self._launch is None:
            self._launch = self._build(select_backend(self.target))
        return self._launch

    @property
    def backend(self) -> str:
        """The kernforge backend the kernel runs on."""
        return self.launch.backend_name

    @property
    def device(self) -> str:
        return backends.device(self.backend)

    @property
    def input_params(self):
        """The IR parameters the caller passes (those not in ``out_idx``)."""
        first = self.launch.parts[0]
        return [p for i, p in enumerate(first.ir.params) if i not in first.out_idx]

    def __call__(self, *args):
        launch = self._launch
        if launch is None:
            launch = self._build(select_backend(self.target, args))
        return launch(*args)

    def get_kernel_source(self) -> str:
        """The source that runs (every kernel block's, in launch order)."""
        return self.launch.get_kernel_source()

    def get_profiler(self, tensor_supply_type: TensorSupplyType = TensorSupplyType.Auto) -> Profiler:
        return Profiler(self, tensor_supply_type)

    def __repr__(self) -> str:
        return f"<tilelang JITKernel {self.prim_func.name} on {self._launch.backend_name if self._launch else 'auto'}>"


def compile(func, out_idx=None, target="auto", target_host=None, execution_backend="auto",  # noqa: A001
            verbose=False, pass_configs=None, compile_flags=None, **_ignored) -> JITKernel:
    """``tilelang.compile(prim_func, out_idx=..., target=...)``: a :class:`JITKernel`.
    ``execution_backend``, ``pass_configs``, ``compile_flags`` and ``verbose`` configure
    TileLang's own toolchain and have no kernforge counterpart; they are accepted and unused."""
    if isinstance(func, JITKernel):
        return func
    if not isinstance(func, PrimFunc):
        raise TypeError(f"tilelang.compile expects a @T.prim_func, got {type(func).__name__}")
    return JITKernel(func, out_idx, target)


def _is_eager(fn) -> bool:
    """Whether ``fn`` opens ``with T.Kernel`` in its own body (the eager style) rather than only
    inside a nested prim_func (the factory style)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return False
    top = tree.body[0]
    stack = list(getattr(top, "body", []))
    while stack:
        n = stack.pop()
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(n, ast.With):
            return True
        stack.extend(ast.iter_child_nodes(n))
    return False


class _EagerJIT(JITFunction):
    """The DSL's eager function, choosing backends as TileLang does (module doc)."""

    def __init__(self, fn, target):
        super().__init__(fn)
        self.target = target

    def select_backend(self, tensors) -> str:
        return select_backend(self.target, tensors)

    def compile(self, *args, **params) -> JITKernel:  # noqa: A003
        launch = super().compile(*args, **params)
        return JITKernel(launch.prim_func, launch.out_idx, self.target, launch=launch)


class _FactoryJIT:
    """``@tilelang.jit`` over a prim_func factory: ``f(*compile_time_args)`` is a cached
    :class:`JITKernel`."""

    def __init__(self, fn, out_idx, target):
        self.fn, self.out_idx, self.target = fn, out_idx, target
        self._cache: dict = {}
        self.__wrapped__ = fn
        self.__name__ = fn.__name__
        self.__doc__ = fn.__doc__

    def __call__(self, *args, **kwargs) -> JITKernel:
        key = (tuple(map(repr, args)), tuple(sorted((k, repr(v)) for k, v in kwargs.items())))
        if key not in self._cache:
            pf = self.fn(*args, **kwargs)
            if not isinstance(pf, PrimFunc):
                raise TypeError(f"@tilelang.jit function {self.fn.__name__} must return a @T.prim_func "
                                f"(or open `with T.Kernel` itself, the eager style); got {type(pf).__name__}")
            self._cache[key] = JITKernel(pf, self.out_idx, self.target)
        return self._cache[key]

    compile = __call__

    def get_tir(self, *args, **kwargs) -> PrimFunc:
        return self.fn(*args, **kwargs)


def jit(func=None, *, out_idx=None, target="auto", target_host=None, execution_backend="auto",
        verbose=False, pass_configs=None, debug_root_path=None, compile_flags=None, **_ignored):
    """``@tilelang.jit`` / ``@tilelang.jit(out_idx=[-1], target="cuda")``, either style
    (module doc).  TileLang's toolchain options are accepted and unused."""
    def deco(fn):
        if _is_eager(fn):
            if out_idx is not None:
                raise ir.KernelError(f"{fn.__name__}: out_idx does not apply to the eager style (its "
                                     "outputs are the T.empty tensors it returns)",
                                     ir.SourceLoc(fn.__code__.co_filename, fn.__code__.co_firstlineno))
            return _EagerJIT(fn, target)
        return _FactoryJIT(fn, out_idx, target)
    return deco if func is None else deco(func)
