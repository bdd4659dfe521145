"""Modelled makespan of MLA decode's balanced split-KV schedule vs the uniform split (no GPU needed).

Work is counted as FlashMLA's scheduler counts it: 64-token KV blocks per CTA plus a fixed 5
blocks per request piece (Q load, epilogue, combine).  h_q = 128 (two row blocks of 64) on a
132-SM part, one CTA per SM.  Balanced: ``kernforge.kernels.mla_decode.schedule`` with
FlashMLA's partition count; each partition's row-block CTAs run in parallel on their own SMs.
Uniform: ``config.split_count``'s power of two for every request, CTAs list-scheduled in
launch order onto the first free SM.  A model of the schedule, not a timing.

    python benchmarks/mla_schedule_balance.py
"""
import heapq
import math
import random

from kernforge.kernels.mla_decode import schedule

SMS, ROW_BLOCKS, OVERHEAD = 132, 2, schedule.OVERHEAD


def balanced(lens: list[int]) -> int:
    parts = schedule.num_sm_parts(SMS, 128)
    meta, num_splits = schedule.schedule(lens, parts)
    work = [0] * parts
    for p, _r, lo, hi, _row in schedule.pieces(meta, num_splits, lens):
        work[p] += hi - lo + OVERHEAD
    return max(work)


def uniform(lens: list[int]) -> tuple[float, int]:
    tiles = max(math.ceil(max(lens) / 32), 1)
    s = 1
    while len(lens) * ROW_BLOCKS * s < SMS and tiles >= 8 * s and s < 32:
        s *= 2
    sms = [0.0] * SMS
    for n in lens:
        t = math.ceil(n / 32)
        per = math.ceil(t / s)
        for k in range(s):
            for _ in range(ROW_BLOCKS):
                heapq.heappush(sms, heapq.heappop(sms) + max(0, min(per, t - k * per)) / 2 + OVERHEAD)
    return max(sms), s


def cases() -> dict:
    rng = random.Random(0)
    return {
        "b=128, all 4096": [4096] * 128,
        "b=8, lognormal(7.5, 1)": [int(rng.lognormvariate(7.5, 1)) for _ in range(8)],
        "b=32, one 65536 + 31 x 1024": [65536] + [1024] * 31,
        "b=64, uniform [1, 8192]": [rng.randint(1, 8192) for _ in range(64)],
        "b=4, 4096": [4096] * 4,
        "b=16, 7 x 100 + 9 x 16384": [100] * 7 + [16384] * 9,
    }


def main() -> None:
    print("| lengths | ideal | uniform split makespan | balanced makespan | uniform / balanced |")
    print("|---|---|---|---|---|")
    for name, lens in cases().items():
        ideal = sum((max(math.ceil(n / 64), 1) + OVERHEAD) * ROW_BLOCKS for n in lens) / SMS
        u, s = uniform(lens)
        b = balanced(lens)
        print(f"| {name} | {ideal:.1f} | {u:.1f} (s={s}) | {b} | {u / b:.2f}x |")


if __name__ == "__main__":
    main()
