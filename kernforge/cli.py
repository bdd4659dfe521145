"""The ``kernforge`` command line: list, emit, run, build and demo the kernel library.

Subsystems add their own commands through a ``register(subparsers)`` hook
(``kernforge cache`` from the runtime, ``kernforge generate`` from the model).
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time

from kernforge.kernels import registry
from kernforge.kernels.check import format_table, run_spec

from kernforge import backends

_HOOKS = ("kernforge.runtime.cli", "kernforge.model.cli")
# file extension of an emitted source, by the language its backend writes
_EXTENSION = {"ir": "ir", "c++": "cpp", "cuda": "cu", "ascend-c": "cpp"}


def _spec(name: str):
    try:
        return registry.get(name)
    except KeyError as e:
        raise SystemExit(f"kernforge: {e.args[0]}")


def _kernel_ir(spec, problem: str):
    return spec.factory(**spec.problems[problem].params).ir


def cmd_list(args) -> int:
    rows = []
    for name, spec in sorted(registry.all_specs().items()):
        tunables = getattr(spec.factory, "space", {})
        rows.append([name, spec.family, ", ".join(spec.problems), ", ".join(tunables) or "-",
                     spec.description])
    print(format_table(["kernel", "family", "problems", "tunables", "description"], rows))
    return 0


def cmd_emit(args) -> int:
    spec = _spec(args.kernel)
    kernel = _kernel_ir(spec, args.problem)
    try:
        be = backends.get(args.backend)
    except backends.BackendError as e:
        raise SystemExit(f"kernforge emit: {e}")
    src = be.source(kernel, args.arch)
    if args.output:
        os.makedirs(args.output, exist_ok=True)
        ext = _EXTENSION.get(backends.lang(args.backend), "txt")
        path = os.path.join(args.output, f"{kernel.name}.{ext}")
        with open(path, "w") as f:
            f.write(src)
        print(path)
    else:
        sys.stdout.write(src if src.endswith("\n") else src + "\n")
    return 0


def cmd_run(args) -> int:
    spec = _spec(args.kernel)
    res = run_spec(spec, args.backend, args.problem, args.repeat, args.seed, args.arch)
    print(format_table(["kernel", "backend", "problem", "result", "build s", "median ms"], [res.row()]))
    return 0 if res.verified else 1


def cmd_build(args) -> int:
    spec = _spec(args.kernel)
    backend = backends.get(args.backend)
    if not hasattr(backend, "build_report"):
        raise SystemExit(f"kernforge build: backend {args.backend!r} does not build without loading "
                         "(its kernels build on first run)")
    report = backend.build_report(_kernel_ir(spec, args.problem), args.arch)
    for k, v in report.items():
        print(f"{k:>14}: {v}")
    return 0


def cmd_demo(args) -> int:
    wanted = args.backends.split(",") if args.backends else [
        b for b in ("interp", "cpu", "cuda-emu") if b in backends.available()]
    specs = registry.all_specs()
    rows, results = [], []
    t0 = time.perf_counter()
    print(f"kernforge demo: {len(specs)} kernels x {', '.join(wanted)}  (problem '{args.problem}')")
    for name, spec in sorted(specs.items()):
        for b in wanted:
            # oracles and emulators (the interpreter, cuda-emu) are not speed paths: small sizes, one run
            slow = not backends.get(b).speed_path
            res = run_spec(spec, b, "small" if slow else args.problem, 1 if slow else args.repeat)
            results.append(res)
            rows.append(res.row())
            print("  " + "  ".join(res.row()), flush=True)
    print()
    print(format_table(["kernel", "backend", "problem", "result", "build s", "median ms"], rows))
    ok = sum(r.verified for r in results)
    print(f"\n{ok}/{len(results)} verified in {time.perf_counter() - t0:.1f} s"
          + ("  (cuda-emu: CUDA semantics verified on host emulation, not on a GPU)"
             if "cuda-emu" in wanted else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([r.__dict__ for r in results], f, indent=2)
    return 0 if ok == len(results) else 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kernforge", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("list", help="list the kernels in the library")
    s.set_defaults(func=cmd_list)

    s = sub.add_parser("emit", help="print or write a kernel's generated source")
    s.add_argument("kernel")
    s.add_argument("--backend", default="cpu", help=f"one of {', '.join(backends.names())}")
    s.add_argument("--arch", default=None, help="target arch, e.g. sm_90a (cuda)")
    s.add_argument("--problem", default="demo")
    s.add_argument("-o", "--output", default=None, help="directory to write the source into")
    s.set_defaults(func=cmd_emit)

    s = sub.add_parser("run", help="run a kernel on random inputs and check it against torch")
    s.add_argument("kernel")
    s.add_argument("--backend", default="cpu", help=f"one of {', '.join(backends.available())}")
    s.add_argument("--arch", default=None)
    s.add_argument("--problem", default="demo")
    s.add_argument("--repeat", type=int, default=5)
    s.add_argument("--seed", type=int, default=0)
    s.set_defaults(func=cmd_run)

    s = sub.add_parser("build", help="compile a kernel without loading it and report resources")
    s.add_argument("kernel")
    s.add_argument("--backend", default="cuda")
    s.add_argument("--arch", default="sm_90a")
    s.add_argument("--problem", default="demo")
    s.set_defaults(func=cmd_build)

    s = sub.add_parser("demo", help="every kernel through every available backend, verified and timed")
    s.add_argument("--backends", default=None, help="comma list (default: interp,cpu,cuda-emu)")
    s.add_argument("--problem", default="demo")
    s.add_argument("--repeat", type=int, default=5)
    s.add_argument("--json", default=None, help="also write the results as JSON here")
    s.set_defaults(func=cmd_demo)

    for mod in _HOOKS:
        importlib.import_module(mod).register(sub)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
