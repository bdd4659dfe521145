"""`kernforge generate "prompt" --max-tokens N`: the smoke path from the command line.

It runs the kernforge engine (`kernforge.engine`) by default; `--reference`
runs the torch model and `--backend` picks the engine's kernel backend.
`--profile` then prints where the engine's time went, per step (kernel or torch
fallback), from `kernforge.engine.steps.record()`.

The main CLI calls `register(subparsers)`; the parsed namespace carries the
handler as `func`, which returns the process exit code.
"""

from __future__ import annotations

import argparse
import json


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "generate", help="run chat recipe -> prompt -> tiny random DeepSeek-V4 model (smoke test, not quality)")
    parser.add_argument("prompt", help="user message text")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens to generate (default 16)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random tiny model (default 0)")
    parser.add_argument("--json", action="store_true", help="print a JSON record instead of text")
    parser.add_argument("--reference", action="store_true",
                        help="run the torch reference model instead of the kernforge engine")
    parser.add_argument("--backend", default="cpu", choices=("cpu", "interp", "cuda-emu", "cuda"),
                        help="kernforge backend of the engine's kernels (default cpu)")
    parser.add_argument("--profile", action="store_true",
                        help="after generating, print a per-step time table of the engine (calls, total ms, "
                             "share of the step time; a step's first call includes loading or compiling its "
                             "kernels)")
    parser.set_defaults(func=run_generate)
    return parser


def run_generate(args: argparse.Namespace) -> int:
    import contextlib
    import time

    from kernforge.engine import steps
    from kernforge.engine.generate import generate

    if args.profile and args.reference:
        from kernforge.cli import CliError

        raise CliError("--profile times the engine's steps; the torch reference (--reference) has none")
    t0 = time.perf_counter()
    with steps.record() if args.profile else contextlib.nullcontext({}) as counts:
        result = generate(args.prompt, args.max_tokens, seed=args.seed, backend=args.backend,
                          reference=args.reference)
    wall = time.perf_counter() - t0
    rows = profile_rows(counts)
    if args.json:
        record = {"prompt_tokens": len(result.prompt_ids), "output_ids": result.output_ids, "text": result.text}
        if args.profile:
            record["profile"] = {"wall_ms": wall * 1e3, "steps": rows}
        print(json.dumps(record, ensure_ascii=False))
    else:
        print(f"prompt: {len(result.prompt_ids)} tokens; generated {len(result.output_ids)} tokens")
        print(result.text)
        if args.profile:
            print("\n" + format_profile(rows, wall))
    return 0


def profile_rows(counts: dict) -> list[dict]:
    """`steps.record()`'s {step: [calls, seconds]} as rows, slowest first, with each step's
    kind and share of the summed step time."""
    from kernforge.engine.steps import STEPS

    total = sum(seconds for _, seconds in counts.values()) or 1.0
    rows = [{"step": name, "kind": STEPS[name].kind, "calls": calls, "total_ms": seconds * 1e3,
             "share": seconds / total} for name, (calls, seconds) in counts.items()]
    return sorted(rows, key=lambda r: (-r["total_ms"], r["step"]))


def format_profile(rows: list[dict], wall_s: float) -> str:
    from kernforge.kernels.check import format_table

    table = format_table(["step", "kind", "calls", "total ms", "share"],
                         [[r["step"], r["kind"], str(r["calls"]), f"{r['total_ms']:.2f}", f"{100 * r['share']:.1f}%"]
                          for r in rows])
    in_steps = sum(r["total_ms"] for r in rows)
    return (f"{table}\nsteps: {in_steps:.1f} ms of {wall_s * 1e3:.1f} ms wall (the rest: model set-up, "
            f"tokenizer, cache bookkeeping and Python between steps)")
