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


def _sm100a_sass(kernel) -> tuple[dict, str]:
    """``kernel`` built for sm_100a (no spills, no local memory) and its SASS; the test is skipped
    after the build check when cuobjdump is missing."""
    report = cuda_backend.build_report(kernel, "sm_100a")
    assert not (report["spill_stores"] or report["spill_loads"] or report["local_bytes"]), report
    try:
        return report, cuda_backend.disassemble(report["path"])
    except Exception as e:  # noqa: BLE001 - cuobjdump missing: the build check above still ran
        pytest.skip(f"cuobjdump unavailable: {e}")


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("name, mma, resident", [("m_grouped_gemm_nt_contiguous", "UTCHMMA", True),
                                                 ("mla_decode", "UTCHMMA", False),
                                                 ("m_grouped_fp8_gemm_nt_contiguous", "UTCQMMA", False)])
def test_bench_problem_builds_on_tcgen05_without_spills(name, mma, resident):
    spec = registry.get(name)
    kernel = spec.factory(**spec.problems["bench"].params).ir
    report, sass = _sm100a_sass(kernel)
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
    report, sass = _sm100a_sass(kernel)
    instrs = next(k for k in sass_report.parse(sass) if any(sass_report.is_mma(i) for i in k.instrs)).instrs
    lo, hi = sass_report.main_loop(instrs)
    loop = [i for i in instrs if lo <= i.address <= hi]
    bases = [i.base for i in loop]
    scaled = re.findall(r"UTCQMMA gdesc\[\w+\], gdesc\[\w+\], tmem\[[^]]+\], tmem\[[^]]+\], idesc\[\w+\], tmem\[",
                        sass)
    assert len(scaled) == bases.count("UTCQMMA") == 128 // 32, (len(scaled), bases.count("UTCQMMA"))
    assert bases.count("UTCCP") == 2  # A's 128 rows, B's 128 columns
    assert not {"FFMA", "FMUL", "LDTM", "HMMA"} & set(bases), sorted(set(bases))



@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_two_cta_pair_mma_kernels_assemble_to_2cta_sass(tmp_path):
    """The 2-CTA kernels of tests/emu/test_tcgen05_pair.py for sm_100a (one build): the plain pair
    GEMM (bf16, M = 256 over the pair, N = 256; its e4m3 form; its form committing without
    multicast) and the TMA-ring pair GEMM.  Their MMAs, TMEM allocation and commits are the 2-CTA
    forms (``UTCHMMA.2CTA`` / ``UTCQMMA.2CTA``, ``UTCATOMSWS.2CTA``, ``UTCBAR.2CTA.MULTICAST`` or
    ``UTCBAR.2CTA``), no cta_group::1 form is left, the ring loads by TMA and releases to its peer
    with a remote arrive, and none spills."""
    import subprocess

    from kernforge.backends.cuda.renderer import INCLUDE_DIR
    from tests.emu.test_tcgen05_pair import PAIR_RING, SOURCE, _idesc, ring_kernel_source

    src = tmp_path / "pair.cu"
    entries = {"pair": (2, 256, 0), "pair_e4m3": (1, 128, 0), "pair_no_multicast": (2, 64, 3)}
    src.write_text(SOURCE + PAIR_RING + ring_kernel_source("ring", 0) + "\n" + "".join(
        f'extern "C" __global__ void __cluster_dims__(2, 1, 1) {name}(const unsigned char* A, const unsigned char* B, '
        f'float* D, int K) {{ pair_run<{es}, {n}, {_idesc(es, n):#x}u, {plant}>(A, B, D, K); }}\n'
        for name, (es, n, plant) in entries.items()))
    cubin = tmp_path / "pair.cubin"
    build = subprocess.run(["nvcc", "-arch=sm_100a", "-cubin", "-std=c++17", "-Xptxas", "-v", "-I", str(INCLUDE_DIR),
                            "-o", str(cubin), str(src)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    assert build.stderr.count("0 bytes spill stores, 0 bytes spill loads") == 4, build.stderr
    try:
        sass = cuda_backend.disassemble(str(cubin))
    except Exception as e:  # noqa: BLE001 - cuobjdump missing: the build check above still ran
        pytest.skip(f"cuobjdump unavailable: {e}")
    kernels = {k.name: [i.opcode for i in k.instrs] for k in sass_report.parse(sass)}
    assert set(kernels) == {"pair", "pair_e4m3", "pair_no_multicast", "ring"}, set(kernels)
    for name, ops in kernels.items():
        mma = [op for op in ops if op.split(".")[0] in sass_report.UTC_MMA]
        want = "UTCQMMA.2CTA" if name == "pair_e4m3" else "UTCHMMA.2CTA"
        assert mma and all(op == want for op in mma), (name, mma)
        commit = "UTCBAR.2CTA" if name == "pair_no_multicast" else "UTCBAR.2CTA.MULTICAST"
        assert commit in ops, (name, sorted(set(ops)))
        assert any(op.startswith("UTCATOMSWS.2CTA") for op in ops), (name, sorted(set(ops)))
        assert not any(op.split(".")[0] == "UTCBAR" and ".2CTA" not in op for op in ops), name
    assert any(op.startswith("UTMALDG") for op in kernels["ring"])
    assert any(op.startswith("SYNCS.ARRIVE.TRANS64.RED") for op in kernels["ring"])  # the peer's remote arrive


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("factory, params, mma, resident", [
    ("dense_gemm", dict(block_N=256, block_K=64), "UTCHMMA.2CTA", True),
    ("fp8_gemm", dict(block_N=128), "UTCQMMA.2CTA", False),
])
def test_generated_pair_gemm_builds_2cta_sass(factory, params, mma, resident):
    """The generated 2-CTA GEMMs (``cta_pair=True``, the bench shape's N and K, 128 rows per CTA,
    256 over the pair): ``bf16_gemm_nt`` at 128 x 256 per CTA and the scaled FP8 GEMM
    (``kind::f8f6f4``, read back every 128-K block).  No spills; every tensor-core MMA, the commit
    and the TMEM allocation are 2-CTA forms (``UTCHMMA.2CTA`` / ``UTCQMMA.2CTA``,
    ``UTCBAR.2CTA.MULTICAST``, ``UTCATOMSWS.2CTA``), no cta_group::1 commit is left; the main loop
    holds the peer's remote arrive, and ``LDTM`` only where the sum is not TMEM-resident."""
    from kernforge.kernels import gemm

    kernel = getattr(gemm, factory)(N=7168, K=2048, block_M=128, num_stages=3, threads=256, cta_pair=True,
                                    **params).ir
    report, sass = _sm100a_sass(kernel)
    (k,) = sass_report.parse(sass)
    ops = [i.opcode for i in k.instrs]
    mmas = [op for op in ops if op.split(".")[0] in sass_report.UTC_MMA]
    assert mmas and all(op == mma for op in mmas), mmas
    assert "UTCBAR.2CTA.MULTICAST" in ops and any(op.startswith("UTCATOMSWS.2CTA") for op in ops)
    assert not any(op.split(".")[0] == "UTCBAR" and ".2CTA" not in op for op in ops)
    lo, hi = sass_report.main_loop(k.instrs)
    loop = [i.opcode for i in k.instrs if lo <= i.address <= hi]
    assert "SYNCS.ARRIVE.TRANS64.RED.A1T0" in loop, loop
    assert any(op.startswith("LDTM") for op in loop) != resident, loop
