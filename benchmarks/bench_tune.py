"""Auto-tuner benchmarks: time to the best configuration, build throughput, and TileLang.

Three measurements, each child process with an empty JIT cache (a temporary
``KERNFORGE_CACHE_DIR``) and an empty tuning database, so each pays for its own compiles as a
first sweep on a new machine does:

* ``strategies``: per kernel (grouped GEMM and MLA decode, on the CPU) and per strategy
  (grid / random / halving): configurations timed / pruned / rejected, the sweep's wall
  time, the time at which its final best was first timed, and the best's median against
  the heuristic configuration's (the family's ``config`` chooser), timed back to back.
* ``jobs``: configurations compiled per minute on the CPU backend with ``jobs=1`` (one
  process, one build after another) and ``jobs=2`` (:func:`kernforge.tune.pool.prebuild`,
  spawned workers included), interleaved, medians of the repeats.
* ``tilelang``: configurations compiled per minute for sm_90a on one bf16 GEMM space, the
  same ``T.*`` program text compiled by kernforge (nvcc, no load: no GPU needed) and by
  TileLang's autotuner (its compile phase: the autotuner's own compile calls, stamped as
  they finish; its benchmark phase needs a GPU, and the exact error it gets is printed),
  each with 1 and 2 workers, interleaved.  TileLang runs under ``--tilelang-python``
  (default: this interpreter); when it does not import there, the reason is printed.

    python benchmarks/bench_tune.py [--sections strategies,jobs,tilelang] [--repeats 2]
        [--tilelang-python PATH] [--markdown]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
GG, MLA = "m_grouped_gemm_nt_contiguous", "mla_decode"
# every space includes the heuristic's configuration for its problem on the CPU
SPACES = {GG: dict(block_M=[64, 128], block_N=[64, 128], block_K=[128, 256], num_stages=[1]),
          MLA: dict(block_N=[16, 32, 64], block_H=[16, 32, 64], num_stages=[1])}
GEMM_SHAPE = dict(M=640, N=256, K=512)
GEMM_SPACE = [dict(block_M=m, block_N=n, block_K=k, num_stages=2) for m in (64, 128) for n in (64, 128)
              for k in (64, 128)]


def gemm(T, M, N, K, block_M, block_N, block_K, num_stages, dtype="bfloat16"):
    """C = A @ B^T in TileLang's language; ``T`` is ``kernforge.dsl`` or ``tilelang.language``,
    so both compilers see one program text."""

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((N, K), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
            A_s = T.alloc_shared((block_M, block_K), dtype)
            B_s = T.alloc_shared((block_N, block_K), dtype)
            C_f = T.alloc_fragment((block_M, block_N), "float")
            T.clear(C_f)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                T.copy(A[by * block_M, k * block_K], A_s)
                T.copy(B[bx * block_N, k * block_K], B_s)
                T.gemm(A_s, B_s, C_f, transpose_B=True)
            T.copy(C_f, C[by * block_M, bx * block_N])

    return main


def kf_build(cfg: dict) -> int:
    """Compile one GEMM configuration for sm_90a as ``kernforge build`` does (a worker's unit)."""
    import kernforge.dsl as T
    from kernforge.backends.cuda.backend import build_report

    return build_report(gemm(T, **GEMM_SHAPE, **cfg).ir, "sm_90a")["registers"]



def tl_gemm(block_M, block_N, block_K, num_stages):
    """The GEMM in TileLang's own language, with the tunables as named parameters (its
    autotuner matches configurations to the signature, and needs a function with source)."""
    import tilelang.language as T

    return gemm(T, **GEMM_SHAPE, block_M=block_M, block_N=block_N, block_K=block_K, num_stages=num_stages)


_STRATEGY_CHILD = r"""
import json, sys
import kernforge
import kernforge.tune as kt
from kernforge import backends
from kernforge.kernels import registry
from kernforge.tune import sweep
kernel, backend, problem, strategy, space, heuristic = (sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4],
    json.loads(sys.argv[5]), json.loads(sys.argv[6]))
res = kt.tune(kernel, backend=backend, problem=problem, space=space, strategy=strategy,
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

_JOBS_CHILD = r"""
import json, sys, time
kernel, backend, problem, space, jobs = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4]), int(sys.argv[5])
import kernforge
from kernforge.kernels import registry
from kernforge.tune import pool, sweep
spec = registry.get(kernel)
params = sweep.bind_params(sweep._factory(spec), dict(spec.problems[problem].params), spec)
configs = [dict(params, **c) for c in sweep._plan(space, "grid", None, 0)]
t = time.perf_counter()
if jobs == 1:
    for c in configs:
        kernforge.compile(spec.factory, backend=backend, **c)
else:
    pool.prebuild(kernel, backend, configs, jobs)
print(json.dumps(dict(configs=len(configs), seconds=time.perf_counter() - t)))
"""

# kernforge for sm_90a: the same compile ``kernforge build`` runs (nvcc, cubin, no load)
_KF_GEMM_CHILD = r"""
import json, sys, time
from concurrent.futures import ProcessPoolExecutor
import multiprocessing
sys.path.insert(0, sys.argv[3])
from bench_tune import kf_build
space, jobs = json.loads(sys.argv[1]), int(sys.argv[2])
t = time.perf_counter()
if jobs == 1:
    done = [kf_build(c) for c in space]
else:
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as ex:
        done = list(ex.map(kf_build, space))
print(json.dumps(dict(configs=len(done), seconds=time.perf_counter() - t)))
"""

_TL_GEMM_CHILD = r"""
import json, re, sys, time, traceback
space = json.loads(sys.argv[1])
sys.path.insert(0, sys.argv[3])
try:
    import tilelang
    from tilelang.autotuner import AutoTuner
except Exception as e:
    print(json.dumps(dict(error=f"import tilelang: {type(e).__name__}: {e}")))
    sys.exit(0)
from bench_tune import tl_gemm

tuner = AutoTuner.from_kernel(kernel=tl_gemm, configs=space).set_compile_args(
    out_idx=[-1], target={"kind": "cuda", "arch": "sm_90a"})
stamps, compile_impl = [], tuner._default_compile
def stamped(**cfg):  # the autotuner's own compile call, stamped as it returns
    k = compile_impl(**cfg)
    stamps.append(time.perf_counter())
    return k
tuner._default_compile = stamped
t = time.perf_counter()
bench_error = ""
try:
    tuner.run(warmup=1, rep=1)
except Exception as e:
    bench_error = f"{type(e).__name__}: {e}"
try:  # the per-configuration reason the autotuner logged for its benchmark phase
    log = open("autotuner.log").read()
    last = [l for l in log.splitlines() if re.match(r"\w+(Error|Exception): ", l)]
    bench_error += (" (per configuration: " + last[-1] + ")") if last else ""
except OSError:
    pass
out = dict(version=tilelang.__version__, configs=len(stamps), bench_error=bench_error)
if stamps:
    out["seconds"] = stamps[-1] - t
else:
    out["error"] = "no configuration compiled: " + bench_error
print(json.dumps(out))
"""


def _heuristic(kernel: str, backend: str, params: dict, space: dict) -> dict:
    """The tunables the family's chooser picks for this problem (what the ops run untuned)."""
    if kernel == MLA:
        from kernforge.kernels.mla_decode import config

        chosen = config.choose.heuristic(backend, params["heads"], params.get("heads_kv", 1), params.get("seq_q", 1),
                                         params.get("dim", 576), params.get("dim_v", 512), params.get("page_size", 64),
                                         params.get("causal", False))
    else:
        from kernforge.kernels.grouped_gemm import config

        chosen = config._heuristic(backend, params["num_groups"], params["N"], params["K"],
                                   params.get("alignment", 128))
    return {k: v for k, v in chosen.items() if k in space}


def _child(code: str, argv: list, python: str = sys.executable, env_extra: dict = None) -> dict:
    """Run ``code`` in a fresh process with an empty JIT cache, database and TileLang cache."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, KERNFORGE_CACHE_DIR=os.path.join(tmp, "cache"),
                   KERNFORGE_TUNE_DB=os.path.join(tmp, "tune.sqlite"),
                   TILELANG_CACHE_DIR=os.path.join(tmp, "tilelang"), **(env_extra or {}))
        out = subprocess.run([python, "-c", code, *argv], env=env, cwd=tmp, capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"child failed ({out.returncode}): {out.stderr[-2000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])


def strategies(kernels, backend: str, problem: str, names) -> list[dict]:
    from kernforge.kernels import registry

    rows = []
    for kernel in kernels:
        space = SPACES[kernel]
        heuristic = _heuristic(kernel, backend, registry.get(kernel).problems[problem].params, space)
        for strategy in names:
            r = _child(_STRATEGY_CHILD, [kernel, backend, problem, strategy, json.dumps(space), json.dumps(heuristic)])
            rows.append(dict(r, kernel=kernel, heuristic=heuristic, space=space))
    return rows


def jobs(backend: str, problem: str, repeats: int) -> dict:
    runs = {1: [], 2: []}
    for _ in range(repeats):
        for j in (1, 2):
            runs[j].append(_child(_JOBS_CHILD, [GG, backend, problem, json.dumps(SPACES[GG]), str(j)]))
    return {j: dict(configs=r[0]["configs"], per_min=statistics.median(60 * x["configs"] / x["seconds"] for x in r))
            for j, r in runs.items()}


def tilelang(python: str, repeats: int) -> dict:
    """Configurations per minute, per (compiler, workers); TileLang's error if it cannot run."""
    runs: dict = {}
    space = json.dumps(GEMM_SPACE)
    for _ in range(repeats):
        for workers in (1, 2):
            runs.setdefault(("kernforge", workers), []).append(_child(_KF_GEMM_CHILD, [space, str(workers), HERE]))
            tl = _child(_TL_GEMM_CHILD, [space, str(workers), HERE], python=python,
                        env_extra=dict(TILELANG_AUTO_TUNING_CPU_COUNTS=str(workers)))
            if "error" in tl:
                return dict(error=tl["error"])
            runs.setdefault(("tilelang", workers), []).append(tl)
    out = {k: dict(configs=v[0]["configs"], per_min=statistics.median(60 * x["configs"] / x["seconds"] for x in v))
           for k, v in runs.items()}
    tl = runs[("tilelang", 1)][0]
    return dict(rates=out, version=tl["version"], bench_error=tl["bench_error"])


def _cfg(cfg: dict, space: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in cfg.items() if len(space.get(k, ())) > 1)


def markdown(strat, jobs_res, tl) -> None:
    if strat:
        print("| kernel | strategy | timed / pruned / rejected | sweep s | time to best s | best | best ms | "
              "heuristic | heuristic ms | speed-up | ranking stable |\n|---|---|---|---|---|---|---|---|---|---|---|")
        for r in strat:
            print(f"| {r['kernel']} | {r['strategy']} | {r['timed']} / {r['pruned']} / {r['rejected']} | "
                  f"{r['elapsed_s']:.1f} | {r['time_to_best_s']:.1f} | {_cfg(r['best'], r['space'])} | "
                  f"{r['best_ms']:.3f} | {_cfg(r['heuristic'], r['space'])} | {r['heuristic_ms']:.3f} | "
                  f"{r['heuristic_ms'] / r['best_ms']:.2f}× | {r['stable']} |")
    if jobs_res:
        one, two = jobs_res[1], jobs_res[2]
        print(f"\n| {GG} builds (cpu, {one['configs']} configs) | configs / min | vs jobs=1 |\n|---|---|---|")
        print(f"| jobs=1 | {one['per_min']:.1f} | 1.00× |\n| jobs=2 | {two['per_min']:.1f} | "
              f"{two['per_min'] / one['per_min']:.2f}× |")
    if tl is not None:
        if "error" in tl:
            print(f"\nTileLang: not measured: {tl['error']}")
            return
        rates = tl["rates"]
        base = rates[("kernforge", 1)]["per_min"]
        print(f"\n| bf16 GEMM {GEMM_SHAPE['M']}x{GEMM_SHAPE['N']}x{GEMM_SHAPE['K']}, sm_90a, {len(GEMM_SPACE)} configs "
              f"| workers | compiled | configs / min | vs kernforge, 1 worker |\n|---|---|---|---|---|")
        for (who, w), r in sorted(rates.items()):
            name = ("kernforge (nvcc, no load)" if who == "kernforge"
                    else f"TileLang {tl['version']} autotuner compile phase")
            print(f"| {name} | {w} | {r['configs']} | {r['per_min']:.1f} | {r['per_min'] / base:.2f}× |")
        print(f"\nTileLang's benchmark phase without a GPU: {tl['bench_error']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", default=f"{GG},{MLA}")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--problem", default="demo")
    ap.add_argument("--strategies", default="grid,random,halving")
    ap.add_argument("--sections", default="strategies,jobs,tilelang")
    ap.add_argument("--repeats", type=int, default=2, help="interleaved repeats of the jobs and TileLang runs")
    ap.add_argument("--tilelang-python", default=sys.executable)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    sections = set(args.sections.split(","))
    unknown = [k for k in args.kernels.split(",") if k not in SPACES]
    if unknown:
        ap.error(f"--kernels: no benchmark space for {', '.join(unknown)} (known: {', '.join(SPACES)})")
    if args.repeats < 1:
        ap.error(f"--repeats must be at least 1, got {args.repeats}")
    strat = (strategies(args.kernels.split(","), args.backend, args.problem, args.strategies.split(","))
             if "strategies" in sections else None)
    jobs_res = jobs(args.backend, args.problem, args.repeats) if "jobs" in sections else None
    tl = tilelang(args.tilelang_python, args.repeats) if "tilelang" in sections else None
    if args.markdown:
        markdown(strat, jobs_res, tl)
    else:
        print(json.dumps(dict(strategies=strat, jobs=jobs_res,
                              tilelang=tl and {**tl, "rates": {f"{k[0]}/{k[1]}": v for k, v in
                                                                tl.get("rates", {}).items()}}), indent=1))


if __name__ == "__main__":
    main()
