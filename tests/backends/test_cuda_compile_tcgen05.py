"""sm_100a builds with tcgen05 (issue 21, item 6), with nvcc and no GPU: the bf16 and fp8 grouped
GEMMs and MLA decode (bench problems) compile without spills or local memory, and their SASS
issues tcgen05 MMAs (``UTCHMMA`` for bf16, ``UTCQMMA`` for e4m3 ``kind::f8f6f4``) fed by TMA
(``UTMALDG``) with tensor-memory loads (``LDTM``), and no mma.sync (``HMMA``) or cp.async
(``LDGSTS``).  The bf16 grouped GEMM keeps its accumulator in tensor memory across the K loop:
no ``LDTM`` in its main loop (MLA decode and the scaled fp8 GEMM read theirs back every
iteration), and the UE8M0 fp8 GEMM folds its promotion into block-scaled MMAs.  Kept to four
builds: CPU time is scarce.  The cycle model's main loop is the K loop,
not the elect-one loop ptxas wraps around a lone tcgen05.mma (a listing, no nvcc needed)."""
from __future__ import annotations

import re
import shutil

import pytest

from kernforge.backends.cuda import backend as cuda_backend, sass_report
from kernforge.kernels import registry


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("name, mma, resident", [("m_grouped_gemm_nt_contiguous", "UTCHMMA", True),
                                                 ("mla_decode", "UTCHMMA", False),
                                                 ("m_grouped_fp8_gemm_nt_contiguous", "UTCQMMA", False)])
def test_bench_problem_builds_on_tcgen05_without_spills(name, mma, resident):
    spec = registry.get(name)
    kernel = spec.factory(**spec.problems["bench"].params).ir
    report = cuda_backend.build_report(kernel, "sm_100a")
    assert not (report["spill_stores"] or report["spill_loads"] or report["local_bytes"]), report
    try:
        sass = cuda_backend.disassemble(report["path"])
    except Exception as e:  # noqa: BLE001 - cuobjdump missing: the build check above still ran
        pytest.skip(f"cuobjdump unavailable: {e}")
    ops = re.findall(r"/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9]+)", sass)
    assert mma in ops and "UTMALDG" in ops and "LDTM" in ops, sorted(set(ops))
    assert "HMMA" not in ops and "LDGSTS" not in ops
    instrs = next(k for k in sass_report.parse(sass) if any(sass_report.is_mma(i) for i in k.instrs)).instrs
    lo, hi = sass_report.main_loop(instrs)
    in_loop = sum(1 for i in instrs if lo <= i.address <= hi and i.base == "LDTM")
    assert (in_loop == 0) == resident, in_loop


# one tcgen05.mma per K step, issued by an elected thread inside ptxas's ELECT ... BRA.U.ANY retry
# loop, then the tensor-memory read-back after the K loop
SASS_ONE_MMA = """
        Function : k
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   UTMALDG.2D [UR8], [UR4] ;
        /*0020*/               @P0 ELECT P1, URZ, PT ;
        /*0030*/                   UTCQMMA gdesc[UR8], gdesc[UR12], tmem[UR5], tmem[UR20], idesc[UR21], !UPT ;
        /*0040*/               @P0 BRA.U.ANY 0x20 ;
        /*0050*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0060*/              @!P1 BRA 0x10 ;
        /*0070*/                   LDTM.16dp256bit.x16 R8, tmem[UR6] ;
        /*0080*/                   EXIT ;
"""


def test_model_main_loop_is_the_k_loop_not_the_elect_loop_and_counts_tmem_loads():
    (k,) = sass_report.parse(SASS_ONE_MMA)
    assert sass_report.main_loop(k.instrs) == (0x10, 0x60)
    assert sass_report.counts(k.instrs)["ldtm"] == 1
    m = sass_report.model(k, "sm_100a", 128, None, None, utc_flops=2.0 * 128 * 128 * 32)
    assert m["main_loop"]["tmem_loads"] == 0 and m["main_loop"]["waits"] == 1


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_ue8m0_fp8_gemm_builds_block_scaled_mmas_without_a_promotion_loop():
    """DeepGEMM's SM100 recipe (UE8M0 scales, ``fp8_gemm(sf_format="ue8m0")``) on sm_100a: the K loop
    copies the scale factors into tensor memory (``UTCCP``) and issues block-scaled ``UTCQMMA``
    (a third tensor-memory operand, the B factors, after the instruction descriptor), with no
    FFMA/FMUL promotion of partial products and no ``LDTM`` read-back in the loop."""
    from kernforge.kernels.gemm import fp8_gemm

    kernel = fp8_gemm(N=7168, K=2048, block_M=128, block_N=128, num_stages=3, threads=256, sf_format="ue8m0").ir
    report = cuda_backend.build_report(kernel, "sm_100a")
    assert not (report["spill_stores"] or report["spill_loads"] or report["local_bytes"]), report
    try:
        sass = cuda_backend.disassemble(report["path"])
    except Exception as e:  # noqa: BLE001 - cuobjdump missing: the build check above still ran
        pytest.skip(f"cuobjdump unavailable: {e}")
    instrs = next(k for k in sass_report.parse(sass) if any(sass_report.is_mma(i) for i in k.instrs)).instrs
    lo, hi = sass_report.main_loop(instrs)
    loop = [i for i in instrs if lo <= i.address <= hi]
    bases = [i.base for i in loop]
    scaled = re.findall(r"UTCQMMA gdesc\[\w+\], gdesc\[\w+\], tmem\[[^]]+\], tmem\[[^]]+\], idesc\[\w+\], tmem\[",
                        sass)
    assert len(scaled) == bases.count("UTCQMMA") == 128 // 32, (len(scaled), bases.count("UTCQMMA"))
    assert bases.count("UTCCP") == 2  # A's 128 rows, B's 128 columns
    assert not {"FFMA", "FMUL", "LDTM", "HMMA"} & set(bases), sorted(set(bases))
