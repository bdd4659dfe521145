// Element conversions between storage types and compute types, used by the tile
// helpers (gemm, reduce, cumsum): low-precision floats widen to float exactly and
// narrow with round-to-nearest-even; every other pair is a C++ conversion.
#pragma once

#include "types.h"

namespace kf {

template <class C, class S>
inline constexpr C load_as(S x) {
  if constexpr (kf_is_low_precision<S>::value) return C(kf_to_float(x));
  else return C(x);
}

template <class D, class C>
inline constexpr D store_as(C x) {
  if constexpr (kf_is_low_precision<D>::value) return kf_from_float<D>(float(x));
  else return D(x);
}

}  // namespace kf
