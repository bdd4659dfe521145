"""Small C++ sources in the CPU backend's ABI: ``int kf_<name>(void** args, const int64_t* dims)``."""

AXPY = r"""
#include <cstdint>
#include "kf_test/scale.h"
extern "C" int kf_axpy(void** args, const int64_t* dims) {
  const float* x = static_cast<const float*>(args[0]);
  const float* y = static_cast<const float*>(args[1]);
  float* out = static_cast<float*>(args[2]);
  if (dims[0] < 0) return 2;
  #pragma omp parallel for
  for (int64_t i = 0; i < dims[0]; ++i) out[i] = KF_ALPHA * x[i] + y[i];
  return 0;
}
"""

# Returns a value through a pointer so tests can see which header version was compiled.
VALUE = r"""
#include <cstdint>
#include "kf_test/value.h"
extern "C" int kf_value(void** args, const int64_t* dims) {
  *static_cast<int64_t*>(args[0]) = KF_VALUE;
  return 0;
}
"""

THREADS = r"""
#include <cstdint>
#include <omp.h>
extern "C" int kf_threads(void** args, const int64_t* dims) {
  int64_t* out = static_cast<int64_t*>(args[0]);
  #pragma omp parallel num_threads(2)
  {
    #pragma omp single
    out[0] = omp_get_num_threads();
  }
  return 0;
}
"""


def value_source(extra: str = "") -> str:
    return VALUE + extra
