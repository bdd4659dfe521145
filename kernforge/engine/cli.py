"""``kernforge engine``: the engine's AOT kernel pack from the command line.

    kernforge engine kernels --config tiny|v4-flash [--backend cpu|cuda] [--arch sm_90a] [--json]
    kernforge engine build --config tiny|v4-flash --backend cpu|cuda [--arch sm_90a|sm_100a] -o PACK/ [--jobs N]

``kernels`` lists every kernel and shape bucket the engine launches for the config, one row
each (derived from the engine's forward and the ops' own choosers, kernforge/engine/pack.py);
``build`` compiles them all in parallel into the cache directory PACK, which a deployment
puts behind its private cache: ``KERNFORGE_CACHE_DIR=~/.cache/kernforge:PACK``.
Registered by the main CLI through :func:`register`; a mistake is one line on stderr and
exit code 1, progress a rich bar on stderr, only on a terminal.
"""
from __future__ import annotations

import argparse
import json
import sys


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser("engine", help="the engine's AOT kernel pack: list or build every kernel a config needs",
                              description=__doc__)
    sub = p.add_subparsers(dest="engine_command", required=True, metavar="ENGINE_COMMAND")

    def common(s, backend_default):
        s.add_argument("--config", required=True, help="model config: tiny or v4-flash")
        s.add_argument("--backend", default=backend_default,
                       help="cpu, or cuda (compile-only: no GPU needed)" + (f" (default {backend_default})"
                                                                              if backend_default else ""))
        s.add_argument("--arch", default=None,
                       help="CUDA target: sm_80, sm_90a or sm_100a (default sm_90a; cuda only)")
        s.add_argument("--dtype", default="float32",
                       help="activation dtype of the model the engine serves: float32 or bfloat16 (default float32)")

    s = sub.add_parser("kernels", help="list every kernel and shape bucket the config's engine launches",
                       description="One row per compiled kernel: the kernel (factory), backend, its parameters "
                                   "(problem sizes and tiles) and the engine steps that launch it.")
    common(s, "cpu")
    s.add_argument("--json", action="store_true", help="print JSON instead of a table")
    s.set_defaults(func=run_kernels)

    s = sub.add_parser("build", help="compile every kernel of the config into a cache directory (a kernel pack)",
                       description="Compiles the rows of `kernforge engine kernels` in parallel into PACK; serve "
                                   "with KERNFORGE_CACHE_DIR=<private dir>:PACK (the pack is the read-only shared "
                                   "tier). An existing pack in PACK is completed, not rebuilt.")
    common(s, None)
    s.add_argument("-o", "--output", required=True, metavar="PACK", help="the pack's cache directory (created)")
    s.add_argument("--jobs", type=int, default=None, help="parallel compiles (default: the CPU count)")
    s.add_argument("--json", action="store_true", help="print the result as JSON")
    s.set_defaults(func=run_build)
    return p


def _cli_error(e: Exception) -> Exception:
    from kernforge.cli import CliError

    return CliError(str(e))


def run_kernels(args: argparse.Namespace) -> int:
    from kernforge.engine import pack

    try:
        rows = pack.list_kernels(args.config, args.backend, args.arch, args.dtype)
    except pack.PackError as e:
        raise _cli_error(e) from None
    if args.json:
        print(json.dumps([dict(spec.to_json(), steps=steps) for spec, steps in rows], indent=1))
        return 0
    from kernforge.kernels.check import format_table

    print(format_table(["kernel", "backend", "params", "steps"],
                       [[spec.kernel, spec.backend, " ".join(f"{k}={v}" for k, v in spec.params), ",".join(steps)]
                        for spec, steps in rows]))
    print(f"\n{len(rows)} kernels for {args.config} on {args.backend}"
          + (f" ({pack.check_target(args.backend, args.arch, args.dtype)})" if args.backend == "cuda" else ""))
    return 0


def run_build(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from kernforge.engine import pack

    if args.backend is None:
        raise _cli_error(pack.PackError("--backend is required: cpu or cuda"))
    console = Console(file=sys.stderr)
    bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("{task.fields[last]}"), console=console, transient=True,
                   disable=not console.is_terminal)
    task = bar.add_task(f"pack {args.config} {args.backend}", total=None, last="")

    def progress(done, total, spec):
        bar.update(task, total=total, completed=done, last=spec.kernel)

    try:
        with bar:
            result = pack.build(args.config, args.backend, args.output, args.arch, args.jobs, args.dtype, progress)
    except pack.PackError as e:
        raise _cli_error(e) from None
    if args.json:
        print(json.dumps(result.to_json()))
    else:
        print(f"{result.kernels} kernels ({result.compiles} compiled now) in {result.seconds:.1f} s, "
              f"{result.bytes / 2**20:.1f} MiB: {result.path}")
        print(f"serve with KERNFORGE_CACHE_DIR=<private cache dir>:{result.path}")
    return 0
