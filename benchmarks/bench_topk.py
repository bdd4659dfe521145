"""kernforge.ops.topk against torch.topk, side by side in one run (median of N runs).

Usage::

    python benchmarks/bench_topk.py                 # the issue's shapes + a DeepSelect subset
    python benchmarks/bench_topk.py --quick         # the two target shapes only
    python benchmarks/bench_topk.py --backend cpu --repeat 9 --markdown
    python benchmarks/bench_topk.py --quick --cpu-time  # one thread each, CPU seconds

Our runs and torch's are interleaved.  Reports, per shape, both medians, the speedup (torch / ours) and our effective
bandwidth (input bytes read over the valid range + output bytes, DeepSelect's
metric) against the machine's streaming read bandwidth measured in the same run
(``torch.sum`` over a buffer far larger than the last-level cache).

``--cpu-time`` runs both sides on one thread and times CPU seconds
(``time.process_time``) instead of wall time: a noise-robust view of the work
done when other processes share the machine (it says nothing about scaling).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CLOCK = time.perf_counter

# (label, batch, vocab, k, dtype, indices dtype, sorted, return_value)
TARGETS = [
    ("sampler target", 32, 129280, 512, torch.float32, torch.int64, False, True),
    ("indexer target", 64, 65536, 2048, torch.bfloat16, torch.int64, False, True),
]
# DeepSelect's tests/test.py --perf-only shapes, the subset that fits this machine's
# memory and time (indexer: bf16, int32, unsorted, no values; sampler: fp32, int64, sorted)
DEEPSELECT = [
    ("indexer", b, n, k, torch.bfloat16, torch.int32, False, False)
    for b, n in ((6, 4096), (6, 65536), (6, 131072), (6, 1 << 20), (256, 4096), (256, 65536),
                 (256, 131072))
    for k in (512, 1024)
] + [("sampler", b, 129280, 512, torch.float32, torch.int64, True, True) for b in (6, 256)]


def median_time(fn, repeat: int) -> float:
    return median_times([fn], repeat)[0]


def median_times(fns, repeat: int) -> list[float]:
    """Median time of each of ``fns``, their runs interleaved (a b a b ...), so that
    load from other processes on the machine hits every side alike."""
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    for _ in range(repeat):
        for fn, ts in zip(fns, times):
            t = CLOCK()
            fn()
            ts.append(CLOCK() - t)
    return [statistics.median(ts) for ts in times]


def stream_read_bandwidth(repeat: int) -> float:
    """Bytes/s of ``torch.sum`` over 512 MiB: the machine's streaming read rate."""
    buf = torch.ones(128 * 1024 * 1024, dtype=torch.float32)
    return buf.numel() * 4 / median_time(lambda: buf.sum(), repeat)


def bench_shape(row, backend: str, repeat: int) -> dict:
    from kernforge.ops.topk import topk

    label, b, n, k, dtype, itype, sorted_values, rv = row
    g = torch.Generator().manual_seed(0)
    x = torch.randn((b, n), generator=g).to(dtype)
    ours, ref = median_times([lambda: topk(x, k, sorted=sorted_values, indices_type=itype, return_value=rv,
                                           backend=backend),
                              lambda: torch.topk(x, k, dim=1, sorted=sorted_values)], repeat)
    moved = x.numel() * x.element_size() + b * k * (torch.empty((), dtype=itype).element_size()
                                                     + (x.element_size() if rv else 0))
    return dict(label=label, shape=f"{dtype_name(dtype)} [{b}, {n}] k={k}",
                flags=f"{'sorted' if sorted_values else 'unsorted'}, {dtype_name(itype)}"
                      f"{'' if rv else ', no values'}",
                ours_ms=ours * 1e3, torch_ms=ref * 1e3, speedup=ref / ours, gbps=moved / ours / 1e9,
                bytes=moved)


def dtype_name(dt) -> str:
    return str(dt).removeprefix("torch.")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="only the two target shapes")
    ap.add_argument("--markdown", action="store_true", help="print a markdown table")
    ap.add_argument("--cpu-time", action="store_true", help="one thread, CPU seconds (see above)")
    args = ap.parse_args(argv)
    if args.cpu_time:
        global CLOCK
        os.environ["OMP_NUM_THREADS"] = "1"  # read when the kernel's OpenMP runtime starts
        torch.set_num_threads(1)
        CLOCK = time.process_time

    stream = stream_read_bandwidth(args.repeat)
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, {'CPU' if args.cpu_time else 'wall'} time, "
          f"backend {args.backend}, median of {args.repeat}; "
          f"streaming read bandwidth {stream / 1e9:.1f} GB/s; load average {os.getloadavg()[0]:.1f}")
    rows = TARGETS + ([] if args.quick else DEEPSELECT)
    results = [bench_shape(r, args.backend, args.repeat) for r in rows]
    largest = max(results, key=lambda r: r["bytes"])
    if args.markdown:
        print("| case | shape | flags | kernforge ms | torch.topk ms | speedup | GB/s |")
        print("|---|---|---|---:|---:|---:|---:|")
    for r in results:
        if args.markdown:
            print(f"| {r['label']} | {r['shape']} | {r['flags']} | {r['ours_ms']:.3f} | {r['torch_ms']:.3f} "
                  f"| {r['speedup']:.2f}x | {r['gbps']:.1f} |")
        else:
            print(f"{r['label']:15s} {r['shape']:32s} {r['flags']:28s} ours {r['ours_ms']:9.3f} ms  "
                  f"torch {r['torch_ms']:9.3f} ms  x{r['speedup']:5.2f}  {r['gbps']:6.1f} GB/s")
    print(f"largest shape ({largest['shape']}): {largest['gbps']:.1f} GB/s = "
          f"{100 * largest['gbps'] * 1e9 / stream:.0f}% of the streaming read bandwidth")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
