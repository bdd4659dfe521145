"""``@tilelang.autotune(configs=...)`` on ``kernforge.tune``.

TileLang's autotuner compiles every configuration, checks it against ``ref_prog`` and times
it.  Here the sweep is :func:`kernforge.tune.tune` itself, over a kernel spec made for the
call: every configuration is verified before it is timed (against ``ref_prog`` when given,
otherwise against the first configuration run on the ``interp`` backend, the semantic
oracle; ``skip_check=True`` times without checking), and every result is recorded in
kernforge's tuning database, so a second run of the same problem returns at once.

A call that itself gives a tunable parameter (``f(x, blk_m=64)``) is not tuned, as in
TileLang: it compiles and runs that configuration directly.

The configurations are swept as the grid of their values (``kernforge.tune``'s ``grid``
strategy), which equals TileLang's list when it is a product (``itertools.product``, the
usual spelling); points of the grid outside the list are tried too.
"""
from __future__ import annotations

import inspect
from typing import Optional

from kernforge.dsl.prim_func import KernelFactory


def _space(configs: list) -> dict:
    space: dict = {}
    for c in configs:
        for k, v in c.items():
            vals = space.setdefault(k, [])
            if v not in vals:
                vals.append(v)
    return space


def _make(p, supply, gen, device):
    import torch

    from kernforge.codegen import arith
    from kernforge.tilelang.profiler import TensorSupplyType

    shape = [arith.const_int(d) for d in p.shape]
    if any(s is None for s in shape):
        raise ValueError(f"autotune: parameter {p.name!r} has symbolic shape {p.shape}")
    if not p.dtype.is_float or supply is TensorSupplyType.Integer:
        return torch.randint(-2, 3, shape, generator=gen).to(p.dtype.torch).to(device)
    if supply is TensorSupplyType.Uniform:
        return torch.rand(shape, generator=gen).to(p.dtype.torch).to(device)
    return torch.randn(shape, generator=gen).to(p.dtype.torch).to(device)


class AutoTuned:
    """A ``@tilelang.jit`` function whose compile-time configuration is tuned at each new
    problem.  Factory style: ``f(M, N, K)`` returns the best :class:`JITKernel` (``.config``,
    ``.latency`` in ms, ``.tune_result``).  Eager style: ``f(a, b)`` runs the best
    configuration and returns its outputs."""

    def __init__(self, jitted, configs, ref_prog, supply_type, rtol, atol, skip_check, budget_s, strategy,
                 repeats):
        self.jitted = jitted
        self.configs = configs
        self.ref_prog, self.supply_type = ref_prog, supply_type
        self.rtol, self.atol, self.skip_check = rtol, atol, skip_check
        self.budget_s, self.strategy, self.repeats = budget_s, strategy, repeats
        self.__wrapped__ = jitted

    def _configs(self, args, kwargs) -> list:
        c = self.configs(*args, **kwargs) if callable(self.configs) else self.configs
        c = [dict(x) for x in c]
        if not c:
            raise ValueError("autotune: configs is empty")
        return c

    def tune(self, *args, backend: Optional[str] = None, **kwargs):
        """Run (or fetch from the database) the sweep for this call; the ``TuneResult``."""
        import torch

        import kernforge.tune
        from kernforge.dsl.eager import _is_tensor
        from kernforge.kernels.registry import KernelSpec, Problem
        from kernforge.tilelang.jit import _EagerJIT, select_backend, tilelang_semantics
        from kernforge.tilelang.profiler import TensorSupplyType

        configs = self._configs(args, kwargs)
        space = _space(configs)
        fn = self.jitted.fn
        sig = inspect.signature(fn)
        bound = sig.bind_partial(*args, **kwargs).arguments
        eager = isinstance(self.jitted, _EagerJIT)
        tensors = {k: v for k, v in bound.items() if _is_tensor(v)}
        fixed = {k: v for k, v in bound.items() if k not in tensors and k not in space}
        backend = backend or select_backend(self.jitted.target, list(tensors.values()))
        if eager:
            def build(**params):
                return self.jitted.get_tir(**tensors, **params)
            build.__signature__ = sig.replace(parameters=[p for p in sig.parameters.values() if p.name not in tensors])
        else:
            def build(*a, **params):
                return tilelang_semantics(fn(*a, **params))
            build.__signature__ = sig
        build.__name__ = fn.__name__
        factory = KernelFactory(build, space)
        first = factory(**dict(fixed, **configs[0]))
        params = first.kernels[0].params
        n_in = len(tensors) if eager else None
        if eager:
            outs = tuple(range(n_in, len(params)))
        else:
            idx = self.jitted.out_idx
            idx = [] if idx is None else [idx] if isinstance(idx, int) else list(idx)
            outs = tuple(sorted(i % len(params) for i in idx))
        supply = self.supply_type or TensorSupplyType.Auto

        def make_inputs(problem, seed, device):
            gen = torch.Generator().manual_seed(seed)
            given = iter(tensors.values())
            out = []
            for i, p in enumerate(params):
                if i in outs:
                    shape = [int(d.value) for d in p.shape]
                    fill = float("nan") if p.dtype.is_float else -7
                    out.append(torch.full(shape, fill, device=device).to(p.dtype.torch))
                elif eager:
                    out.append(next(given).clone())
                else:
                    out.append(_make(p, supply, gen, device))
            return out

        def reference(inputs, problem):
            if self.skip_check:
                return None
            if self.ref_prog is not None:
                r = self.ref_prog(*[t for i, t in enumerate(inputs) if i not in outs])
                return list(r) if isinstance(r, (tuple, list)) else [r]
            import kernforge

            oracle = kernforge.compile(factory, backend="interp", **dict(problem, **configs[0]))
            cpu = [t.cpu() for t in inputs]
            oracle(*cpu)
            return [cpu[i] for i in outs]

        def check(got, expected, inputs, problem):
            if expected is None:
                return
            for g, e in zip(got, expected):
                torch.testing.assert_close(g.double().cpu(), torch.as_tensor(e).double().cpu(),
                                           rtol=self.rtol, atol=self.atol, equal_nan=True)

        spec = KernelSpec(f"tilelang.{fn.__name__}", "tilelang", "a TileLang function tuned by "
                          "kernforge.tilelang.autotune", factory,
                          {"call": Problem("call", dict(fixed, **configs[0]))}, make_inputs, outs,
                          reference, check)
        return kernforge.tune.tune(spec, backend=backend, problem="call", space=space,
                                   strategy=self.strategy, budget_s=self.budget_s, repeats=self.repeats)

    def given_tunables(self, args, kwargs) -> list:
        """The tunable parameters (the first configuration's keys) the call gives itself.  As
        in TileLang's autotuner, a call that gives any of them is not tuned: it runs as a
        plain ``@tilelang.jit`` call with the values given (and the defaults for the rest)."""
        bound = inspect.signature(self.jitted.fn).bind_partial(*args, **kwargs).arguments
        return [k for k in self._configs(args, kwargs)[0] if k in bound]

    def compile(self, **params):
        """``f.compile(**params)`` of an eager function: with any tunable parameter given, as in
        TileLang's autotuner, that configuration (the defaults for the rest) is compiled untuned,
        a :class:`JITKernel`.  Tuning needs inputs to time: call the function on tensors."""
        from kernforge.dsl.compat import UnsupportedError

        if not hasattr(self.jitted, "compile"):
            raise TypeError(f"{self.jitted.fn.__name__} is a factory: call it with its parameters")
        named = inspect.signature(self.jitted.fn).parameters  # sizes (T.const) are not parameters
        if self.given_tunables((), {k: v for k, v in params.items() if k in named}):
            return self.jitted.compile(**params)
        raise UnsupportedError(f"{self.jitted.fn.__name__}.compile({', '.join(params)}) gives no tunable "
                               f"parameter ({', '.join(self._configs((), {})[0])}): kernforge tunes an "
                               "eager function on a call with tensors, f(*tensors)")

    def __call__(self, *args, **kwargs):
        from kernforge.tilelang.jit import _EagerJIT

        if self.given_tunables(args, kwargs):
            return self.jitted(*args, **kwargs)
        res = self.tune(*args, **kwargs)
        if res.best is None:
            reasons = "; ".join(r.reason for r in res.rejected[:3])
            raise ValueError(f"autotune: no configuration of {self.jitted.fn.__name__} passed ({reasons})")
        best = {k: v for k, v in res.best.items()}
        if isinstance(self.jitted, _EagerJIT):
            return self.jitted(*args, **dict(kwargs, **best))
        kernel = self.jitted(*args, **dict(kwargs, **best))
        kernel.config = best
        kernel.latency = res.ranked[0].median_ms
        kernel.tune_result = res
        return kernel


def autotune(configs=None, warmup: float = 25, rep: float = 100, timeout=None, supply_type=None,
             ref_prog=None, rtol: float = 1e-2, atol: float = 1e-2, skip_check: bool = False,
             budget_s: Optional[float] = None, strategy: str = "grid", repeats: int = 5, **_ignored):
    """``@tilelang.autotune(configs=[{...}, ...])`` over ``@tilelang.jit``: see the module
    docstring.  ``warmup``/``rep``/``timeout`` are TileLang's timing knobs; kernforge.tune
    times each configuration with ``repeats`` samples of ~1 ms instead (``budget_s`` caps the
    sweep, ``strategy`` is grid, random or halving)."""
    if configs is None:
        raise TypeError("tilelang.autotune needs configs= (a list of dicts, or a function returning one)")

    def deco(jitted):
        if not hasattr(jitted, "fn"):
            raise TypeError("@tilelang.autotune must decorate a @tilelang.jit function")
        return AutoTuned(jitted, configs, ref_prog, supply_type, rtol, atol, skip_check, budget_s,
                         strategy, repeats)
    return deco
