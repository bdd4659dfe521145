"""Bound launches for the MoE and routing ops' hot path.

At decode sizes (T = 1) the MoE path is a handful of tiny kernels, and each call's fixed
costs (the tuning chooser, the compiled kernel's argument signature and plan lookup) cost
more than the kernel.  An op that has already checked its arguments calls :func:`launch`
with a key naming everything the kernel choice and the launch plan depend on: the op, the
backend argument, the device, the dtypes, every shape and non-contiguous stride, and the
scalar values passed to the kernel.  The first call with that key chooses and compiles the
kernel and binds the launch (:meth:`kernforge.jit.kernel.CompiledKernel.bind`, as
:mod:`kernforge.ops.gemm` does); later ones only read the buffers' addresses.  The
tuning database's :func:`~kernforge.tune.consult.stamp` is part of every key, so a newly
tuned configuration is seen at once (:func:`chosen` memoises the choosers' results the same
way, for ops that size buffers from them).  The value checks (index ranges, NaN) stay in the ops:
they depend on the data, not on the signature.
"""
from __future__ import annotations

from typing import Callable

from kernforge.tune import consult

_BOUND: dict = {}   # key + stamp -> launch taking the kernel's argument tuple
_SIZE = 1024


def launch(key: tuple, make: Callable, args: tuple) -> None:
    """Run ``make()`` (a compiled kernel, called only on a miss) on ``args``."""
    _bound(key + consult.stamp(), make, args)(args)


class Bound:
    """One call signature's launch, for an op that memoises a plan of its own on everything
    :func:`launch`'s ``key`` names plus the stamp (so a plan made under one stamp is never
    used under another): calling it runs the launch, bound on the first call (through the
    shared table, as :func:`launch`), after which it skips the stamp, the key's hash and the
    table lookup (about 1 us a launch, five launches a decode step's MoE routing)."""

    __slots__ = ("key", "make", "run")

    def __init__(self, key: tuple, make: Callable):
        self.key, self.make, self.run = key, make, None

    def __call__(self, args: tuple) -> None:
        run = self.run
        if run is None:
            run = self.run = _bound(self.key + consult.stamp(), self.make, args)
        run(args)


def _bound(full: tuple, make: Callable, args: tuple) -> Callable:
    """The bound launch under ``full`` (key + stamp), bound from ``args`` on a miss."""
    run = _BOUND.get(full)
    if run is None:
        kernel = make()
        run = kernel.bind(*args)
        if run is None:     # the backend cannot bind (checked build, an empty grid): plain calls
            def run(a, kernel=kernel):
                kernel(*a)
        if len(_BOUND) >= _SIZE:
            _BOUND.clear()
        _BOUND[full] = run
    return run


_CHOSEN: dict = {}  # key + stamp -> a chooser's result


def chosen(key: tuple, choose: Callable):
    """``choose()``'s result (kernel parameters), memoised under ``key``, which must name every
    input of the chooser; the stamp is added here, as for :func:`launch`."""
    full = key + consult.stamp()
    hit = _CHOSEN.get(full)
    if hit is None:
        hit = choose()
        if len(_CHOSEN) >= _SIZE:
            _CHOSEN.clear()
        _CHOSEN[full] = hit
    return hit
