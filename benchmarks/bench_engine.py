"""The engine against the torch reference at tiny(), in the same run, interleaved.

Rows: prefill (batch x prompt tokens, fresh caches) and one decode step after
a prefill of `--context` tokens, at batch 1 and 8. Each repeat runs the
reference and the engine back to back (alternating which goes first), so a
load change on the shared machine hits both; the medians and their ratio are
printed (ratio > 1: the engine is faster). Then the engine's per-step table
(calls, total ms, share) for one decode step and one prefill, from
`kernforge.engine.steps.record()`.

Usage: python benchmarks/bench_engine.py [--threads 2] [--repeats 5] [--prompt 256] [--context 256] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from kernforge.engine import Engine
from kernforge.engine import steps
from kernforge.model import random_model, tiny


def ids_for(batch: int, length: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 512, (batch, length), generator=torch.Generator().manual_seed(seed))


def interleaved(fns: dict, repeats: int) -> dict[str, float]:
    """Median seconds of each callable, run in alternating order per repeat (after a warm-up)."""
    names = list(fns)
    for f in fns.values():
        f()
    samples = {n: [] for n in names}
    for r in range(repeats):
        for n in (names if r % 2 == 0 else names[::-1]):
            t0 = time.perf_counter()
            fns[n]()
            samples[n].append(time.perf_counter() - t0)
    return {n: statistics.median(v) for n, v in samples.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = random_model(tiny(), seed=0)
    engine = Engine(model)
    rows = []
    for batch in (1, 8):
        prompt = ids_for(batch, args.prompt, seed=batch)
        t = interleaved({"reference": lambda: model(prompt, 0), "engine": lambda: engine.forward(prompt, 0)},
                        args.repeats)
        rows.append(dict(row=f"prefill {batch}x{args.prompt}", **t))
        ctx = ids_for(batch, args.context + args.repeats + 2, seed=10 + batch)
        rows.append(dict(row=f"decode {batch} @ {args.context}", **decode_times(model, engine, ctx, args)))
    for r in rows:
        r["speedup"] = r["reference"] / r["engine"]
    profile = {}
    ctx = ids_for(8, args.context + 2, 3)
    engine.forward(ctx[:, :args.context], 0)
    engine.forward(ctx[:, args.context:args.context + 1], args.context)  # warm
    for label, fn in (("decode 8", lambda: engine.forward(ctx[:, -1:], args.context + 1)),
                      ("prefill 8", lambda: engine.forward(ids_for(8, args.prompt, 4), 0))):
        if label == "prefill 8":
            fn()
        with steps.record() as rec:
            t0 = time.perf_counter()
            fn()
            wall = time.perf_counter() - t0
        profile[label] = dict(wall_s=wall, steps={k: dict(calls=v[0], ms=v[1] * 1e3) for k, v in rec.items()})
    if args.json:
        print(json.dumps(dict(threads=args.threads, rows=rows, profile=profile), indent=1))
        return
    print(f"tiny(), {args.threads} threads, medians of {args.repeats} interleaved repeats")
    print(f"{'row':<22}{'reference ms':>14}{'engine ms':>12}{'ref/engine':>12}")
    for r in rows:
        print(f"{r['row']:<22}{r['reference'] * 1e3:>14.1f}{r['engine'] * 1e3:>12.1f}{r['speedup']:>12.2f}")
    for label, p in profile.items():
        total = sum(s["ms"] for s in p["steps"].values())
        print(f"\nengine steps, {label} (wall {p['wall_s'] * 1e3:.1f} ms; steps {total:.1f} ms)")
        print(f"{'step':<22}{'kind':>8}{'calls':>7}{'ms':>10}{'share':>8}")
        for name, s in sorted(p["steps"].items(), key=lambda kv: -kv[1]["ms"]):
            print(f"{name:<22}{steps.STEPS[name].kind:>8}{s['calls']:>7}{s['ms']:>10.2f}"
                  f"{s['ms'] / p['wall_s'] / 10:>7.1f}%")


def decode_times(model, engine, ctx, args) -> dict[str, float]:
    """Medians of single decode steps at positions context, context+1, ...: both runners are
    prefilled once, then step i of each runs back to back (order alternating)."""
    c = args.context
    model(ctx[:, :c], 0)
    engine.forward(ctx[:, :c], 0)
    samples = {"reference": [], "engine": []}
    runners = {"reference": model, "engine": engine.forward}
    for i in range(args.repeats + 1):
        pos = c + i
        order = ["reference", "engine"] if i % 2 == 0 else ["engine", "reference"]
        for name in order:
            t0 = time.perf_counter()
            runners[name](ctx[:, pos:pos + 1], pos)
            if i:  # step 0 is the warm-up
                samples[name].append(time.perf_counter() - t0)
    return {n: statistics.median(v) for n, v in samples.items()}


if __name__ == "__main__":
    main()
