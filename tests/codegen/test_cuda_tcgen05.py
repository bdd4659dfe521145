"""The sm_100a tcgen05 lowering's static parts: the shipped ``kf/tcgen05.cuh`` is the generator's
output, and the layout planner's tcgen05 choice and TMEM sizing follow their rules."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from kernforge import dtypes
from kernforge.backends.cuda import tcgen05
from kernforge.backends.cuda.layout_plan import tcgen05_ok
from kernforge.backends.cuda.tcgen05 import TMEM_COLUMNS, tcgen05_columns
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


def _decode(e, nan_bits=0x7FC00000, shift=23, zero_bits=1 << 22):
    import kernforge.dsl as T
    return T.reinterpret("float32", T.if_then_else(e == 0, zero_bits, T.if_then_else(e == 255, nan_bits, e << shift)))


def test_block_scaling_recognises_exactly_the_ue8m0_decode():
    """``tcgen05.match_ue8m0`` hands the byte to the tensor cores only for the exact decode
    ``kernels.gemm.ue8m0_value`` builds (2^(e - 127), 2^-127 at 0, NaN at 255): a decode with
    another bias, another value at 0 or 255, or another byte, keeps the CUDA-core promotion."""
    from kernforge.codegen import ir
    from kernforge.kernels.gemm.kernel import ue8m0_value

    word = ir.Var("w", dtypes.int32)
    assert str(tcgen05.match_ue8m0(ue8m0_value(word, 2))) == "((w >> 16) & 255)"
    e = (word >> 8) & 255
    assert str(tcgen05.match_ue8m0(_decode(e))) == "((w >> 8) & 255)"
    # bias 128 (shift 22), 255 as +inf, 0 as 0.0, an unmasked byte, bias 126 (e + 1)
    for bad in (_decode(e, shift=22), _decode(e, nan_bits=0x7F800000), _decode(e, zero_bits=0), _decode(word >> 24),
                _decode(e + 1)):
        assert tcgen05.match_ue8m0(bad) is None, bad


def test_ue8m0_fp8_gemm_folds_its_promotion_and_sizes_tensor_memory_for_the_scales():
    from kernforge.backends.cuda_emu.backend import CudaEmuBackend
    from kernforge.codegen.renderer import Target
    from kernforge.kernels.gemm import fp8_gemm

    def plan(**kw):
        k = fp8_gemm(**{**dict(N=256, K=512, block_M=128, block_N=128, threads=256, sf_format="ue8m0"), **kw}).ir
        return CudaEmuBackend().renderer.lower(k, Target("cuda-emu", kw.pop("arch", "sm_100a")))[1]["layouts"]

    p = plan()
    (g, bs), = p.block_scaled.items()
    assert bs.acc.name == "C" and p.tmem_resident[g] is bs.loop
    lay = p.registers[g.c.buffer]
    assert tcgen05.scale_columns(lay) == 4 + 4 and p.tmem_columns() == 256  # 128 + 8 -> 256
    assert not plan(sf_format="float32").block_scaled  # float32 scales: any value, CUDA-core promotion
    assert not plan(block_M=64).block_scaled  # block scaling has no M = 64
    assert not plan(a_major="mn").block_scaled  # an MN-major A takes bf16 shadow tiles
