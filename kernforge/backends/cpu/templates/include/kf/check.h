// Checked mode (kernforge.compile(..., checks=True)): the first out-of-bounds access of a
// launch, recorded for the launcher, which raises kernforge.CheckError from it.
//
// The record is RECORD_LEN int64 values the launcher zeroes before each launch
// (kernforge/codegen/passes/checks.py): [0] state, [1] check site, [2] rank,
// [3, 3 + KF_CHECK_MAX_DIMS) the index, then the buffer's shape.  Blocks run on
// several threads, so the first failing check claims the record with a
// compare-and-swap and the others return; the generated code skips the access
// itself, and blocks not yet started once a violation is recorded.
#pragma once

#include <cstdint>

#define KF_CHECK_MAX_DIMS 8

__attribute__((noinline, cold)) inline void kf_check_fail(int64_t* rec, int site, int rank, const int64_t* index,
                                                          const int64_t* shape) {
  int64_t clear = 0;
  if (!__atomic_compare_exchange_n(&rec[0], &clear, 1, false, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) return;
  rec[1] = site;
  rec[2] = rank;
  for (int d = 0; d < rank && d < KF_CHECK_MAX_DIMS; ++d) {
    rec[3 + d] = index[d];
    rec[3 + KF_CHECK_MAX_DIMS + d] = shape[d];
  }
}

inline bool kf_check_failed(const int64_t* rec) { return __atomic_load_n(&rec[0], __ATOMIC_RELAXED) != 0; }
