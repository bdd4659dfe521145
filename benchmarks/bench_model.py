"""Timings of the tiny reference model, each next to its peer in the same run.

Pairs (ratio = subject / peer):
- rebuild_cache(tail=exact bound) and tail=W vs a full rebuild (same P tokens);
- deterministic (batch-invariant) forward vs the default forward;
- one decode step vs one prefill token (per-token cost);
- per-token cost at the 8 x 1024 capacity vs a 1 x 256 forward;
- one full-capacity forward (8 x 1024, fresh caches): wall time next to the
  process CPU time it used (`--capacity-only` runs just this row, e.g. to time an
  older checkout of the package, put first on PYTHONPATH, in alternation with this one).

`--hidden-size N` times tiny(hidden_size=N) instead of tiny() (e.g. 256, the
size spec §6 proposes and tiny() used before 2026-11-30 07:40 UTC).

Usage: python benchmarks/bench_model.py [--threads N] [--repeats R] [--json] [--capacity-only] [--hidden-size N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from kernforge.model import deterministic, random_model, tiny


def _time(fn, repeats: int) -> float:
    fn()  # warm-up
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def _time_wall_and_cpu(fn, repeats: int) -> tuple[float, float]:
    """Medians of wall and process CPU seconds; on a shared machine CPU time is the steadier one."""
    fn()  # warm-up
    walls, cpus = [], []
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    return statistics.median(walls), statistics.median(cpus)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--capacity-only", action="store_true")
    ap.add_argument("--hidden-size", type=int)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    model = random_model(tiny() if args.hidden_size is None else tiny(hidden_size=args.hidden_size), seed=0)
    rows = []

    cap = torch.randint(0, 512, (8, 1024), generator=g)
    with torch.inference_mode():
        wall, cpu = _time_wall_and_cpu(lambda: model(cap), args.repeats)
    rows.append(("forward 8x1024 wall (inference_mode)", wall, "same forward, process CPU time", cpu))
    if args.capacity_only:
        _report(rows, args)
        return

    ids = torch.randint(0, 512, (1, 1000), generator=g)
    length = ids.shape[1]
    exact = model.exact_rebuild_tail(length)
    model(ids)
    full = _time(lambda: model.rebuild_cache(ids), args.repeats)
    for tail in (exact, model.config.sliding_window):
        t = _time(lambda: model.rebuild_cache(ids, tail=tail), args.repeats)
        rows.append((f"rebuild_cache P={length} tail={tail}", t, "full rebuild", full))

    small = torch.randint(0, 512, (4, 64), generator=g)
    base = _time(lambda: model(small), args.repeats)
    with deterministic():
        det = _time(lambda: model(small), args.repeats)
    rows.append(("forward 4x64 deterministic", det, "forward 4x64 default", base))

    t_cap = _time(lambda: model(cap), max(1, args.repeats // 2))
    one = torch.randint(0, 512, (1, 256), generator=g)
    t_one = _time(lambda: model(one), args.repeats)
    rows.append(("forward 8x1024 per token", t_cap / cap.numel(), "forward 1x256 per token", t_one / one.numel()))

    prompt = torch.randint(0, 512, (1, 512), generator=g)

    def decode32():
        model(prompt)
        for p in range(512, 544):
            model(prompt[:, :1], p)

    t_dec = (_time(decode32, max(1, args.repeats // 2)) - _time(lambda: model(prompt), args.repeats)) / 32
    rows.append(("decode step (batch 1, pos 512)", t_dec, "prefill per token (1x512)",
                 _time(lambda: model(prompt), args.repeats) / 512))

    _report(rows, args)


def _report(rows, args) -> None:
    if args.json:
        print(json.dumps([dict(zip(("case", "seconds", "peer", "peer_seconds"), r)) for r in rows]))
        return
    print(f"threads={args.threads} repeats={args.repeats} hidden_size={args.hidden_size or tiny().hidden_size}"
          " (median seconds)")
    print(f"{'case':42s} {'s':>10s}  {'peer':30s} {'s':>10s}  ratio")
    for case, t, peer, tp in rows:
        print(f"{case:42s} {t:10.4g}  {peer:30s} {tp:10.4g}  {t / tp:6.3f}")


if __name__ == "__main__":
    main()
