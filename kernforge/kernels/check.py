"""Run a kernel on one backend: build, verify against an independent answer, time.

Shared by ``kernforge run``, ``kernforge demo``, the tests and the benchmarks so
that every tool checks kernels the same way (random non-zero inputs, poisoned
outputs, the spec's own tolerance):

* :func:`run_spec`: a library kernel, checked against its torch reference, and the
  reference timed on the same inputs with the same repeats (the ``vs torch`` column);
* :func:`run_kernel`: an author's own ``@T.prim_func``, which has no torch reference,
  so it is checked against the interpreter, the semantic oracle.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, fields
from typing import Callable, Optional

import kernforge
from kernforge import backends
from kernforge.codegen import arith, ir
from kernforge.kernels.registry import KernelSpec

# Told what a long step is doing ("building topk_bf16 for cuda-emu"); the CLI draws it on a terminal.
Progress = Optional[Callable[[str], None]]


class ProblemError(ValueError):
    """A problem size, dimension or scalar value that does not fit the kernel (names the choices)."""


@dataclass
class RunResult:
    kernel: str
    backend: str
    problem: str
    verified: bool
    build_s: float
    median_ms: Optional[float]
    error: str = ""
    label: str = "verified"  # the backend's own wording, e.g. "CUDA semantics verified on host emulation"
    torch_ms: Optional[float] = None  # the torch reference on the same inputs, same repeats

    HEADER = ("kernel", "backend", "problem", "result", "build s", "median ms", "torch ms", "vs torch")

    @property
    def vs_torch(self) -> Optional[float]:
        """torch time / kernforge time: above 1 means kernforge is faster than the torch reference."""
        if self.median_ms is None or self.torch_ms is None or self.median_ms <= 0:
            return None
        return self.torch_ms / self.median_ms

    def row(self) -> list[str]:
        status = self.label if self.verified else f"FAILED: {self.error}"
        ms = lambda t: f"{t:.3f}" if t is not None else "-"  # noqa: E731
        ratio = f"{self.vs_torch:.2f}x" if self.vs_torch is not None else "-"
        return [self.kernel, self.backend, self.problem, status, f"{self.build_s:.2f}", ms(self.median_ms),
                ms(self.torch_ms), ratio]

    def to_json(self) -> dict:
        return dict(asdict(self), vs_torch=self.vs_torch)


def default_problem(spec: KernelSpec, backend: Optional[str] = None) -> str:
    """The problem a tool runs when none is named.  Oracles and emulators (``speed_path`` False)
    get the smallest, since they run the kernel on the host thread by thread; the others,
    and emit/build (``backend`` None), get ``"demo"``.  Problems are declared smallest first."""
    if backend is not None and not backends.get(backend).speed_path:
        return next(iter(spec.problems))
    return "demo" if "demo" in spec.problems else next(iter(spec.problems))


def problem_sizes(spec: KernelSpec, label: str) -> str:
    """What problem ``label`` sizes, compactly (``batch=3 vocab=700 k=16``): its parameters except
    the tile configuration the factory tunes; equal-valued lists read ``[4096]*128``."""
    space = getattr(spec.factory, "space", {})

    def compact(v) -> str:
        if isinstance(v, (list, tuple)):
            if len(v) > 4 and len(set(v)) == 1:
                return f"[{v[0]}]*{len(v)}"
            return "[" + ",".join(map(str, v)) + "]"
        return str(v)

    return " ".join(f"{k}={compact(v)}" for k, v in spec.problems[label].params.items() if k not in space)


def get_problem(spec: KernelSpec, label: str):
    """``spec``'s problem ``label``; :class:`ProblemError` listing the choices and their sizes if none."""
    found = spec.problems.get(label)
    if found is None:
        choices = "; ".join(f"{k} ({problem_sizes(spec, k)})" for k in spec.problems)
        raise ProblemError(f"unknown problem {label!r} for {spec.name}; choices: {choices}")
    return found


def _timed(fn, repeat: int, device: str) -> Optional[float]:
    """Median milliseconds of ``repeat`` calls of ``fn`` (None for no repeats)."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        if device == "cuda":
            import torch

            torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times) if times else None


def run_spec(spec: KernelSpec, backend: str, problem: str = "demo", repeat: int = 5,
             seed: int = 0, arch: Optional[str] = None, progress: Progress = None,
             checks: Optional[bool] = None) -> RunResult:
    """Build ``spec`` for ``backend`` at ``problem`` size, check it, and time ``repeat`` runs
    of the kernel and of its torch reference on the same inputs (``checks``: checked mode,
    default ``KERNFORGE_CHECKS``)."""
    say = progress or (lambda _msg: None)
    prob = get_problem(spec, problem)
    t0 = time.perf_counter()
    say(f"building {spec.name} for {backend} ({problem})")
    options = {k: v for k, v in (("arch", arch), ("checks", checks)) if v is not None}
    try:  # a spec with its own ``build`` (a split kernel plus its combine) runs as the op would run it
        kernel = spec.compile(backend, **prob.params, **options) if spec.build is not None else \
            kernforge.compile(spec.factory, backend=backend, **options, **prob.params)
    except Exception as e:  # reported in the table, never swallowed: the row says FAILED
        return RunResult(spec.name, backend, problem, False, time.perf_counter() - t0, None,
                         f"build: {type(e).__name__}: {e}")
    build_s = time.perf_counter() - t0
    device = backends.device(backend)  # the torch device type the backend's buffers live on
    inputs = spec.make_inputs(prob.params, seed, device)
    say(f"running {spec.name} on {backend} ({problem})")
    try:
        kernel(*inputs)
        expected = spec.reference(inputs, prob.params)
        spec.check([inputs[i] for i in spec.outputs], expected, inputs, prob.params)
    except AssertionError as e:
        return RunResult(spec.name, backend, problem, False, build_s, None, f"mismatch: {e}")
    except Exception as e:
        return RunResult(spec.name, backend, problem, False, build_s, None,
                         f"run: {type(e).__name__}: {e}")
    say(f"timing {spec.name} on {backend} ({repeat} runs, then the torch reference)")
    median = _timed(lambda: kernel(*inputs), repeat, device)
    torch_ms = _timed(lambda: spec.reference(inputs, prob.params), repeat, device)
    return RunResult(spec.name, backend, problem, True, build_s, median,
                     label=getattr(backends.get(backend), "verified_label", "verified"), torch_ms=torch_ms)


# ---------------------------------------------------------------- an author's own kernel

# rtol per dtype family for the comparison with the interpreter; atol scales with the
# output's magnitude, since backends may reduce in another order than the interpreter
_RTOL = {"float64": 1e-9, "float32": 1e-4, "float16": 2e-3, "bfloat16": 2e-2}
_FP8_RTOL = 0.13  # e4m3 / e5m2: 3 or 2 mantissa bits
# where a statement writes a buffer without reading it first: only such outputs are poisoned
_DEST_FIELDS = {(ir.Store, "buffer"), (ir.Copy, "dst"), (ir.Fill, "dst"), (ir.Cumsum, "dst")}


def poisoned_outputs(kernel: ir.Kernel) -> set:
    """Ids of the global parameters the kernel writes but never reads.  Those start as NaN (or
    an integer sentinel) so that an element a backend forgets to write cannot pass by
    matching random input; a buffer the kernel also reads (an atomic accumulator, ``C +=``)
    keeps random contents, as its result depends on them."""
    params = {id(p) for p in kernel.buffer_params}
    written, read = set(), set()
    for n in ir.nodes(kernel.body):
        if isinstance(n, (ir.Region, ir.Buffer, ir.Var, ir.Const)):
            continue  # reached through their statement, whose field says read or write
        for f in fields(n):
            values = getattr(n, f.name)
            for v in values if isinstance(values, tuple) else (values,):
                b = v.buffer if isinstance(v, ir.Region) else v if isinstance(v, ir.Buffer) else None
                if b is None or id(b) not in params:
                    continue
                dest = ((type(n), f.name) in _DEST_FIELDS
                        or (isinstance(n, ir.Gemm) and f.name == "c" and n.clear_accum)
                        or (isinstance(n, ir.Reduce) and f.name == "dst" and n.clear))
                (written if dest else read).add(id(b))
    return written - read


def kernel_inputs(kernel: ir.Kernel, dims: dict, scalars: dict, seed: int = 0) -> list:
    """Random CPU arguments for every parameter of ``kernel``: ``dims`` sizes its symbolic
    dimensions (by name), ``scalars`` gives scalar parameters (float ones default to a random
    value in [0.5, 1.5); integer and bool ones must be given, as they usually size or index).
    Floats are normal, integers in [0, 8); outputs the kernel only writes are poisoned."""
    import torch

    g = torch.Generator().manual_seed(seed)
    shape_syms = [n for p in kernel.buffer_params for e in p.shape for n in ir.walk(e) if isinstance(n, ir.Var)]
    known = list(dict.fromkeys(s.name for s in shape_syms))
    for name in dims:
        if name not in known:
            raise ProblemError(f"{kernel.name} has no symbolic dimension {name!r} "
                               f"(its symbolic dimensions: {', '.join(known) or 'none'})")
    missing = [n for n in known if n not in dims]
    if missing:
        raise ProblemError(f"{kernel.name} has symbolic dimension(s) {', '.join(missing)}: give each a size "
                           f"(kernforge run: --dim {missing[0]}=128)")
    env = {s: int(dims[s.name]) for s in shape_syms}
    scalar_params = [p for p in kernel.params if isinstance(p, ir.Var)]
    for name in scalars:
        if name not in [p.name for p in scalar_params]:
            raise ProblemError(f"{kernel.name} has no scalar parameter {name!r} "
                               f"(its scalars: {', '.join(p.name for p in scalar_params) or 'none'})")
    poison = poisoned_outputs(kernel)
    out = []
    for p in kernel.params:
        if isinstance(p, ir.Var):
            if p.name in scalars:
                out.append(scalars[p.name])
            elif p.dtype.is_float:
                out.append(0.5 + torch.rand((), generator=g).item())
            else:
                raise ProblemError(f"{kernel.name}: scalar parameter {p.name!r} ({p.dtype}) needs a value "
                                   f"(kernforge run: --arg {p.name}=VALUE)")
            continue
        shape = tuple(arith.compile_int(e)(env) for e in p.shape)
        if any(d < 0 for d in shape):
            raise ProblemError(f"{kernel.name}: parameter {p.name!r} would have negative shape {shape}")
        dt = p.dtype.torch
        if id(p) in poison:
            fill = (float("nan") if p.dtype.is_float else True if p.dtype.is_bool
                    else torch.iinfo(dt).min if torch.iinfo(dt).min < 0 else torch.iinfo(dt).max)
            out.append(torch.full(shape, fill, dtype=dt))
        elif p.dtype.is_float:
            out.append(torch.randn(shape, generator=g).to(dt))
        elif p.dtype.is_bool:
            out.append(torch.randint(0, 2, shape, generator=g).bool())
        else:
            out.append(torch.randint(0, 8, shape, generator=g).to(dt))
    return out


def compare(name: str, got, want, dtype) -> None:
    """AssertionError naming the buffer and the first differing elements unless ``got`` matches
    ``want`` (NaN where it is NaN; floats within the dtype's tolerance, the rest exactly)."""
    import torch

    got, want = got.detach().cpu(), want.detach().cpu()
    if not dtype.is_float:
        bad = (got != want).nonzero()
    else:
        rtol = _RTOL.get(dtype.name, _FP8_RTOL)
        g, w = got.double(), want.double()
        finite = torch.isfinite(w)
        scale = w[finite].abs().max().item() if finite.any() else 1.0
        close = (g - w).abs() <= rtol * (max(scale, 1e-30) + w.abs())
        same_special = (torch.isnan(g) & torch.isnan(w)) | ((g == w) & ~finite)
        bad = (~(close | same_special)).nonzero()
    if len(bad):
        where = [tuple(i) for i in bad[:3].tolist()]
        detail = ", ".join(f"{list(i)}: got {got[i].item()!r}, want {want[i].item()!r}" for i in where)
        raise AssertionError(f"{name}: {len(bad)} of {got.numel()} elements differ from the interpreter ({detail})")


def run_kernel(func, backend: str, dims: Optional[dict] = None, scalars: Optional[dict] = None,
               repeat: int = 5, seed: int = 0, arch: Optional[str] = None, progress: Progress = None,
               label: str = "", checks: Optional[bool] = None) -> RunResult:
    """Run an author's ``@T.prim_func`` on ``backend`` and check every buffer against the
    interpreter on the same inputs.  The interpreter runs first: it bounds-checks every access,
    so a kernel (or an index input) that reads out of bounds is reported at the author's line
    before a compiled backend could touch memory it does not own.  Mistakes in the kernel or
    in ``dims``/``scalars`` raise; a mismatch is a failed :class:`RunResult`."""
    say = progress or (lambda _msg: None)
    kernel_ir = func.ir
    label = label or ",".join(f"{k}={v}" for k, v in (dims or {}).items()) or "-"
    inputs = kernel_inputs(kernel_ir, dict(dims or {}), dict(scalars or {}), seed)
    clone = lambda device: [a.clone().to(device) if hasattr(a, "clone") else a for a in inputs]  # noqa: E731
    say(f"running {kernel_ir.name} on the interpreter (the oracle)")
    expected = clone("cpu")
    kernforge.compile(func, backend="interp")(*expected)
    t0 = time.perf_counter()
    say(f"building {kernel_ir.name} for {backend}")
    kernel = kernforge.compile(func, backend=backend, arch=arch, checks=checks)
    build_s = time.perf_counter() - t0
    device = backends.device(backend)
    got = clone(device)
    say(f"running {kernel_ir.name} on {backend}")
    kernel(*got)
    try:
        for p, g, w in zip(kernel_ir.params, got, expected):
            if isinstance(p, ir.Buffer):
                compare(p.name, g, w, p.dtype)
    except AssertionError as e:
        return RunResult(kernel_ir.name, backend, label, False, build_s, None, f"mismatch: {e}")
    say(f"timing {kernel_ir.name} on {backend} ({repeat} runs)")
    median = _timed(lambda: kernel(*got), repeat, device)
    return RunResult(kernel_ir.name, backend, label, True, build_s, median,
                     label=getattr(kernel.backend, "verified_label", "verified") + " against the interpreter")


def format_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = lambda r: "  ".join(str(x).ljust(w) for x, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])
