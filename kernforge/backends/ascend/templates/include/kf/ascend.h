// kernforge's Ascend C device library: everything a generated kernel includes after
// kernel_operator.h.  Written against the public Ascend C API only, so the same text
// compiles with bisheng for the NPU and with g++ against the ascend-emu shim.
#pragma once

#include "kernel_operator.h"

#include "kf/scalar.h"
#include "kf/sync.h"
#include "kf/copy.h"
#include "kf/tile.h"
#include "kf/cube.h"
