// Everything generated CPU kernels include: low-precision types, the scalar
// helpers of the shared C printer, atomics, the per-thread arena and the tile
// routines (gemm, reduce, cumsum).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "append.h"
#include "arena.h"
#include "atomic.h"
#include "convert.h"
#include "gemm.h"
#include "vmath.h"
#include "scalar.h"
#include "stream.h"
#include "tile.h"
#include "types.h"
