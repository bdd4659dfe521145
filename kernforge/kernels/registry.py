"""The kernel library's catalogue: what ``kernforge list/emit/run/build/demo`` iterate.

Each kernel family's ``problems`` module registers one :class:`KernelSpec` per kernel.  A spec
knows how to specialise its DSL factory for a problem size, make random inputs
(never all zeros), and compute an independent torch reference, so the CLI, the
demo, the tests and ``benchmarks/gpu_check.py`` all check kernels the same way.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

# modules that register kernels when imported
_FAMILIES = ("kernforge.kernels.topk.problems", "kernforge.kernels.mla_decode.problems",
             "kernforge.kernels.grouped_gemm.problems",
             "kernforge.kernels.gemm.problems",
             "kernforge.kernels.norm.problems", "kernforge.kernels.rope.problems",
             "kernforge.kernels.hadamard.problems", "kernforge.kernels.hyper_connection.problems",
             "kernforge.kernels.embedding.problems",
             "kernforge.kernels.quant.problems", "kernforge.kernels.routing.problems",
             "kernforge.kernels.moe_permute.problems", "kernforge.kernels.swiglu.problems",
             "kernforge.kernels.indexer.problems", "kernforge.kernels.kv_quant.problems",
             "kernforge.kernels.compressor.problems")


@dataclass(frozen=True)
class Problem:
    """One problem size for a kernel: compile-time params plus a label.  ``cuda_archs``: the CUDA
    arches the params are configured for, when not all (MLA's ``bench`` takes the sm_90a
    chooser's 64-token tiles, which exceed sm_80's shared memory); tools that sweep problems
    over arches (``benchmarks/gpu_check.py``, the source digests) skip the others."""

    label: str
    params: dict[str, Any]
    cuda_archs: tuple[str, ...] = ()

    def for_cuda_arch(self, arch: str) -> bool:
        return not self.cuda_archs or arch in self.cuda_archs


@dataclass(frozen=True)
class KernelSpec:
    """A library kernel as the tools see it.

    * ``factory``: a ``@T.tunable`` KernelFactory (or a function of params
      returning a PrimFunc).
    * ``runtime_sizes``: problem keys that only size the inputs (batch, sequence
      lengths, rows per expert) and are not compile-time parameters; the spec's
      ``factory`` drops them, so every tool can pass a problem's params whole.
    * ``problems``: named sizes; ``"small"`` is used by tests and emulation,
      ``"demo"`` by ``kernforge demo``/``run``, ``"bench"`` by benchmarks.
    * ``make_inputs(params, seed, device)`` -> list of torch tensors in the
      kernel's parameter order (outputs included, poisoned with NaN/sentinels).
    * ``outputs``: indices into that list of the outputs to check.
    * ``reference(inputs, params)`` -> list of torch tensors, one per output.
    * ``check(outputs, expected, inputs, params)`` -> raises AssertionError with a
      message when results disagree (tolerances are the spec's business: exact
      for indices, bf16 tolerance for low precision).
    * ``build(backend, params)`` -> what runs one configuration, called with
      ``make_inputs``' list like a compiled kernel, for a kernel that is more than
      one launch at some configurations (``mla_decode_splitkv``: the split kernel,
      then the combine); ``None``: the factory, compiled.  See :meth:`compile`.
    """

    name: str
    family: str
    description: str
    factory: Callable
    problems: dict[str, Problem]
    make_inputs: Callable
    outputs: tuple[int, ...]
    reference: Callable
    check: Callable
    flops: Optional[Callable] = None  # params -> flop count, for reports
    bytes: Optional[Callable] = None  # params -> bytes moved, for reports
    tags: tuple[str, ...] = field(default_factory=tuple)
    runtime_sizes: tuple[str, ...] = ()
    build: Optional[Callable] = None

    def __post_init__(self):
        if self.runtime_sizes:
            object.__setattr__(self, "factory", _DropSizes(self.factory, self.runtime_sizes))

    def compile(self, backend: str, **params):
        """The runnable for the whole configuration ``params`` (runtime sizes may be in it)
        on ``backend``: ``build``'s, else the factory compiled.  The tuner builds every
        configuration through this, so that what it verifies and times is what the op runs."""
        if self.build is not None:
            return self.build(backend, {k: v for k, v in params.items() if k not in self.runtime_sizes})
        import kernforge

        return kernforge.compile(self.factory, backend=backend, **params)


class _DropSizes:
    """A kernel factory called with a whole problem: the runtime sizes are removed before
    the compile-time parameters reach it.  Keeps the factory's tuning space visible."""

    def __init__(self, factory: Callable, sizes: tuple[str, ...]):
        self.factory = factory
        self.sizes = frozenset(sizes)
        self.space = getattr(factory, "space", {})
        self.name = getattr(factory, "name", getattr(factory, "__name__", "kernel"))
        self.__module__ = getattr(factory, "fn", factory).__module__

    def __call__(self, **params):
        return self.factory(**{k: v for k, v in params.items() if k not in self.sizes})


_SPECS: dict[str, KernelSpec] = {}


def register(spec: KernelSpec) -> KernelSpec:
    if spec.name in _SPECS and _SPECS[spec.name] is not spec:
        raise ValueError(f"kernel {spec.name!r} registered twice")
    _SPECS[spec.name] = spec
    return spec


def all_specs() -> dict[str, KernelSpec]:
    for m in _FAMILIES:
        importlib.import_module(m)
    return dict(_SPECS)


def get(name: str) -> KernelSpec:
    specs = all_specs()
    if name not in specs:
        raise KeyError(f"unknown kernel {name!r}; known: {', '.join(sorted(specs))}")
    return specs[name]
