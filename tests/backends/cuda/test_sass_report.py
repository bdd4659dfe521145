"""``kernforge build``'s wgmma advisories and ``--report`` (SASS counts, cycle model).

The nvcc tests compile the bench problems of every library kernel that uses wgmma for sm_90a
(the shapes the issue's SASS analysis is about) and fail on any ptxas C7519/C7520 advisory:
a serialized wgmma is a performance bug CI must catch without a GPU.  The report's counts are
checked against an independent count of the same ``cuobjdump -sass`` text.
"""
from __future__ import annotations

import re
import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest

from kernforge.backends.cuda import backend as cuda_backend
from kernforge.backends.cuda import sass_report
from kernforge.backends.cuda.renderer import render_cuda
from kernforge.kernels import registry
from kernforge.runtime.compilers.nvcc import parse_ptxas_advisories

needs_nvcc = [pytest.mark.nvcc, pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")]

# the library kernels whose gemms take wgmma on sm_90a (topk has no gemm)
WGMMA_KERNELS = ("m_grouped_fp8_gemm_nt_contiguous", "m_grouped_gemm_nt_contiguous", "m_grouped_gemm_nt_masked",
                 "mla_decode", "mla_decode_sparse")

C7520 = ("ptxas info    : (C7520) Potential Performance Loss: wgmma.mma_async instructions are serialized due to "
         "program dependence on compiler-inserted WG.AR in divergent path in the function 'kf_a'")
C7519 = ("ptxas info    : (C7519) warpgroup.arrive is injected in around line 3004 by compiler to allow use of "
         "registers in GMMA in function 'kf_b'")


def test_advisories_parsed_per_function():
    log = "\n".join(["ptxas info    : Compiling entry function 'kf_a' for 'sm_90a'", C7520,
                     "ptxas info    : (C7777) something unrelated to the tensor cores", C7519,
                     "ptxas info    : Used 193 registers, used 1 barriers"])
    got = parse_ptxas_advisories(log)
    assert sorted(got) == ["kf_a", "kf_b"]
    assert got["kf_a"][0].startswith("C7520: Potential Performance Loss: wgmma.mma_async")
    assert got["kf_b"] == ["C7519: " + C7519.split("(C7519) ")[1]]
    assert parse_ptxas_advisories("ptxas info    : Used 10 registers") == {}


SASS = """
	code for sm_90a
		Function : kf_toy
        /*0000*/                   S2R R0, SR_TID.X ;
        /*0010*/                   UTMALDG.2D [UR8], [UR4] ;
        /*0020*/                   LDS.U8 R2, [R3] ;
        /*0030*/                   F2FP.BF16.F32.PACK_AB R2, R2, R2 ;
        /*0040*/                   STS.U16 [R3], R2 ;
        /*0050*/               @P0 BRA 0x20 ;
        /*0060*/                   WARPGROUP.ARRIVE ;
        /*0070*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], R24 ;
        /*0080*/                   QGMMA.64x64x32.F32.E4M3.E4M3 R24, gdesc[UR8], R24 ;
        /*0090*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*00a0*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*00b0*/              @!P1 BRA 0x10 ;
        /*00c0*/                   STG.E.64 desc[UR6][R4.64], R6 ;
        /*00d0*/                   EXIT ;
"""


def test_counts_loops_and_model_on_a_listing():
    (k,) = sass_report.parse(SASS)
    assert k.name == "kf_toy" and len(k.instrs) == 14
    c = sass_report.counts(k.instrs)
    assert (c["mma_hgmma"], c["mma_qgmma"], c["tma_load"], c["f2fp"], c["lds_narrow"], c["sts_narrow"]) == \
        (1, 1, 1, 1, 1, 1)
    assert (c["wgmma_arrive"], c["wgmma_depbar"], c["bar_sync"], c["stg"], c["stg_narrow"]) == (1, 1, 1, 1, 0)
    assert sorted(sass_report.loops(k.instrs)) == [(0x10, 0xb0), (0x20, 0x50)]
    assert sass_report.main_loop(k.instrs) == (0x10, 0xb0)  # the smallest loop holding both MMAs
    m = sass_report.model(k, "sm_90a", 256, flops=2.0 ** 40, nbytes=1e6, operands="fp8")
    loop = m["main_loop"]
    # HGMMA 64x128x16: 64 cycles, QGMMA 64x64x32 at the fp8 rate: 32; 11 instructions x 8 warps / 4
    assert (loop["mma_cycles"], loop["issue_cycles"], loop["waits"], loop["nested_loops"]) == (96.0, 22.0, 2, 1)
    assert loop["cycles"] == 96.0 + 2 * sass_report.WAIT_LATENCY
    assert m["compute_efficiency"] == round(96 / 296, 3)
    assert m["bound"] == "compute" and m["fraction_of_peak"] == round(96 / 296, 3)
    assert m["mma_dtype"] == "fp8" and m["peak_tflops"] == m["reference_tflops"] == round(8192 * 132 * 1.83 / 1e3, 1)
    # a bf16 problem's ideal time is twice as long, so the same kernel reaches twice the fraction
    bf16 = sass_report.model(k, "sm_90a", 256, 2.0 ** 40, 1e6, operands="bf16")
    assert bf16["ideal_us"] == pytest.approx(2 * m["ideal_us"], rel=1e-3)
    with pytest.raises(ValueError, match="no 'Function :'"):
        sass_report.parse("not sass")


SASS_SM100 = """
	code for sm_100a
		Function : kf_utc
        /*0000*/                   S2R R0, SR_TID.X ;
        /*0010*/                   UTMALDG.2D [UR8], [UR4] ;
        /*0020*/                   UTCHMMA gdesc[UR8], gdesc[UR12], tmem[UR5], tmem[UR16], idesc[UR17], !UPT ;
        /*0030*/                   UTCHMMA gdesc[UR8], gdesc[UR12], tmem[UR5], tmem[UR16], idesc[UR17], UPT ;
        /*0040*/                   UTCBAR [UR4], URZ ;
        /*0050*/                   LDTM.16dp256bit.x16 R8, tmem[UR6] ;
        /*0060*/              @!P1 BRA 0x10 ;
        /*0070*/                   EXIT ;
"""


def test_tcgen05_mmas_count_as_mma_and_their_plan_flops_as_tensor_time():
    (k,) = sass_report.parse(SASS_SM100)
    c = sass_report.counts(k.instrs)
    assert (c["mma_utc"], c["mma_hgmma"], c["mma_hmma"], c["tma_load"]) == (2, 0, 0, 1)
    assert sass_report.main_loop(k.instrs) == (0x10, 0x60)
    # two M = 64, N = 128, K = 16 MMAs: 2 * 64 * 128 * 32 flops at B200's bf16 rate (8192 / cycle)
    m = sass_report.model(k, "sm_100a", 128, flops=None, nbytes=None, utc_flops=2.0 * 64 * 128 * 32)
    assert m["main_loop"]["mma_instructions"] == 2
    assert m["main_loop"]["mma_cycles"] == 64.0 and m["mma_dtype"] == "bf16"
    # without the plan's flops the tensor time is unknown (0), never guessed
    assert sass_report.model(k, "sm_100a", 128, None, None)["main_loop"]["mma_cycles"] == 0.0
    # kind::f8f6f4 (UTCQMMA) at the fp8 rate
    (q,) = sass_report.parse(SASS_SM100.replace("UTCHMMA", "UTCQMMA"))
    fp8 = sass_report.model(q, "sm_100a", 128, None, None, utc_flops=2.0 * 64 * 128 * 64)
    assert fp8["mma_dtype"] == "fp8" and fp8["main_loop"]["mma_cycles"] == 64.0


@pytest.fixture(scope="module")
def bench_reports():
    """``build_report(report=True)`` of every wgmma library kernel's bench problem (sm_90a),
    compiled two at a time through the runtime cache."""
    def one(name):
        spec = registry.get(name)
        params = spec.problems["bench"].params
        return name, cuda_backend.build_report(spec.factory(**params).ir, "sm_90a", report=True,
                                               flops=spec.flops and spec.flops(params),
                                               nbytes=spec.bytes and spec.bytes(params))

    with ThreadPoolExecutor(2) as pool:
        return dict(pool.map(one, WGMMA_KERNELS))


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("name", WGMMA_KERNELS)
def test_no_serialized_wgmma_in_library_kernels(bench_reports, name):
    rep = bench_reports[name]
    assert rep["advisories"] == [], f"{name} (bench, sm_90a): ptxas advisories {rep['advisories']}"
    sass = rep["sass"]
    mma = sass["mma_hgmma"] + sass["mma_qgmma"]
    # unserialized: one wait per gemm site of the source (each commits its group once; a release
    # ring waits once more after its loop), not one per wgmma (MLA's seesaw has five sites: two
    # score gemms, three output products)
    spec = registry.get(name)
    sites = render_cuda(spec.factory(**spec.problems["bench"].params).ir, "sm_90a").source.count("kf::wgmma_commit();")
    assert sass["wgmma_depbar"] <= sites + 1 and sites <= 5 and sass["wgmma_depbar"] < mma, (sites, sass)


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("name", ("m_grouped_fp8_gemm_nt_contiguous", "m_grouped_gemm_nt_contiguous",
                                  "m_grouped_gemm_nt_masked", "mla_decode"))
def test_tma_moves_whole_swizzled_tiles(bench_reports, name):
    """Issue 21 item 2 in the SASS: every TMA tile of the bench problem is 128B-swizzled and moves
    as one box per 128-byte chunk, so the kernel holds at most one UTMALDG per box per ring issue
    site (num_stages sites: the prologue's S-1 and the loop's), not a per-core-matrix loop in
    every thread; streamed tiles (MLA's KV) carry the L2 cache-policy operand."""
    from kernforge.backends.cuda.renderer import CudaRenderer
    from kernforge.codegen.renderer import Target

    spec = registry.get(name)
    _, facts = CudaRenderer().lower(spec.factory(**spec.problems["bench"].params).ir,
                                    Target("cuda", "sm_90a", "", False))
    loops = facts["tma"][0]
    tiles = [t for ts in loops.values() for t in ts]
    assert tiles and all(t.layout == "swizzled" and t.boxes == t.cols * t.spec.elem_bytes // 128 for t in tiles)
    rep = bench_reports[name]
    assert 0 < rep["sass"]["tma_load"] <= sum(loop.num_stages * sum(t.boxes for t in ts) for loop, ts in loops.items())
    loads = [line for line in cuda_backend.disassemble(rep["path"]).splitlines() if "UTMALDG" in line]
    hinted = [line for line in loads if "desc[" in line]  # UTMALDG ... [smem], [map], desc[policy]
    assert len(hinted) == (len(loads) if any(t.evict_first for t in tiles) else 0)


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_report_counts_are_the_disassemblys(bench_reports):
    """The report's counts and model come from the real SASS: recount it independently."""
    rep = bench_reports["mla_decode"]
    text = cuda_backend.disassemble(rep["path"])
    ops = re.findall(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][\w.]*)", text, re.MULTILINE)
    assert rep["sass"]["instructions"] == len(ops)
    for key, prefix in (("mma_hgmma", "HGMMA."), ("tma_load", "UTMALDG."), ("f2fp", "F2FP."),
                        ("wgmma_depbar", "WARPGROUP.DEPBAR"), ("bar_sync", "BAR.")):
        assert rep["sass"][key] == sum(o.startswith(prefix) for o in ops), key
    model = rep["model"]
    assert model["bound"] == "compute" and 0 < model["fraction_of_peak"] <= 1
    assert model["main_loop"]["mma_instructions"] == rep["sass"]["mma_hgmma"]
    spec = registry.get("mla_decode")
    params = spec.problems["bench"].params
    assert model["flops"] == spec.flops(params)


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_cli_build_report(bench_reports, capsys):
    """``kernforge build --report`` prints the counts and the model (the entry is cached by the
    fixture); ``--report`` on a backend without SASS is a one-line error naming the flag."""
    from kernforge.cli import main

    assert main(["build", "m_grouped_fp8_gemm_nt_contiguous", "--problem", "bench", "--report"]) == 0
    out = capsys.readouterr().out
    qgmma = bench_reports["m_grouped_fp8_gemm_nt_contiguous"]["sass"]["mma_qgmma"]
    assert re.search(rf"^mma_qgmma\s+{qgmma}$", out, re.MULTILINE) and qgmma > 0
    assert re.search(r"^fraction_of_peak\s+0\.\d+$", out, re.MULTILINE) and "assumptions: main loop" in out
    assert main(["build", "topk_fp32", "--backend", "cpu", "--report"]) == 1
    assert "--report reads SASS: it needs --backend cuda" in capsys.readouterr().err
