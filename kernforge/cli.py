"""The ``kernforge`` command line: list, emit, run, build and demo library kernels and your own.

``KERNEL`` is a library kernel's name (``kernforge list``) or ``FILE.py:NAME``, a
``@T.prim_func``, ``@T.tunable`` factory or plain factory function in your own file
(``--param K=V`` for its compile-time parameters; ``run`` also takes ``--dim M=100``
for symbolic dimensions and ``--arg NAME=V`` for scalar parameters, and checks the
result against the interpreter).

Every user error is one line on stderr and exit code 1; ``--debug`` shows the
traceback.  Progress goes to stderr, and only on a terminal.  Subsystems add their
own commands through a ``register(subparsers)`` hook (``kernforge cache`` from the
runtime, ``kernforge generate`` from the model).
"""
from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import inspect
import json
import os
import sys
import textwrap
import threading
import time
import traceback

from kernforge import backends
from kernforge.backends.base import BackendError
from kernforge.codegen.ir import KernelError
from kernforge.kernels import registry
from kernforge.kernels.check import (ProblemError, RunResult, default_problem, format_table, get_problem,
                                     problem_sizes, run_kernel, run_spec)

_HOOKS = ("kernforge.runtime.cli", "kernforge.model.cli", "kernforge.tune.cli", "kernforge.engine.cli")
# file extension of an emitted source, by the language its backend writes
_EXTENSION = {"ir": "ir", "c++": "cpp", "cuda": "cu", "ascend-c": "cpp"}
_WIDTH = 120  # `kernforge list` and the help epilogs fit this many columns


class CliError(Exception):
    """A mistake in the command line itself (a missing file, a bad ``--param``): printed as is."""


def _user_errors() -> tuple:
    """Exceptions that describe the user's input well enough to print without a type name or a
    hint to rerun with --debug (anything else is reported with its type, as a likely bug)."""
    from kernforge.jit.kernel import ArgumentError
    from kernforge.runtime.errors import RuntimeJitError

    return (CliError, ProblemError, BackendError, KernelError, ArgumentError, RuntimeJitError, OSError)


# ---------------------------------------------------------------- terminal progress


class _Status:
    """One self-refreshing status line on stderr (``building X for cuda-emu... 12 s``) while long
    work runs, so a minutes-long emulation does not look hung.  Only on a terminal: in CI logs
    and pipes it writes nothing, so their output stays exactly the results."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.enabled = _isatty(self.stream)
        self._text, self._since = "", time.monotonic()
        self._stop = threading.Event()
        self._thread = None

    def __call__(self, text: str) -> None:
        if not self.enabled:
            return
        self._text, self._since = text, time.monotonic()
        self._draw()
        if self._thread is None:
            self._thread = threading.Thread(target=self._tick, daemon=True)
            self._thread.start()

    def _draw(self) -> None:
        self.stream.write(f"\r\x1b[K{self._text}... {time.monotonic() - self._since:.0f} s")
        self.stream.flush()

    def _tick(self) -> None:
        while not self._stop.wait(1.0):
            self._draw()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self.stream.write("\r\x1b[K")
            self.stream.flush()

    def __enter__(self) -> "_Status":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


# ---------------------------------------------------------------- kernels: library or FILE.py:NAME


def _is_file_ref(ref: str) -> bool:
    return ":" in ref or ref.endswith(".py") or os.sep in ref


def _parse_pairs(pairs, flag: str, convert) -> dict:
    """``["K=V", ...]`` -> ``{K: convert(K, V)}``; a one-line CliError for a malformed pair."""
    out = {}
    for item in pairs or ():
        name, eq, value = item.partition("=")
        name = name.strip()
        if not eq or not name.isidentifier() or not value.strip():
            raise CliError(f"bad {flag} {item!r}: expected NAME=VALUE, e.g. {flag} M=128")
        if name in out:
            raise CliError(f"{flag} {name} given twice")
        out[name] = convert(name, value.strip())
    return out


def _param_value(name: str, text: str):
    """A Python literal (``128``, ``True``, ``[1, 2]``, ``'x'``), ``symbolic`` for ``T.symbolic(name)``,
    else the text itself (``dtype=bfloat16``)."""
    if text == "symbolic":
        import kernforge.dsl as T

        return T.symbolic(name)
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _dim_value(name: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise CliError(f"bad --dim {name}={text}: a size must be a non-negative integer") from None
    if value < 0:
        raise CliError(f"bad --dim {name}={text}: a size must be a non-negative integer")
    return value


def _arg_value(name: str, text: str):
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        value = None
    if not isinstance(value, (bool, int, float)):
        raise CliError(f"bad --arg {name}={text}: a scalar argument must be a number or True/False")
    return value


def _load_file(path: str):
    if not os.path.isfile(path):
        raise CliError(f"no such file: {path}")
    name = "kernforge_user_" + "".join(c if c.isalnum() else "_" for c in os.path.abspath(path))
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None:
        raise CliError(f"cannot import {path}: not a Python file")
    module = importlib.util.module_from_spec(module_spec)
    folder = os.path.dirname(os.path.abspath(path))
    sys.path.insert(0, folder)  # the file's own imports resolve as they do for `python FILE.py`
    try:
        module_spec.loader.exec_module(module)
    finally:
        sys.path.remove(folder)
    return module


def _kernels_in(module) -> list[str]:
    from kernforge.dsl.prim_func import KernelFactory, PrimFunc

    return sorted(k for k, v in vars(module).items() if isinstance(v, (PrimFunc, KernelFactory)))


def _user_kernel(ref: str, params: dict):
    """The PrimFunc that ``FILE.py:NAME`` names, specialised with ``params`` if it is a factory."""
    from kernforge.dsl.prim_func import KernelFactory, PrimFunc

    path, colon, name = ref.rpartition(":") if ":" in ref else (ref, "", "")
    module = _load_file(path)
    found = _kernels_in(module)
    if not colon:
        if len(found) != 1:
            raise CliError(f"{path} defines {len(found)} kernels ({', '.join(found) or 'none'}): "
                           f"name one, {path}:NAME")
        name = found[0]
    if not hasattr(module, name):
        raise CliError(f"{path} has no {name!r}; its kernels: {', '.join(found) or 'none'}")
    obj = getattr(module, name)
    if isinstance(obj, PrimFunc):
        if params:
            raise CliError(f"{name} is a @T.prim_func with no compile-time parameters; "
                           f"--param applies to a @T.tunable or factory function")
        return obj
    if isinstance(obj, KernelFactory):
        try:
            return obj(**params)
        except TypeError as e:
            if "missing a required argument" in str(e) or "unexpected keyword" in str(e):
                raise CliError(f"--param: {e} (its parameters: {', '.join(obj.signature.parameters)})") from None
            raise
    if inspect.isfunction(obj):
        signature = inspect.signature(obj)
        try:
            signature.bind(**params)
        except TypeError as e:
            raise CliError(f"--param: {name}: {e} (its parameters: {', '.join(signature.parameters)})") from None
        made = obj(**params)
        if not isinstance(made, PrimFunc):
            raise CliError(f"{name}(...) returned {type(made).__name__}, not a @T.prim_func")
        return made
    raise CliError(f"{name} in {path} is not a kernel ({type(obj).__name__}): expected a @T.prim_func, "
                   f"a @T.tunable factory or a function returning a @T.prim_func")


class _Choice:
    """What a command works on: a library spec at one problem, or an author's PrimFunc."""

    def __init__(self, args, backend=None):
        self.spec = self.func = None
        file_only = [f for f in ("param", "dim", "arg") if getattr(args, f, None)]
        if _is_file_ref(args.kernel):
            if args.problem is not None:
                raise CliError("--problem applies to library kernels; give a file's kernel --param values")
            self.func = _user_kernel(args.kernel, _parse_pairs(args.param, "--param", _param_value))
            self.ir = self.func.ir
            return
        if file_only:
            raise CliError(f"--{file_only[0]} applies to kernels from a file (FILE.py:NAME); "
                           f"library kernels take --problem")
        try:
            self.spec = registry.get(args.kernel)
        except KeyError as e:
            raise CliError(f"{e.args[0]} (or give FILE.py:NAME)") from None
        self.problem = args.problem or default_problem(self.spec, backend)
        get_problem(self.spec, self.problem)  # ProblemError naming the choices and their sizes

    def kernel_ir(self):
        if self.func is not None:
            return self.ir
        return self.spec.factory(**self.spec.problems[self.problem].params).ir


# ---------------------------------------------------------------- commands


def _emit(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


def _json(value) -> None:
    _emit(json.dumps(value, indent=2, default=str))


def cmd_list(args) -> int:
    specs = sorted(registry.all_specs().items())
    if args.json:
        _json([{"kernel": name, "family": spec.family, "description": spec.description,
                "tunables": {k: list(v) for k, v in getattr(spec.factory, "space", {}).items()},
                "problems": {k: p.params for k, p in spec.problems.items()}} for name, spec in specs])
        return 0
    lines = []
    for name, spec in specs:
        lines += textwrap.wrap(f"{name} ({spec.family}): {spec.description}", _WIDTH, subsequent_indent="    ")
        tunables = ", ".join(getattr(spec.factory, "space", {})) or "-"
        label_width = max(len(k) for k in spec.problems)
        for label in spec.problems:
            lines += textwrap.wrap(problem_sizes(spec, label), _WIDTH, initial_indent=f"  {label:<{label_width}}  ",
                                   subsequent_indent=" " * (label_width + 6))
        lines += textwrap.wrap(tunables, _WIDTH, initial_indent="  tunables: ", subsequent_indent=" " * 12)
    _emit("\n".join(lines))
    return 0


def cmd_emit(args) -> int:
    choice = _Choice(args)
    kernel = choice.kernel_ir()
    src = backends.get(args.backend).source(kernel, args.arch)
    if args.output:
        os.makedirs(args.output, exist_ok=True)
        ext = _EXTENSION.get(backends.lang(args.backend), "txt")
        path = os.path.join(args.output, f"{kernel.name}.{ext}")
        with open(path, "w") as f:
            f.write(src)
        print(path)
    else:
        _emit(src)
    return 0


def _repeats(args, backend: str) -> int:
    """``--repeat``, else 1 on oracles and emulators (minutes per run) and 5 on speed paths."""
    if args.repeat is not None:
        if args.repeat < 0:
            raise CliError(f"--repeat must be >= 0, got {args.repeat}")
        return args.repeat
    return 5 if backends.get(backend).speed_path else 1


def _print_results(results: list[RunResult], as_json: bool) -> None:
    if as_json:
        _json([r.to_json() for r in results])
    else:
        _emit(format_table(list(RunResult.HEADER), [r.row() for r in results]))


def cmd_run(args) -> int:
    backends.get(args.backend).target(args.arch, launch=True)  # "cannot run here" before any work
    checks = True if args.checks else None  # None: kernforge.compile's default, KERNFORGE_CHECKS
    choice = _Choice(args, args.backend)
    repeat = _repeats(args, args.backend)
    with _Status() as status:
        if choice.spec is not None:
            res = run_spec(choice.spec, args.backend, choice.problem, repeat, args.seed, args.arch, progress=status,
                           checks=checks)
        else:
            res = run_kernel(choice.func, args.backend, _parse_pairs(args.dim, "--dim", _dim_value),
                             _parse_pairs(args.arg, "--arg", _arg_value), repeat, args.seed, args.arch,
                             progress=status, checks=checks)
    if args.json:
        _json(res.to_json())
    else:
        _print_results([res], False)
    return 0 if res.verified else 1


def cmd_build(args) -> int:
    backend = backends.get(args.backend)
    if args.report and args.backend != "cuda":
        raise CliError(f"--report reads SASS: it needs --backend cuda, not {args.backend!r}")
    if not hasattr(backend, "build_report"):
        raise CliError(f"backend {args.backend!r} does not build without loading (its kernels build on first run; "
                       f"try kernforge run)")
    choice = _Choice(args)
    if choice.spec is not None and backends.lang(args.backend) == "cuda":
        problem = choice.spec.problems[choice.problem]
        arch = args.arch or backend.target().arch
        if not problem.for_cuda_arch(arch):
            raise CliError(f"--problem {choice.problem} of {choice.spec.name} is configured for "
                           f"{', '.join(problem.cuda_archs)}, not {arch} (try --problem demo)")
    kernel = choice.kernel_ir()
    extra = {}
    if args.report:
        params = choice.spec.problems[choice.problem].params if choice.spec is not None else None
        extra = {"report": True,
                 "flops": choice.spec.flops(params) if params is not None and choice.spec.flops else None,
                 "nbytes": choice.spec.bytes(params) if params is not None and choice.spec.bytes else None}
    with _Status() as status:
        status(f"compiling {kernel.name} for {args.backend} {args.arch or ''}".rstrip())
        report = backend.build_report(kernel, args.arch, **extra)
    for line in report.get("advisories", ()):
        sys.stderr.write(f"ptxas advisory: {line}\n")
    if args.json:
        _json(report)
        return 0
    sass, model = report.pop("sass", None), report.pop("model", None)
    _emit(format_table(["field", "value"], [[k, str(v)] for k, v in report.items()]))
    if sass is not None:
        _emit("\nSASS instruction counts (static)")
        _emit(format_table(["class", "count"], [[k, str(v)] for k, v in sass.items()]))
        _emit("\ncycle model (kernforge/backends/cuda/sass_report.py; no GPU, an estimate)")
        rows = [[k, str(v)] for k, v in model.items() if k not in ("assumptions", "main_loop")]
        rows += [[f"main_loop.{k}", str(v)] for k, v in (model.get("main_loop") or {}).items()]
        _emit(format_table(["field", "value"], rows))
        _emit("assumptions: " + "; ".join(model["assumptions"]))
    return 0


def _launchable(name: str) -> bool:
    """Whether backend ``name`` can run kernels on this machine (its ``target(launch=True)``)."""
    try:
        backends.get(name).target(launch=True)
    except BackendError:
        return False
    return True


def cmd_demo(args) -> int:
    wanted = args.backends.split(",") if args.backends else [b for b in backends.available() if _launchable(b)]
    for b in wanted:
        backends.get(b).target(launch=True)  # an unknown or unrunnable backend is one line, not 7 failed rows
    specs = sorted(registry.all_specs().items())
    if args.problem is not None:
        for _, spec in specs:
            get_problem(spec, args.problem)
    results, skipped = [], []
    t0 = time.perf_counter()
    total = len(specs) * len(wanted)
    with _Status() as status:
        for name, spec in specs:
            for b in wanted:
                problem = args.problem or default_problem(spec, b)
                # a backend that cannot lower a kernel says why (ascend-emu on dav-c220: no fp8 buffers)
                unsupported = getattr(backends.get(b), "unsupported", None)
                why = unsupported(spec.factory(**get_problem(spec, problem).params).ir) if unsupported else None
                if why:
                    skipped.append(f"{name} on {b}: {why}")
                    continue
                step = f"[{len(results) + 1}/{total}] "
                results.append(run_spec(spec, b, problem, _repeats(args, b),
                                        progress=lambda msg: status(step + msg)))
    ok = sum(r.verified for r in results)
    if args.json:
        _json([r.to_json() for r in results])
        return 0 if ok == len(results) else 1
    _emit(f"kernforge demo: {len(specs)} kernels x {', '.join(wanted)}\n")
    _print_results(results, False)
    notes = [f"{b}: {backends.get(b).verified_label}, not timed for speed"
             for b in wanted if not backends.get(b).speed_path and backends.get(b).verified_label != "verified"]
    notes += [f"not run: {x}" for x in skipped]
    _emit(f"\n{ok}/{len(results)} verified in {time.perf_counter() - t0:.1f} s; vs torch = torch reference time / "
          f"kernforge time on the same inputs" + "".join(f"\n({n})" for n in notes))
    return 0 if ok == len(results) else 1


# ---------------------------------------------------------------- parser


class _Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors (exit 1, like every other user error) and help
    epilogues computed only when help is asked for (they import the kernel library)."""

    epilog_fn = None

    def error(self, message):
        self.exit(1, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def format_help(self):
        if self.epilog_fn is not None:
            self.epilog = self.epilog_fn()
        return super().format_help()


class _SubParser(_Parser):
    """Every sub-command also accepts ``--debug`` after its name (``kernforge run X --debug``)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)
        self.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                          help="show the full traceback of an error")


def _problems_epilog() -> str:
    lines = ["problems (--problem) and their sizes:"]
    for name, spec in sorted(registry.all_specs().items()):
        text = f"{name}: " + "; ".join(f"{k} ({problem_sizes(spec, k)})" for k in spec.problems)
        lines += textwrap.wrap(text, _WIDTH, initial_indent="  ", subsequent_indent="      ")
    return "\n".join(lines)


def _kernel_args(s, backend_default: str, backend_help: str, problem_help: str, user_run: bool = False) -> None:
    s.add_argument("kernel", help="a library kernel (kernforge list) or FILE.py:NAME, your own @T.prim_func, "
                                  "@T.tunable factory or factory function")
    s.add_argument("--backend", default=backend_default, help=backend_help)
    s.add_argument("--problem", default=None, help=problem_help)
    s.add_argument("--param", action="append", metavar="K=V",
                   help="a compile-time parameter of FILE.py:NAME's factory (repeatable); a Python literal, "
                        "'symbolic' for T.symbolic(K), else a string such as a dtype")
    if user_run:
        s.add_argument("--dim", action="append", metavar="M=N",
                       help="the size of symbolic dimension M of FILE.py:NAME's inputs (repeatable)")
        s.add_argument("--arg", action="append", metavar="NAME=V",
                       help="the value of scalar parameter NAME of FILE.py:NAME (repeatable; float scalars "
                            "default to a random value in [0.5, 1.5))")
    s.epilog_fn = _problems_epilog


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="kernforge", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_SubParser, metavar="COMMAND")

    s = sub.add_parser("list", help="list the library's kernels, their problem sizes and tunables")
    s.add_argument("--json", action="store_true", help="print JSON instead of text")
    s.set_defaults(func=cmd_list)

    s = sub.add_parser("emit", help="print or write a kernel's generated source")
    _kernel_args(s, "cpu", f"the backend whose source to print: {', '.join(backends.names())} (default cpu)",
                 "a library kernel's problem size (default demo; sizes below)")
    s.add_argument("--arch", default=None, help="target arch, e.g. sm_90a (cuda; default: its emission default)")
    s.add_argument("-o", "--output", default=None, help="directory to write the source into (default: stdout)")
    s.set_defaults(func=cmd_emit)

    s = sub.add_parser("run", help="run a kernel on random inputs, check it (torch reference, or the interpreter "
                                   "for your own kernels) and time it")
    _kernel_args(s, "cpu", f"the backend to run on: {', '.join(backends.names())} (default cpu)",
                 "a library kernel's problem size (default: the smallest on the interpreter and emulators, "
                 "demo elsewhere; sizes below)", user_run=True)
    s.add_argument("--arch", default=None, help="target arch, e.g. sm_90a (cuda; default: the GPU's)")
    s.add_argument("--repeat", type=int, default=None,
                   help="timed runs after the checked one (default 5; 1 on the interpreter and emulators)")
    s.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    s.add_argument("--checks", action="store_true",
                   help="checked mode: bounds-check every access in the generated code (default: KERNFORGE_CHECKS)")
    s.add_argument("--json", action="store_true", help="print the result as JSON instead of a table")
    s.set_defaults(func=cmd_run)

    s = sub.add_parser("build", help="compile a kernel without loading it (no GPU needed) and report resources")
    _kernel_args(s, "cuda", "the backend to compile for (default cuda; it needs a build_report)",
                 "a library kernel's problem size (default demo; sizes below)")
    s.add_argument("--arch", default=None,
                   help="target arch (default: the backend's, sm_90a for cuda, dav-c220 for ascend)")
    s.add_argument("--report", action="store_true",
                   help="also SASS instruction counts (cuobjdump) and the cycle model's estimated fraction of peak "
                        "for the problem (cuda)")
    s.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    s.set_defaults(func=cmd_build)

    s = sub.add_parser("demo", help="every kernel through every backend that runs here, verified and timed "
                                    "against its torch reference")
    s.add_argument("--backends", default=None,
                   help="comma list (default: every backend that can run kernels on this machine)")
    s.add_argument("--problem", default=None,
                   help="one problem for every row (default: per row, the smallest on the interpreter and "
                        "emulators, demo elsewhere)")
    s.add_argument("--repeat", type=int, default=None,
                   help="timed runs per row (default 5; 1 on the interpreter and emulators)")
    s.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    s.set_defaults(func=cmd_demo)

    for mod in _HOOKS:
        importlib.import_module(mod).register(sub)
    return p


def _one_line(e: BaseException) -> str:
    text = " | ".join(line.strip() for line in str(e).splitlines() if line.strip()) or repr(e)
    return text if len(text) <= 600 else text[:600] + " ... (--debug shows all of it)"


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    prog = f"kernforge {args.command}"
    try:
        code = args.func(args)
        sys.stdout.flush()  # a closed pipe shows up here, not at interpreter exit
        return code
    except BrokenPipeError:
        # the reader went away (`kernforge list | head`): nothing more to say, and nowhere to say it
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):
            pass
        return 0
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if getattr(args, "debug", False):
            traceback.print_exc()
        elif isinstance(e, _user_errors()):
            print(f"{prog}: {_one_line(e)}", file=sys.stderr)
        else:
            print(f"{prog}: {type(e).__name__}: {_one_line(e)} (--debug for the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
