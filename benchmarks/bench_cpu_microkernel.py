"""The CPU tile GEMM (``kf::gemm`` of kf/gemm.h) in isolation: GFLOP/s of CPU time on
tiles that stay in cache, per instruction-set path, next to the machine's FMA peak.

    python benchmarks/bench_cpu_microkernel.py [--path avx2] [--ghz 2.45]

It separates the micro-kernel from everything around it in a generated kernel (copies,
the grid, memory traffic): the fraction of peak it reaches here is the ceiling of a
whole GEMM.  The peak assumes two FMA pipes (``--ghz`` x lanes x 2 flops x 2 pipes).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import tempfile

from kernforge.backends.cpu import isa
from kernforge.backends.cpu.backend import CpuBackend

HARNESS = r"""
#define KF_ISA %(level)d
#include <kf/cpu.h>
#include <cstdio>
#include <ctime>
template <int M, int N, int K, bool TRANS_B>
void run(const char* label) {
  alignas(64) static float A[M * K], B[K * N], C[M * N];
  for (int i = 0; i < M * K; ++i) A[i] = float(i %% 7) * 0.1f;
  for (int i = 0; i < K * N; ++i) B[i] = float(i %% 5) * 0.1f;
  alignas(64) static char scratch[1 << 22];
  const long reps = 400000000L / (long(M) * N * K) + 1;
  const clock_t t0 = clock();
  for (long r = 0; r < reps; ++r) {
    if constexpr (TRANS_B) kf::gemm<float, M, N, K, K, 1, 1, K, N, 1, false>(A, B, C, scratch);
    else kf::gemm<float, M, N, K, K, 1, N, 1, N, 1, false>(A, B, C, scratch);
  }
  const double s = double(clock() - t0) / CLOCKS_PER_SEC;
  double sum = 0;  // read C, so that no store of the timed loop is dead
  for (int i = 0; i < M * N; ++i) sum += C[i];
  std::fprintf(stderr, "checksum %%g\n", sum);
  std::printf("%%s %%.1f\n", label, 2.0 * M * N * K * reps / s / 1e9);
}
int main() {
  run<64, 64, 64, false>("64x64x64 (B along N: direct)");
  run<96, 128, 256, false>("96x128x256 (direct)");
  run<8, 128, 256, false>("8x128x256 (decode rows, direct)");
  run<1, 128, 256, false>("1x128x256 (one row, direct)");
  run<64, 64, 512, true>("64x64x512 (B transposed: B packed per call)");
}
"""

LANES = {"generic": 4, "avx2": 8, "avx512": 16, "avx512bf16": 16}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--path", default=None, help=f"instruction-set path ({', '.join(isa.PATHS)}; default: the best)")
    p.add_argument("--ghz", type=float, default=None, help="core clock for the peak column (default: /proc/cpuinfo)")
    args = p.parse_args()
    path = isa.default_path(args.path)
    ghz = args.ghz or _cpuinfo_ghz()
    with tempfile.TemporaryDirectory() as d:
        src, exe = os.path.join(d, "mk.cpp"), os.path.join(d, "mk")
        with open(src, "w") as f:
            f.write(HARNESS % {"level": isa.level(path)})
        subprocess.run(["g++", "-O3", "-std=c++17", "-march=native", "-ffp-contract=off", "-I", CpuBackend.include_dir,
                        src, "-o", exe], check=True)
        out = subprocess.run([exe], capture_output=True, text=True, check=True).stdout
    peak = ghz * LANES[path] * 2 * 2 if ghz else None
    print(f"path {path}; peak {peak:.0f} GFLOP/s at {ghz:.2f} GHz" if peak else f"path {path}; clock unknown")
    print("| tile GEMM | GFLOP/s (CPU time) | of peak |")
    print("|---|---:|---:|")
    for line in out.splitlines():
        label, rate = line.rsplit(" ", 1)
        print(f"| {label} | {float(rate):.1f} | {f'{100 * float(rate) / peak:.0f}%' if peak else '-'} |")


def _cpuinfo_ghz():
    try:
        with open("/proc/cpuinfo") as f:
            mhz = next(float(line.split(":")[1]) for line in f if line.startswith("cpu MHz"))
        return mhz / 1000
    except (OSError, StopIteration, ValueError):
        return None


if __name__ == "__main__":
    main()
