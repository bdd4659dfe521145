"""The sm_100a tcgen05 lowering's static parts: the shipped ``kf/tcgen05.cuh`` is the generator's
output, and the layout planner's tcgen05 choice and TMEM sizing follow their rules."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from kernforge import dtypes
from kernforge.backends.cuda.layout_plan import TMEM_COLUMNS, tcgen05_columns, tcgen05_ok
from kernforge.backends.cuda.layouts import AccumLayout

ROOT = Path(__file__).resolve().parents[2]


def test_shipped_header_is_the_generators_output():
    run = subprocess.run([sys.executable, str(ROOT / "tools/gen_tcgen05.py"), "--check"], capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr


def test_tcgen05_takes_warpgroup_accumulators_within_tensor_memory():
    bf16 = dtypes.bfloat16
    assert tcgen05_ok(AccumLayout(64, 512, 4, 2, 8), bf16)  # MLA's output: 64 x 512, 256 per warp column
    assert tcgen05_columns(AccumLayout(64, 512, 4, 2, 8)) == TMEM_COLUMNS
    assert tcgen05_ok(AccumLayout(128, 128, 4, 1, 4), dtypes.float16)
    assert not tcgen05_ok(AccumLayout(128, 512, 4, 2, 8), bf16)  # 1024 columns: over TMEM
    assert not tcgen05_ok(AccumLayout(64, 64, 2, 2, 4), bf16)  # warps along M not a warpgroup
    assert not tcgen05_ok(AccumLayout(64, 64, 4, 1, 4), dtypes.float32)
    # M = 128 MMAs (layout D: all 128 lanes) need half the columns of two M = 64 ones
    assert tcgen05_columns(AccumLayout(128, 128, 4, 1, 4)) == 256
    assert tcgen05_columns(AccumLayout(128, 128, 4, 1, 4, m128=True)) == 128
    assert tcgen05_columns(AccumLayout(256, 256, 8, 1, 8, m128=True)) == TMEM_COLUMNS
