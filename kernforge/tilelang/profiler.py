"""``tilelang.profiler``: ``do_bench`` and the kernel profiler (``kernel.get_profiler()``),
timing on whichever backend the kernel was built for.

Timing is host wall-clock around the calls (``torch.cuda.synchronize`` first and last when
the kernel runs on a GPU), which is what every kernforge backend can give; TileLang's
``warmup``/``rep`` are time budgets in milliseconds, as in Triton's ``do_bench``.
"""
from __future__ import annotations

import enum
import statistics
import time
from typing import Callable, Optional


class TensorSupplyType(enum.Enum):
    """How :class:`Profiler` fills a kernel's inputs (TileLang's names)."""

    Integer = 1
    Uniform = 2
    Normal = 3
    Randn = 4
    Zero = 5
    One = 6
    Auto = 7


def _sync(device: Optional[str]) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def do_bench(fn: Callable, warmup: float = 25, rep: float = 100, _n_warmup: int = 0,
             _n_repeat: int = 0, quantiles=None, return_mode: str = "mean", device: Optional[str] = None,
             **_ignored) -> float:
    """Milliseconds per call of ``fn()``: ``warmup`` ms (or ``_n_warmup`` calls) of warm-up,
    then ``rep`` ms (or ``_n_repeat`` calls) of timed calls, each timed alone.  ``return_mode``
    "mean", "median", "min" or "max"; ``quantiles`` returns those quantiles instead."""
    if return_mode not in ("mean", "median", "min", "max"):
        raise ValueError(f"do_bench return_mode must be mean, median, min or max, got {return_mode!r}")
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    est = max((time.perf_counter() - t0) * 1e3, 1e-3)
    n_warm = _n_warmup or max(0, int(warmup / est))
    n_rep = _n_repeat or max(1, int(rep / est))
    for _ in range(n_warm):
        fn()
    times = []
    for _ in range(n_rep):
        _sync(device)
        t = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - t) * 1e3)
    if quantiles is not None:
        qs = statistics.quantiles(times, n=100, method="inclusive") if len(times) > 1 else times * 99
        out = [times[0] if q <= 0 else qs[min(98, max(0, round(q * 100) - 1))] for q in quantiles]
        return out[0] if len(out) == 1 else out
    return {"mean": statistics.fmean, "median": statistics.median, "min": min, "max": max}[return_mode](times)


class Profiler:
    """``kernel.get_profiler(tensor_supply_type=...)``: inputs made from the kernel's
    parameters (static shapes), :meth:`assert_allclose` against a reference program and
    :meth:`do_bench`."""

    def __init__(self, kernel, supply_type: TensorSupplyType = TensorSupplyType.Auto):
        self.kernel = kernel
        self.supply_type = supply_type
        self._inputs = None

    def _make(self, p):
        import torch

        from kernforge.codegen import arith

        shape = []
        for d in p.shape:
            v = arith.const_int(d)
            if v is None:
                raise ValueError(f"profiler: parameter {p.name!r} has symbolic shape {p.shape}; pass "
                                 "input_tensors, or specialise the sizes")
            shape.append(v)
        dt, dev = p.dtype.torch, self.kernel.device
        st = self.supply_type
        if st is TensorSupplyType.Zero:
            return torch.zeros(shape, dtype=dt, device=dev)
        if st is TensorSupplyType.One:
            return torch.ones(shape, dtype=dt, device=dev)
        if not p.dtype.is_float or st is TensorSupplyType.Integer:
            if p.dtype.is_bool:
                return torch.randint(0, 2, shape, device=dev).to(dt)
            lo, hi = (0, 4) if p.dtype.name.startswith("uint") else (-2, 3)
            return torch.randint(lo, hi, shape, device=dev).to(dt)
        if st is TensorSupplyType.Uniform:
            return torch.rand(shape, device=dev).to(dt)
        return torch.randn(shape, device=dev).to(dt)

    @property
    def func(self):
        """The kernel itself (TileLang's ``profiler.func(*tensors)`` runs it)."""
        return self.kernel

    def get_inputs(self):
        """The generated inputs (made once, then reused)."""
        if self._inputs is None:
            self._inputs = [self._make(p) for p in self.kernel.input_params]
        return self._inputs

    def run_once(self, func: Optional[Callable] = None):
        return (func or self.kernel)(*self.get_inputs())

    def assert_allclose(self, reference_program: Callable, input_tensors=None, atol: float = 1e-2,
                        rtol: float = 1e-2, max_mismatched_ratio: float = 0.01) -> None:
        """Run the kernel and ``reference_program`` on the same inputs and compare every
        output: at most ``max_mismatched_ratio`` of the elements may miss ``atol + rtol *
        |ref|``, and none may be NaN where the reference is not."""
        import torch

        inputs = list(input_tensors) if input_tensors is not None else self.get_inputs()
        got = self.kernel(*inputs)
        ref = reference_program(*inputs)
        got = list(got) if isinstance(got, (tuple, list)) else [got]
        ref = list(ref) if isinstance(ref, (tuple, list)) else [ref]
        if len(got) != len(ref):
            raise AssertionError(f"kernel returned {len(got)} outputs, reference {len(ref)}")
        for i, (g, r) in enumerate(zip(got, ref)):
            g, r = g.double().cpu(), torch.as_tensor(r).to(g.device).double().cpu()
            if g.shape != r.shape:
                raise AssertionError(f"output {i}: shape {tuple(g.shape)} vs reference {tuple(r.shape)}")
            bad = ~torch.isclose(g, r, rtol=rtol, atol=atol, equal_nan=True)
            ratio = bad.double().mean().item() if bad.numel() else 0.0
            nan = (torch.isnan(g) & ~torch.isnan(r)).any().item()
            if ratio > max_mismatched_ratio or nan:
                diff = (g - r).abs().nan_to_num(float("inf")).max().item()
                raise AssertionError(f"output {i}: {ratio:.2%} of elements mismatch (allowed "
                                     f"{max_mismatched_ratio:.2%}), max abs diff {diff:g}")

    def do_bench(self, func: Optional[Callable] = None, warmup: float = 25, rep: float = 100,
                 n_warmup: int = 1, n_repeat: int = 1, input_tensors=None, **kwargs) -> float:
        """Milliseconds per call of the kernel (or of ``func``, e.g. the torch reference)
        on the profiler's inputs."""
        inputs = list(input_tensors) if input_tensors is not None else self.get_inputs()
        f = func or self.kernel
        return do_bench(lambda: f(*inputs), warmup, rep, device=self.kernel.device, **kwargs)
