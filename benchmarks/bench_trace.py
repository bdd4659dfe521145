"""DSL -> source time of every library kernel: trace, then render for cpu and cuda (sm_90a).

Each kernel is measured in fresh interpreters, medians printed.  The clock starts at the kernel
factory call (imports the benchmark itself needs -- the registry and the kernel's module -- are
done before).  *cold* is the first specialisation in a process: it pays for importing the
renderers and Jinja, loading the templates and rewriting the kernel function.  *warm* is another
specialisation in the same process, the cost every further configuration of a sweep pays.

The compiled templates and rewritten kernel functions are kept on disk
(:mod:`kernforge.runtime.code_cache`), so the very first process on a machine pays more than the
ones after it.  Each kernel therefore gets a private, empty ``KERNFORGE_CACHE_DIR``: its first
process (*first*, one sample) fills it, the ``--repeat`` processes after it read it (*cold*).
Issue target: DSL -> cpu <= 50 ms cold for every library kernel.

    python benchmarks/bench_trace.py [--repeat 5] [--problem demo] [--only NAME ...] [--clock cpu]
                                     [--bytecode env|on] [--markdown]

``--clock cpu`` times with the process's CPU time instead of the wall clock: on a machine shared
with other jobs (load above its core count) the wall clock mostly measures the wait for a core;
the CPU clock does not count the C++ compiler probe the CPU renderer runs once per process (it
runs in a child process).  ``--bytecode on`` gives the children kernforge's ``.pyc`` files (in a
private ``PYTHONPYCACHEPREFIX``, compiled before the table as installing the package does) where
``PYTHONDONTWRITEBYTECODE`` is set; ``env`` (default) leaves the environment as it is.  A kernel whose module, when the registry
imports it, already loads Jinja or a renderer is marked ``(preloaded: ...)``: its cold times leave
those imports out.  Cold uses ``--problem``, warm another
problem of the kernel, which may be smaller or larger.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

_CHILD = r"""
import gc, json, sys, time
clock = time.process_time if sys.argv[3] == "cpu" else time.perf_counter
from kernforge import backends
from kernforge.codegen.renderer import Target
from kernforge.kernels import registry
spec = registry.get(sys.argv[1]); params = spec.problems[sys.argv[2]].params
# what the clock must not start after: a cold time is only cold if these still load inside it
preloaded = [m for m in ("jinja2", "kernforge.backends.cpu.renderer", "kernforge.backends.cuda.renderer")
             if m in sys.modules]
def once(params):
    gc.collect()
    t0 = clock(); kernel = spec.factory(**params).ir; t1 = clock()
    backends.get("cpu").render(kernel, Target("cpu")); t2 = clock()
    backends.get("cuda").render(kernel, Target("cuda", "sm_90a")); t3 = clock()
    return {"trace": t1 - t0, "cpu": t2 - t1, "cuda": t3 - t2}
cold = once(params)
# warm: another specialisation of the same kernel in the same process (templates, imports and the
# rewritten kernel function are ready), the cost every further configuration of a sweep pays
other = next(p for label, p in ((l, q.params) for l, q in spec.problems.items()) if label != sys.argv[2])
print(json.dumps({"cold": cold, "warm": once(other), "preloaded": preloaded}))
"""

HEAD = ("kernel", "first DSL->cpu ms", "cold trace ms", "cold DSL->cpu ms", "cold cuda render ms", "warm trace ms",
        "warm DSL->cpu ms", "warm cuda render ms")


class ChildError(RuntimeError):
    pass


def measure(name: str, problem: str, clock: str, env: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, name, problem, clock], capture_output=True, text=True,
                         env=env)
    if out.returncode:
        lines = out.stderr.strip().splitlines() or [f"exit status {out.returncode}"]
        raise ChildError(lines[-1])
    return json.loads(out.stdout.strip().splitlines()[-1])


def child_env(scratch: str, pycache: str | None) -> dict:
    """The children's environment: a private code cache under ``scratch``, the user's tuning
    database (its default lives in the first cache root), and ``.pyc`` files under ``pycache``
    (None: as the environment says)."""
    from kernforge.runtime import Config

    env = dict(os.environ)
    env.setdefault("KERNFORGE_TUNE_DB", os.path.join(Config.from_env().cache_dirs[0], "tune.sqlite"))
    env["KERNFORGE_CACHE_DIR"] = os.path.join(scratch, "kf_cache")
    if pycache is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = pycache
    return env


def compile_package(pycache: str) -> None:
    """Write kernforge's ``.pyc`` files into ``pycache``, as installing the package does."""
    import kernforge

    env = dict(os.environ, PYTHONPYCACHEPREFIX=pycache)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.dirname(kernforge.__file__)], env=env,
                   check=True, capture_output=True)


def row(name: str, args, pycache: str | None) -> tuple:
    """The table row of one kernel: one process on an empty code cache, then ``args.repeat``."""
    scratch = tempfile.mkdtemp(prefix="kf_bench_trace_")
    try:
        env = child_env(scratch, pycache)
        first = measure(name, args.problem, args.clock, env)
        runs = [measure(name, args.problem, args.clock, env) for _ in range(args.repeat)]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    med = {(w, k): 1e3 * statistics.median(r[w][k] for r in runs) for w in ("cold", "warm")
           for k in ("trace", "cpu", "cuda")}
    cells = (1e3 * (first["cold"]["trace"] + first["cold"]["cpu"]), med["cold", "trace"],
             med["cold", "trace"] + med["cold", "cpu"], med["cold", "cuda"], med["warm", "trace"],
             med["warm", "trace"] + med["warm", "cpu"], med["warm", "cuda"])
    return cells, sorted(set().union(*(r["preloaded"] for r in [first] + runs)))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=5, help="processes per kernel after the first (default 5)")
    p.add_argument("--problem", default="demo", help="registry problem label (default demo)")
    p.add_argument("--only", nargs="+", metavar="NAME", help="registry kernels to measure (default: all)")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="wall clock (default) or the process's CPU time (for a loaded machine)")
    p.add_argument("--bytecode", choices=("env", "on"), default="env",
                   help="env: .pyc writing as the environment says (default); on: allowed, in a private prefix")
    p.add_argument("--markdown", action="store_true", help="print a markdown table")
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error("--repeat: must be at least 1")
    from kernforge.kernels import registry

    names = sorted(registry.all_specs())
    unknown = sorted(set(args.only or ()) - set(names))
    if unknown:
        p.error(f"--only: unknown kernels {unknown} (registry has {names})")
    if args.markdown:
        print("| " + " | ".join(HEAD) + " |\n|" + "---|" * len(HEAD), flush=True)
    else:
        print("  ".join(f"{h:>16}" for h in HEAD), flush=True)
    failed = []
    with tempfile.TemporaryDirectory(prefix="kf_bench_pyc_") as pyc_dir:
        pycache = None
        if args.bytecode == "on":
            pycache = pyc_dir
            compile_package(pycache)
        for name in args.only or names:
            label = name
            try:
                times, preloaded = row(name, args, pycache)
                cells = [f"{x:.1f}" for x in times]
                if preloaded:  # importing the kernel's module loaded them: its cold times leave them out
                    label += " (preloaded: " + ", ".join(preloaded) + ")"
            except ChildError as e:  # one kernel that does not render must not hide the others' rows
                failed.append(name)
                cells = [f"failed: {e}"] + [""] * (len(HEAD) - 2)
            if args.markdown:
                print(f"| {label} | " + " | ".join(cells) + " |", flush=True)
            else:
                print(f"{label:>16}  " + "  ".join(f"{c:>16}" for c in cells), flush=True)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
