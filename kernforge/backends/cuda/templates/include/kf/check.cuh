// Checked mode (kernforge.compile(..., checks=True)): the first out-of-bounds access of a
// launch, recorded in a small global buffer the launcher zeroes before the launch and
// reads back after it (layout: kernforge/codegen/passes/checks.py, as kf/check.h on the
// CPU: [0] state, [1] check site, [2] rank, then the index and the buffer's shape).
//
// The generated code skips the violating access itself, so the kernel runs to its end
// without touching memory out of bounds (no __trap: a trap would poison the context for
// every later launch in the process); threads that fail after the first one return at
// the compare-and-swap.
#pragma once

#define KF_CHECK_MAX_DIMS 8

static __device__ __noinline__ void kf_check_fail(int64_t* rec, int site, int rank, const int64_t* index,
                                                  const int64_t* shape) {
  if (atomicCAS(reinterpret_cast<unsigned long long*>(rec), 0ull, 1ull) != 0ull) return;
  rec[1] = site;
  rec[2] = rank;
  for (int d = 0; d < rank && d < KF_CHECK_MAX_DIMS; ++d) {
    rec[3 + d] = index[d];
    rec[3 + KF_CHECK_MAX_DIMS + d] = shape[d];
  }
  __threadfence();
}
