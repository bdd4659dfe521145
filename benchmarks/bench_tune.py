"""Time to the best configuration, per strategy, and its speed-up over the heuristic's.

Each strategy runs in a fresh process with an empty JIT cache and an empty tuning
database, so each pays for its own compiles (as a first sweep on a new machine does).
Reported per strategy: configurations built / timed / rejected, wall time of the sweep,
the time at which the final best was first timed, the best median, and the heuristic
configuration's median (``config.choose``, timed the same way on the same inputs).

    python benchmarks/bench_tune.py [--kernel m_grouped_gemm_nt_contiguous] [--problem demo]
        [--space block_M=64,128 --space block_N=64,128 --space block_K=128,256] [--jobs 1] [--markdown]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

_CHILD = r"""
import json, sys
import kernforge
import kernforge.tune as kt
from kernforge import backends
from kernforge.kernels import registry
from kernforge.tune import sweep
kernel, backend, problem, strategy, space, jobs, heuristic = (sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4],
    json.loads(sys.argv[5]), int(sys.argv[6]), json.loads(sys.argv[7]))
res = kt.tune(kernel, backend=backend, problem=problem, space=space, strategy=strategy, jobs=jobs,
              samples=max(2, len(list(sweep._plan(space, "grid", None, 0))) // 2))
spec = registry.get(kernel)
params = sweep.bind_params(sweep._factory(spec), dict(spec.problems[problem].params), spec)
inputs = spec.make_inputs(params, 0, backends.device(backend))
def median(cfg):
    k = kernforge.compile(spec.factory, backend=backend, **dict(params, **cfg))
    return sweep._time(k, sweep._clone(inputs), 10, backends.device(backend))[0]
# the best and the heuristic timed back to back, here, so load drifts hit both alike
best_ms, heur_ms = median(res.best), median(dict(res.best, **heuristic))
print(json.dumps(dict(strategy=strategy, elapsed_s=res.elapsed_s, time_to_best_s=res.time_to_best_s,
    timed=sum(r.status == "timed" for r in res.ranked), pruned=sum(r.status == "pruned" for r in res.ranked),
    rejected=len(res.rejected), best=res.best, best_ms=best_ms, heuristic_ms=heur_ms, stable=res.stable)))
"""


def _space(items) -> dict:
    out = {}
    for item in items:
        name, _, values = item.partition("=")
        out[name] = [int(v) for v in values.split(",")]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernel", default="m_grouped_gemm_nt_contiguous")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--problem", default="demo")
    ap.add_argument("--space", action="append", default=None)
    ap.add_argument("--strategies", default="grid,random,halving")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    space = _space(args.space or ["block_M=64,128", "block_N=64,128", "block_K=128,256", "num_stages=1"])
    # the heuristic's tunables for this problem (grouped GEMM: config.choose on the problem's sizes)
    from kernforge.kernels import registry
    from kernforge.kernels.grouped_gemm import config

    p = registry.get(args.kernel).problems[args.problem].params
    heuristic = {k: v for k, v in config._heuristic(args.backend, p["num_groups"], p["N"], p["K"],
                                                    p.get("alignment", 128)).items() if k in space}
    rows = []
    for strategy in args.strategies.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            env = dict(os.environ, KERNFORGE_CACHE_DIR=os.path.join(tmp, "cache"),
                       KERNFORGE_TUNE_DB=os.path.join(tmp, "tune.sqlite"))
            out = subprocess.run([sys.executable, "-c", _CHILD, args.kernel, args.backend, args.problem, strategy,
                                  json.dumps(space), str(args.jobs), json.dumps(heuristic)],
                                 env=env, check=True, capture_output=True, text=True)
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    if not args.markdown:
        for r in rows:
            print(json.dumps(r))
        return
    print(f"| strategy | timed / pruned / rejected | sweep s | time to best s | best | best ms | "
          f"heuristic ms | speed-up | ranking stable |\n|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        best = " ".join(f"{k}={v}" for k, v in r["best"].items() if len(space.get(k, ())) > 1)
        print(f"| {r['strategy']} | {r['timed']} / {r['pruned']} / {r['rejected']} | {r['elapsed_s']:.1f} | "
              f"{r['time_to_best_s']:.1f} | {best} | {r['best_ms']:.3f} | {r['heuristic_ms']:.3f} | "
              f"{r['heuristic_ms'] / r['best_ms']:.2f}× | {r['stable']} |")


if __name__ == "__main__":
    main()
