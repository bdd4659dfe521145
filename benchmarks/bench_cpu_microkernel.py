"""The CPU tile GEMM (``kf::gemm`` of kf/gemm.h) in isolation: GFLOP/s of CPU time on
tiles that stay in cache, per instruction-set path, next to the machine's FMA peak.

    python benchmarks/bench_cpu_microkernel.py [--path avx2] [--ghz 2.45]

It separates the micro-kernel from everything around it in a generated kernel (copies,
the grid, memory traffic): the fraction of peak it reaches here is the ceiling of a
whole GEMM.  The peak assumes two FMA pipes (``--ghz`` x lanes x 2 flops x 2 pipes; twice that
for the bf16 rows, whose VDPBF16PS does two products a lane).
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
template <int M, int N, int K, bool TRANS_B, class E = float>
void run(const char* label) {
  alignas(64) static E A[M * K], B[K * N];
  alignas(64) static float C[M * N];
  for (int i = 0; i < M * K; ++i) A[i] = kf::store_as<E>(float(i %% 7) * 0.1f);
  for (int i = 0; i < K * N; ++i) B[i] = kf::store_as<E>(float(i %% 5) * 0.1f);
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
#if KF_ISA >= KF_ISA_AVX512BF16
  run<128, 128, 128, false, kf_bf16>("bf16 128x128x128 (B along N: pairs built in registers)");
  run<8, 128, 256, false, kf_bf16>("bf16 8x128x256 (decode rows)");
  run<64, 64, 512, true, kf_bf16>("bf16 64x64x512 (B transposed, MLA's Q K^T: gemm_bf16_nt)");
  run<128, 128, 256, true, kf_bf16>("bf16 128x128x256 (B transposed, the grouped GEMM's nt tile)");
#endif
}
"""

LANES = {"generic": 4, "avx2": 8, "avx512": 16, "avx512bf16": 16, "amx": 16}


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
        top = peak * (2 if label.startswith("bf16") else 1) if peak else None  # VDPBF16PS: 2 products a lane
        print(f"| {label} | {float(rate):.1f} | {f'{100 * float(rate) / top:.0f}%' if top else '-'} |")


def _cpuinfo_ghz():
    try:
        with open("/proc/cpuinfo") as f:
            mhz = next(float(line.split(":")[1]) for line in f if line.startswith("cpu MHz"))
        return mhz / 1000
    except (OSError, StopIteration, ValueError):
        return None


if __name__ == "__main__":
    main()
