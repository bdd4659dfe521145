"""``kernforge tune``: sweep a library kernel's tuning space, or show / export / import the
tuning database.  Registered by the main CLI through :func:`register`.

    kernforge tune KERNEL --backend cpu --problem small [--shape N=64,K=128] [--space block_M=32,64]
                   [--strategy grid|random|halving] [--budget S] [--jobs N] [--force] [--json] [--png F]
    kernforge tune --show [KERNEL] [--json]
    kernforge tune --export FILE | --import FILE

Every mistake (unknown kernel, unknown tunable, empty space, a bad ``--shape``) is one line
on stderr and exit code 1.  Progress is a rich bar on stderr, only on a terminal.
"""
from __future__ import annotations

import argparse
import ast
import json
import re
import sys

_PAIR = re.compile(r",(?=\s*[A-Za-z_]\w*\s*=)")  # split k=v,k=[1,2] at commas that start a pair


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser("tune", help="sweep a kernel's @T.tunable space (verified, timed, remembered), "
                                           "or show/export/import the tuning database")
    p.add_argument("kernel", nargs="?", help="library kernel (kernforge list); with --show, a filter")
    p.add_argument("--backend", default=None, help="backend to tune on (default: the CPU default)")
    p.add_argument("--problem", default=None, help="registry problem label (default: the smallest on the "
                                                   "interpreter and emulators, demo elsewhere)")
    p.add_argument("--shape", default=None, metavar="K=V,...",
                   help="problem parameters overriding --problem's, e.g. N=64,K=128,group_rows=[64,0,32]")
    p.add_argument("--space", action="append", default=None, metavar="NAME=V1,V2",
                   help="sweep only these values of a tunable (repeatable; default: the declared space)")
    p.add_argument("--strategy", default="grid", choices=("grid", "random", "halving"),
                   help="grid: every point; random: --samples points; halving: successive halving (default grid)")
    p.add_argument("--samples", type=int, default=None, help="configurations drawn by --strategy random")
    p.add_argument("--repeats", type=int, default=10, help="timing samples per configuration (default 10)")
    p.add_argument("--settle", type=int, default=3, metavar="N",
                   help="re-time the top two with twice the samples, up to N times, while they overlap (default 3)")
    p.add_argument("--budget", type=float, default=None, metavar="S", help="stop after S seconds, best so far")
    p.add_argument("--jobs", type=int, default=1, help="build configurations in N processes first")
    p.add_argument("--seed", type=int, default=0, help="seed of the inputs and of --strategy random (default 0)")
    p.add_argument("--force", action="store_true", help="re-run a sweep already in the database")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--png", default=None, metavar="FILE", help="heatmap PNG of time against one or two "
                                                               "tunables (--axes), rejected ones marked")
    p.add_argument("--axes", default=None, metavar="X[,Y]", help="the tunables of --png (default: the first "
                                                                 "two swept with several values)")
    p.add_argument("--show", action="store_true", help="list the database (KERNEL filters)")
    p.add_argument("--export", default=None, metavar="FILE", help="write the database to FILE (JSON)")
    p.add_argument("--import", dest="import_", default=None, metavar="FILE", help="merge FILE into the database")
    p.set_defaults(func=run_tune)
    return p


def _literal(name: str, text: str, flag: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        if re.fullmatch(r"[A-Za-z_][\w.]*", text):
            return text  # a bare word: a dtype name such as float16
        from kernforge.tune import BadShapeError

        raise BadShapeError(f"bad {flag} value for {name!r}: {text!r} (expected a number, list or name)") from None


def parse_shape(text: str) -> dict:
    """``"N=64,K=128,group_rows=[5,0,7]"`` -> dict; :class:`BadShapeError` naming a bad pair."""
    from kernforge.tune import BadShapeError

    out = {}
    for item in _PAIR.split(text.strip()):
        name, eq, value = item.partition("=")
        name = name.strip()
        if not eq or not name.isidentifier() or not value.strip():
            raise BadShapeError(f"bad --shape item {item!r}: expected NAME=VALUE, e.g. --shape N=64,K=128")
        out[name] = _literal(name, value.strip(), "--shape")
    return out


def parse_space(items) -> dict:
    """``["block_M=32,64", "block_N=32"]`` -> ``{"block_M": [32, 64], "block_N": [32]}``."""
    from kernforge.tune import EmptySpaceError, TuneError

    out = {}
    for item in items:
        name, eq, values = item.partition("=")
        name = name.strip()
        if not eq or not name.isidentifier():
            raise TuneError(f"bad --space {item!r}: expected NAME=V1,V2, e.g. --space block_M=32,64")
        vals = [_literal(name, v.strip(), "--space") for v in values.split(",") if v.strip()]
        if not vals:
            raise EmptySpaceError(f"--space {name} has no values to try")
        out[name] = vals
    return out


def run_tune(args: argparse.Namespace) -> int:
    from kernforge.tune import Database, TuneError

    try:
        actions = [a for a in ("show", "export", "import_") if getattr(args, a)]
        if len(actions) > 1:
            raise TuneError("give one of --show, --export, --import")
        if args.import_:
            with Database() as db:
                n = db.import_(args.import_)
                print(f"imported {n} sweep(s) from {args.import_} into {db.path}")
            return 0
        if args.export:
            with Database() as db:
                n = db.export(args.export)
                print(f"exported {n} sweep(s) from {db.path} to {args.export}")
            return 0
        if args.show:
            return _show(args)
        if not args.kernel:
            raise TuneError("name the kernel to tune (kernforge list shows them), or give --show")
        return _sweep(args)
    except (TuneError, ValueError, OSError) as e:
        print(f"kernforge tune: {e}", file=sys.stderr)
        return 1


def _show(args) -> int:
    from kernforge.kernels.check import format_table
    from kernforge.tune import Database

    with Database() as db:
        entries = list(db.entries(args.kernel))
        path = db.path
    if args.json:
        print(json.dumps({"db": path, "sweeps": entries}, indent=1, default=str))
        return 0
    rows = [[e["kernel"], e["backend"], " ".join(f"{k}={v}" for k, v in e["bucket"].items()),
             "yes" if e["complete"] else "no", str(e["counts"]["timed"]), str(e["counts"]["rejected"]),
             " ".join(f"{k}={v}" for k, v in (e["best"] or {}).items()) or "-",
             f"{e['best_ms']:.4f}" if e["best_ms"] is not None else "-"] for e in entries]
    print(f"tuning database: {path}")
    if rows:
        print(format_table(["kernel", "backend", "shape bucket", "complete", "timed", "rejected", "best",
                            "best ms"], rows))
    else:
        print("(no sweeps)")
    return 0


def _sweep(args) -> int:
    from kernforge.kernels.check import format_table
    from kernforge.tune import tune
    from kernforge.tune.progress import SweepProgress

    problem = args.problem
    if args.shape:
        from kernforge.kernels.check import get_problem
        from kernforge.tune.sweep import resolve_spec

        spec = resolve_spec(args.kernel)
        base = dict(get_problem(spec, args.problem).params) if args.problem else {}
        problem = dict(base, **parse_shape(args.shape))
    space = parse_space(args.space) if args.space else None
    if args.png and args.axes:  # a typo in --axes should not cost a whole sweep first
        from kernforge.tune.heatmap import HeatmapError
        from kernforge.tune.sweep import resolve_spec

        declared = getattr(resolve_spec(args.kernel).factory, "space", {}) or {}
        for name in (n.strip() for n in args.axes.split(",")):
            if name not in declared:
                raise HeatmapError(f"--axes {name!r} is not a tunable of {args.kernel} ({', '.join(declared)})")
    with SweepProgress(args.kernel) as bar:
        result = tune(args.kernel, backend=args.backend, problem=problem, space=space, budget_s=args.budget,
                      strategy=args.strategy, jobs=args.jobs, force=args.force, samples=args.samples,
                      repeats=args.repeats, seed=args.seed, settle=args.settle, progress=bar)
    png_note = _png(result, args.png, args.axes) if args.png else None
    if args.json:
        out = result.to_json()
        if png_note is not None:
            out["png"] = png_note
        print(json.dumps(out, indent=1))
        return 0
    swept = [k for k, v in result.space.items() if len(v) > 1]
    rows = [[str(i + 1), " ".join(f"{k}={r.config[k]}" for k in swept) or "-", r.status,
             f"{r.median_ms:.4f}", f"{100 * (r.spread or 0):.1f}%", str(r.samples)]
            for i, r in enumerate(result.ranked)]
    rows += [["-", " ".join(f"{k}={r.config[k]}" for k in swept) or "-", "rejected: " + r.reason, "-", "-", "-"]
             for r in result.rejected]
    how = "from the database" if result.cached else f"in {result.elapsed_s:.1f} s"
    print(f"{result.kernel} on {result.backend}, {result.strategy}, {how}"
          + (f" (stopped: {result.stopped})" if result.stopped else ""))
    print(format_table(["rank", "config", "status", "median ms", "spread", "samples"], rows))
    best = result.best
    print("best: " + (" ".join(f"{k}={v}" for k, v in best.items()) if best else "none (every configuration failed)"))
    if result.stable is not None:
        rounds = f" after {result.settle_rounds} extra timing round(s)" if result.settle_rounds else ""
        print(f"ranking: stable{rounds}" if result.stable else
              f"ranking: not stable{rounds}: the top two's timings overlap (--settle N times them longer)")
    if png_note:
        print(png_note)
    return 0 if best else 1


def _png(result, path: str, axes) -> str:
    from kernforge.tune.heatmap import HeatmapError, draw

    try:
        draw(result, path, axes)
    except HeatmapError as e:
        return f"--png skipped: {e}; {path} not written"
    return f"heatmap written to {path}"
