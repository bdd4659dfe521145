"""The fp8 -> bf16 operand pass: exact by construction, and only for fp8 x fp8 tile gemms."""
from __future__ import annotations

import ml_dtypes
import numpy as np

import kernforge.dsl as T
from kernforge import dtypes
from kernforge.codegen import ir
from kernforge.backends.cuda.fp8_operands import cuda_fp8_operands
from kernforge.codegen.verify import verify


def test_every_e4m3_value_is_exactly_a_bf16_value():
    codes = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)
    wide = codes.astype(np.float32)
    finite = np.isfinite(wide)
    assert (wide[finite].astype(ml_dtypes.bfloat16).astype(np.float32) == wide[finite]).all()


def _gemm(dtype):
    @T.prim_func
    def k(A: T.Tensor((64, 64), dtype), B: T.Tensor((64, 64), dtype), C: T.Tensor((64, 64), "float32")):
        with T.Kernel(1, threads=128) as bx:
            A_s = T.alloc_shared((64, 64), dtype)
            B_s = T.alloc_shared((64, 64), dtype)
            acc = T.alloc_fragment((64, 64), "float32")
            T.copy(A[0, 0], A_s)
            T.copy(B[0, 0], B_s)
            T.gemm(A_s, B_s, acc, transpose_B=True, clear_accum=True)
            T.copy(acc, C[0, 0])
    return k.ir


def test_fp8_gemm_reads_bf16_shadow_tiles_filled_by_copies():
    out = cuda_fp8_operands(_gemm("float8_e4m3"))
    verify(out)
    gemm = next(n for n in ir.walk(out.body) if isinstance(n, ir.Gemm))
    assert gemm.a.buffer.dtype == gemm.b.buffer.dtype == dtypes.bfloat16
    assert gemm.a.buffer.scope == ir.Scope.SHARED and gemm.trans_b and gemm.clear_accum
    copies = [(c.src.buffer.name, c.dst.buffer.name) for c in ir.walk(out.body) if isinstance(c, ir.Copy)]
    assert ("A_s", "A_s_bf16") in copies and ("B_s", "B_s_bf16") in copies


def test_other_gemms_are_left_alone():
    k = _gemm("bfloat16")
    assert cuda_fp8_operands(k) is k
