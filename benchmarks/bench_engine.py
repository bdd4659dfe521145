"""The engine against the torch reference at tiny(), in the same run, interleaved.

Rows: prefill (batch x prompt tokens, fresh caches) and one decode step after
a prefill of each `--context` (several may be given: `--context 256 1024 4096`; the
model's max_seq_len grows to fit), at batch 1 and 8. Each repeat runs the
reference and the engine back to back (alternating which goes first), so a
load change on the shared machine hits both; the medians and their ratio are
printed (ratio > 1: the engine is faster). Then the engine's per-step table
(calls, total ms, share) for one decode step and one prefill, from
`kernforge.engine.steps.record()` on the same clock as the rows (CPU time with `--cpu-time`).

Usage: python benchmarks/bench_engine.py [--threads 2] [--repeats 5] [--prompt 256] [--context 256 ...]
       [--batch 1 8] [--cpu-time] [--json] [--rebuild 300 1000] [--deterministic]

`--rebuild P ...` adds rows for `rebuild_cache` of a batch-1 sequence of P tokens (reference
and engine): the full rebuild (a prefill) and the tail rebuild at `exact_rebuild_tail(P)`.

`--deterministic` adds the cost of the engine's deterministic mode (`kernforge.model.deterministic()`:
batch-invariant numerics, fixed reduction orders): the engine's own prefill and decode steps
in the default mode and in deterministic mode, interleaved, as deterministic / default.

`--cpu-time` times with the process's CPU time (`time.process_time`) instead of the wall
clock: on a shared, overloaded machine the wall clock of a one-thread run mostly measures
the other jobs; CPU time measures this process's work (use it with `--threads 1`: a second
OpenMP thread's spin-wait is CPU time too).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from kernforge.engine import Engine
from kernforge.engine import steps
from kernforge.model import numerics as nx
from kernforge.model import random_model, tiny


clock = time.perf_counter  # main() switches to time.process_time for --cpu-time


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
            t0 = clock()
            fns[n]()
            samples[n].append(clock() - t0)
    return {n: statistics.median(v) for n, v in samples.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description="The kernel-built engine against the torch reference model "
                                 "(tiny config, CPU), interleaved in one process; medians and ratios.")
    ap.add_argument("--threads", type=int, default=2, help="torch and OpenMP threads (default 2)")
    ap.add_argument("--repeats", type=int, default=5, help="interleaved repeats per row (default 5)")
    ap.add_argument("--prompt", type=int, default=256, help="prefill length per sequence (default 256)")
    ap.add_argument("--context", type=int, nargs="+", default=[256],
                    help="positions at which decode steps are timed (default 256)")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8], help="batch sizes (default 1 8)")
    ap.add_argument("--cpu-time", action="store_true",
                    help="time process CPU time instead of the wall clock (for a loaded machine; use --threads 1)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    ap.add_argument("--rebuild", type=int, nargs="*", default=[],
                    help="also time rebuild_cache of batch-1 sequences of these lengths: full, and the exact tail")
    ap.add_argument("--deterministic", action="store_true",
                    help="also time the engine's deterministic mode against its default mode")
    args = ap.parse_args()
    global clock
    clock = time.process_time if args.cpu_time else time.perf_counter
    torch.set_num_threads(args.threads)
    contexts = args.context
    need = max(contexts + [args.prompt] + args.rebuild) + args.repeats + 2
    model = random_model(tiny(max_seq_len=max(1024, 1 << (need - 1).bit_length())), seed=0)
    engine = Engine(model)
    rows = []
    for batch in args.batch:
        prompt = ids_for(batch, args.prompt, seed=batch)
        t = interleaved({"reference": lambda: model(prompt, 0), "engine": lambda: engine.forward(prompt, 0)},
                        args.repeats)
        rows.append(dict(row=f"prefill {batch}x{args.prompt}", **t))
        for context in contexts:
            ctx = ids_for(batch, context + args.repeats + 2, seed=10 + batch)
            rows.append(dict(row=f"decode {batch} @ {context}", **decode_times(model, engine, ctx, context, args)))
    for length in args.rebuild:  # sliding-window recovery: replay all tokens, or only the exact tail
        ids = ids_for(1, length, seed=20)
        model(ids, 0)
        engine.forward(ids, 0)  # live sequences whose compressed entries are persisted
        tail = engine.exact_rebuild_tail(length)
        for label, t in (("full", None), (f"tail {tail}", tail)):
            rows.append(dict(row=f"rebuild {label}/{length}", **interleaved(
                {"reference": lambda t=t: model.rebuild_cache(ids, tail=t),
                 "engine": lambda t=t: engine.rebuild_cache(ids, tail=t)}, args.repeats)))
    for r in rows:
        r["speedup"] = r["reference"] / r["engine"]
    modes = deterministic_cost(engine, args) if args.deterministic else []
    profile = {}
    c0, b0 = contexts[0], max(args.batch)
    ctx = ids_for(b0, c0 + 2, 3)
    engine.forward(ctx[:, :c0], 0)
    engine.forward(ctx[:, c0:c0 + 1], c0)  # warm
    for label, fn in ((f"decode {b0}", lambda: engine.forward(ctx[:, -1:], c0 + 1)),
                      (f"prefill {b0}", lambda: engine.forward(ids_for(b0, args.prompt, 4), 0))):
        if label.startswith("prefill"):
            fn()
        with steps.record(clock) as rec:
            t0 = clock()
            fn()
            wall = clock() - t0
        profile[label] = dict(wall_s=wall, steps={k: dict(calls=v[0], ms=v[1] * 1e3) for k, v in rec.items()})
    if args.json:
        print(json.dumps(dict(threads=args.threads, clock="cpu" if args.cpu_time else "wall", rows=rows,
                              deterministic=modes, profile=profile), indent=1))
        return
    print(f"tiny(), {args.threads} threads, medians of {args.repeats} interleaved repeats"
          f"{' (process CPU time)' if args.cpu_time else ''}")
    print(f"{'row':<22}{'reference ms':>14}{'engine ms':>12}{'ref/engine':>12}")
    for r in rows:
        print(f"{r['row']:<22}{r['reference'] * 1e3:>14.1f}{r['engine'] * 1e3:>12.1f}{r['speedup']:>12.2f}")
    if modes:
        print(f"\n{'engine row':<22}{'default ms':>12}{'determ. ms':>12}{'cost':>8}")
        for r in modes:
            print(f"{r['row']:<22}{r['default'] * 1e3:>12.1f}{r['deterministic'] * 1e3:>12.1f}{r['cost']:>7.2f}x")
    for label, p in profile.items():
        total = sum(s["ms"] for s in p["steps"].values())
        print(f"\nengine steps, {label} (wall {p['wall_s'] * 1e3:.1f} ms; steps {total:.1f} ms)")
        print(f"{'step':<22}{'kind':>8}{'calls':>7}{'ms':>10}{'share':>8}")
        for name, s in sorted(p["steps"].items(), key=lambda kv: -kv[1]["ms"]):
            print(f"{name:<22}{steps.STEPS[name].kind:>8}{s['calls']:>7}{s['ms']:>10.2f}"
                  f"{s['ms'] / p['wall_s'] / 10:>7.1f}%")


def deterministic_cost(engine, args) -> list[dict]:
    """The engine's prefill, and one decode step after a prefill of the first --context, in
    the default mode and under `deterministic()`, interleaved: medians and deterministic /
    default (only the decode step itself is timed)."""
    c = args.context[0]

    def prefill(batch, prompt, det):
        with nx.deterministic(det):
            t0 = clock()
            engine.forward(prompt, 0)
            return clock() - t0

    def decode(batch, ctx, det):
        with nx.deterministic(det):
            engine.forward(ctx[:, :c], 0)
            t0 = clock()
            engine.forward(ctx[:, c:], c)
            return clock() - t0

    rows = []
    for batch in args.batch:
        for label, run, ids in ((f"prefill {batch}x{args.prompt}", prefill, ids_for(batch, args.prompt, 30 + batch)),
                                (f"decode {batch} @ {c}", decode, ids_for(batch, c + 1, 40 + batch))):
            samples = {False: [], True: []}
            for r in range(args.repeats + 1):  # repeat 0 warms both modes up
                for det in ((False, True) if r % 2 == 0 else (True, False)):
                    t = run(batch, ids, det)
                    if r:
                        samples[det].append(t)
            default, determ = statistics.median(samples[False]), statistics.median(samples[True])
            rows.append(dict(row=label, default=default, deterministic=determ, cost=determ / default))
    return rows


def decode_times(model, engine, ctx, c: int, args) -> dict[str, float]:
    """Medians of single decode steps at positions c, c+1, ...: both runners are
    prefilled once, then step i of each runs back to back (order alternating)."""
    model(ctx[:, :c], 0)
    engine.forward(ctx[:, :c], 0)
    samples = {"reference": [], "engine": []}
    runners = {"reference": model, "engine": engine.forward}
    for i in range(args.repeats + 1):
        pos = c + i
        order = ["reference", "engine"] if i % 2 == 0 else ["engine", "reference"]
        for name in order:
            t0 = clock()
            runners[name](ctx[:, pos:pos + 1], pos)
            if i:  # step 0 is the warm-up
                samples[name].append(clock() - t0)
    return {n: statistics.median(v) for n, v in samples.items()}


if __name__ == "__main__":
    main()
