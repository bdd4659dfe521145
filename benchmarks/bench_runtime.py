"""Cache-hit latency of kernforge.runtime beside TileLang (and Triton), in one run.

Measures, on an equivalent elementwise-add kernel:
  1. warm in-process hit: the second and later compile calls in one process;
  2. cold-process disk hit: a fresh Python process whose cache directory
     already holds the entry (the compile call alone, and the whole process);
  3. kernforge key computation and lookup with 128 nested project headers
     (first lookup in a process: every header hashed; later memory hits).

TileLang (target "c", its CPU path) and Triton (``triton.compile`` for an
sm_90 target; no GPU needed to compile) are measured when they import; if
not, the script says so and reports only kernforge.

Reproduce:  python benchmarks/bench_runtime.py            (about 1-2 minutes)
            python benchmarks/bench_runtime.py --quick    (fewer repeats)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

KF_SOURCE = r"""
#include <cstdint>
extern "C" int kf_add(void** args, const int64_t* dims) {
  const float* a = static_cast<const float*>(args[0]);
  const float* b = static_cast<const float*>(args[1]);
  float* c = static_cast<float*>(args[2]);
  #pragma omp parallel for
  for (int64_t i = 0; i < dims[0]; ++i) c[i] = a[i] + b[i];
  return 0;
}
"""
N = 4096


# ---------------------------------------------------------------- kernforge
def kf_compile():
    from kernforge import runtime

    return runtime.compile("bench_add", KF_SOURCE)


def kf_check(module):
    import numpy as np
    from kernforge import runtime

    fn = module.get_function("kf_add", argtypes=("ptr", "ptr"), restype="i32")
    a, b = np.random.rand(N).astype(np.float32), np.random.rand(N).astype(np.float32)
    c = np.full(N, np.nan, np.float32)
    assert fn(runtime.pack_pointers([a, b, c]), runtime.pack_dims([N])) == 0
    assert np.allclose(c, a + b), "kernforge kernel is wrong"


# ---------------------------------------------------------------- TileLang
def tl_func():
    import tilelang.language as T

    block = 128

    @T.prim_func
    def add(A: T.Tensor((N,), "float32"), B: T.Tensor((N,), "float32"), C: T.Tensor((N,), "float32")):
        with T.Kernel(T.ceildiv(N, block), threads=block) as bx:
            for i in T.Parallel(block):
                C[bx * block + i] = A[bx * block + i] + B[bx * block + i]

    return add


def tl_compile(func):
    import tilelang

    return tilelang.compile(func, target="c")


def tl_check(kernel):
    import torch

    a, b = torch.rand(N), torch.rand(N)
    c = torch.full((N,), float("nan"))
    kernel(a, b, c)
    assert torch.allclose(c, a + b), "TileLang kernel is wrong"


# ---------------------------------------------------------------- Triton
def tr_source():
    import triton
    import triton.language as tl
    from triton.compiler import ASTSource

    @triton.jit
    def add(a_ptr, b_ptr, c_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(c_ptr + offs, tl.load(a_ptr + offs, mask=mask) + tl.load(b_ptr + offs, mask=mask), mask=mask)

    return ASTSource(fn=add, signature={"a_ptr": "*fp32", "b_ptr": "*fp32", "c_ptr": "*fp32", "n": "i32"},
                     constexprs={"BLOCK": 1024})


def tr_compile(src):
    import triton
    from triton.backends.compiler import GPUTarget

    return triton.compile(src, target=GPUTarget("cuda", 90, 32))


# ---------------------------------------------------------------- timing
def per_call_us(fn, calls: int, repeats: int) -> float:
    """Median over repeats of the mean per-call time, in microseconds."""
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def child(mode: str) -> dict:
    """Runs in a fresh process: import, then one compile call that hits disk."""
    start = time.perf_counter()
    if mode == "kernforge":
        from kernforge import runtime  # noqa: F401

        imported = time.perf_counter()
        module = kf_compile()
        called = time.perf_counter()
        assert module.miss_reason is None, f"expected a disk hit: {module.miss_reason}"
    elif mode == "tilelang":
        import tilelang  # noqa: F401

        func = tl_func()
        imported = time.perf_counter()
        tl_compile(func)
        called = time.perf_counter()
    else:
        import triton  # noqa: F401

        src = tr_source()
        imported = time.perf_counter()
        tr_compile(src)
        called = time.perf_counter()
    return {"import_ms": (imported - start) * 1e3, "call_ms": (called - imported) * 1e3}


def cold(mode: str, runs: int, env: dict) -> dict:
    results, walls = [], []
    for _ in range(runs):
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, __file__, "--child", mode], capture_output=True, text=True, env=env)
        walls.append((time.perf_counter() - start) * 1e3)
        if proc.returncode != 0:
            raise RuntimeError(f"{mode} child failed:\n{proc.stderr[-2000:]}")
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return {"call_ms": statistics.median(r["call_ms"] for r in results),
            "import_ms": statistics.median(r["import_ms"] for r in results),
            "process_ms": statistics.median(walls)}


def header_tree(root: str, count: int) -> str:
    """``count`` headers; header i includes 2i+1 and 2i+2 (a binary tree)."""
    os.makedirs(os.path.join(root, "kf_bench"), exist_ok=True)
    for i in range(count):
        children = [c for c in (2 * i + 1, 2 * i + 2) if c < count]
        lines = [f"#pragma once"] + [f'#include "kf_bench/h{c:03d}.h"' for c in children]
        lines.append(f"constexpr int kf_bench_{i} = {i};")
        with open(os.path.join(root, "kf_bench", f"h{i:03d}.h"), "w") as f:
            f.write("\n".join(lines) + "\n")
    return KF_SOURCE.replace("#include <cstdint>", '#include <cstdint>\n#include "kf_bench/h000.h"')


def bench_headers(repeats: int) -> dict:
    from kernforge import runtime
    from kernforge.runtime import Runtime

    inc = tempfile.mkdtemp(prefix="kf_bench_inc_")
    source = header_tree(inc, 128)
    first = runtime.compile("bench_headers", source, include_dirs=(inc,))
    tracked = sum(1 for r in first.manifest["closure"])
    project = sum(1 for r in first.manifest["closure"] if r["anchor"] == "inc0")
    warm = per_call_us(lambda: runtime.compile("bench_headers", source, include_dirs=(inc,)), 200, repeats)
    cold_samples = []
    for _ in range(repeats * 3):
        fresh = Runtime()
        fresh.request("bench_headers", KF_SOURCE, "cpu", (), (), "")  # probe the compiler outside the timing
        start = time.perf_counter()
        hit = fresh.compile_without_load("bench_headers", source, include_dirs=(inc,))
        cold_samples.append((time.perf_counter() - start) * 1e6)
        assert hit.miss_reason is None
    return {"project_headers": project, "closure_files": tracked, "warm_us": warm,
            "first_lookup_us": statistics.median(cold_samples)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", choices=("kernforge", "tilelang", "triton"))
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, REPO)
    if args.child:
        print(json.dumps(child(args.child)))
        return

    repeats, runs = (3, 3) if args.quick else (7, 7)
    work = tempfile.mkdtemp(prefix="kf_bench_")
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               KERNFORGE_CACHE_DIR=os.path.join(work, "kf"), TILELANG_CACHE_DIR=os.path.join(work, "tl"),
               TRITON_CACHE_DIR=os.path.join(work, "tr"), TILELANG_PRINT_ON_COMPILATION="0")
    os.environ.update({k: env[k] for k in ("KERNFORGE_CACHE_DIR", "TILELANG_CACHE_DIR", "TRITON_CACHE_DIR")})
    rows = {}

    module = kf_compile()
    kf_check(module)
    rows["kernforge"] = {"warm_us": per_call_us(kf_compile, 2000, repeats), **cold("kernforge", runs, env)}

    for name, load in (("tilelang", lambda: (tl_func, tl_compile, tl_check)),
                       ("triton", lambda: (tr_source, tr_compile, None))):
        try:
            make, compile_fn, check = load()
            obj = make()
            compiled = compile_fn(obj)
            if check is not None:
                check(compiled)
        except Exception as exc:  # report and go on: the peer is optional here
            print(f"# {name}: not measured ({type(exc).__name__}: {str(exc).splitlines()[0][:160]})")
            continue
        rows[name] = {"warm_us": per_call_us(lambda: compile_fn(obj), 50, repeats), **cold(name, runs, env)}

    headers = bench_headers(repeats)
    ours = rows["kernforge"]
    print(f"\n# bench_runtime ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs)\n")
    print("| runtime | warm in-process hit (us/call) | cold-process hit: compile call (ms) "
          "| cold process: import (ms) | cold process total (ms) | warm ratio vs kernforge | cold-call ratio |")
    print("|---|---|---|---|---|---|---|")
    for name, row in rows.items():
        print(f"| {name} | {row['warm_us']:.1f} | {row['call_ms']:.2f} | {row['import_ms']:.0f} | "
              f"{row['process_ms']:.0f} | {row['warm_us'] / ours['warm_us']:.1f}x | "
              f"{row['call_ms'] / ours['call_ms']:.1f}x |")
    print(f"\nkernforge key + lookup with {headers['project_headers']} project headers "
          f"({headers['closure_files']} files in the closure incl. system headers): "
          f"first lookup in a process {headers['first_lookup_us']:.0f} us, "
          f"warm in-process hit {headers['warm_us']:.1f} us/call")


if __name__ == "__main__":
    main()
