"""``kernforge cache ls|stats|verify|clear|gc``.

``kernforge/cli.py`` calls :func:`register` with its sub-parsers; this module
also runs alone: ``python -m kernforge.runtime.cli cache ls``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from . import maintenance
from .config import Config, parse_size


def register(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("cache", help="inspect and maintain the JIT cache (KERNFORGE_CACHE_DIR)")
    actions = parser.add_subparsers(dest="cache_action", required=True)
    actions.add_parser("ls", help="list committed entries of every root")
    stats = actions.add_parser("stats", help="entries, bytes and hit/miss/compile-time counters per root")
    stats.add_argument("--json", action="store_true", help="print JSON")
    actions.add_parser("verify", help="check every entry's checksums; exit 1 if any is corrupt")
    clear = actions.add_parser("clear", help="remove every entry of the first (writable) root")
    clear.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    gc = actions.add_parser("gc", help="enforce a size cap on the first root by least recent use")
    gc.add_argument("--max-size", help="cap, e.g. 5G (default KERNFORGE_JIT_CACHE_SIZE_LIMIT or 10G)")
    gc.add_argument("--tmp-age", type=float, default=86400.0,
                    help="remove other hosts' build dirs older than this many seconds (default 1 day)")
    parser.set_defaults(func=handle)
    return parser


def handle(args, out=None) -> int:
    out = out or sys.stdout
    config = Config.from_env()
    roots = config.cache_dirs
    if args.cache_action == "ls":
        for root in roots:
            for e in maintenance.entries(root):
                used = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.last_used))
                print(f"{e.tag:24s} {e.backend:6s} {e.key} {e.size:>10d} B  used {used}  {e.path}", file=out)
        return 0
    if args.cache_action == "stats":
        report = [maintenance.disk_stats(root) for root in roots]
        if args.json:
            print(json.dumps(report, indent=2), file=out)
        for r in report if not args.json else ():
            c = r["counters"]
            print(f"{r['root']}: {r['entries']} entries, {r['bytes']} B, {r['build_dirs']} build dirs; "
                  f"hits {int(c.get('memory_hits', 0))} memory + {int(c.get('disk_hits', 0))} disk, "
                  f"misses {int(c.get('misses', 0))}, compiles {int(c.get('compiles', 0))} "
                  f"({c.get('compile_time_s', 0):.2f} s)", file=out)
        return 0
    if args.cache_action == "verify":
        bad = 0
        for root in roots:
            for e in maintenance.entries(root, check=True):
                if e.problem is not None:
                    bad += 1
                    print(f"CORRUPT {e.path}: {e.problem}", file=out)
        print(f"{bad} corrupt entries" if bad else "all entries intact", file=out)
        return 1 if bad else 0
    if args.cache_action == "clear":
        if not args.yes:
            if not sys.stdin.isatty():  # a script or CI job: nobody can answer, so say how to proceed
                print(f"kernforge cache clear: not clearing {roots[0]} without confirmation; stdin is not a "
                      "terminal, pass --yes", file=sys.stderr)
                return 1
            try:
                answer = input(f"remove every entry under {roots[0]}? [y/N] ")
            except EOFError:
                answer = ""
            if answer.strip().lower() != "y":
                print("kernforge cache clear: nothing removed", file=sys.stderr)
                return 1
        print(f"removed {maintenance.clear(roots[0])} entries from {roots[0]}", file=out)
        return 0
    if args.cache_action == "gc":
        cap = config.cache_size_limit if args.max_size is None else parse_size("--max-size", args.max_size)
        result = maintenance.gc(roots[0], cap, args.tmp_age)
        print(f"{roots[0]}: evicted {result['evicted']}, removed {result['removed_corrupt']} corrupt and "
              f"{result['removed_build_dirs']} stale build dirs; {result['bytes']} B left (cap {cap})", file=out)
        return 0
    raise AssertionError(args.cache_action)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="kernforge")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
