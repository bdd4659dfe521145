"""Compile checks with nvcc (no GPU needed): every library kernel and the test kernels build for
sm_90a, sm_100a and sm_80, and the SASS shows the instructions the design promises.

The compile set is bounded: the GEMM and attention kernels' "small" problems on all three
targets and their "demo" problems on sm_90a, one sm_90a build of every other library kernel's
"small" problem, four test kernels; built two at a time through the runtime's cache, so a warm
``KERNFORGE_CACHE_DIR`` makes a rerun take seconds.
"""
from __future__ import annotations

import functools
import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest

from kernforge.codegen import ir
from kernforge.backends.cuda import backend as cuda_backend
from kernforge.backends.cuda.renderer import CudaRenderError, render_cuda
from kernforge.backends import BackendError
from kernforge.kernels import registry
from tests.backends.test_cuda_semantics import gemm, scores_softmax

pytestmark = [pytest.mark.nvcc, pytest.mark.slow,
              pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")]

# tiles under 64 rows take mma.sync (HMMA) on Hopper too; K-major fp8 tiles of warpgroup size take
# native fp8 wgmma (QGMMA) on sm_90a, other fp8 operands run on bf16 shadow tiles
TENSOR_CORE = {"sm_90a": ("HGMMA", "HMMA", "QGMMA"), "sm_80": ("HMMA",), "sm_100a": ("HMMA",)}


def _mma_shaped(kernel) -> bool:
    """Every gemm of the kernel has tensor-core operand types and tiles of whole 16x8x16 atoms."""
    gemms = [g for g in ir.walk(kernel.body) if isinstance(g, ir.Gemm)]
    for g in gemms:
        m, k = g.a.extents[::-1] if g.trans_a else g.a.extents
        n = g.b.extents[0] if g.trans_b else g.b.extents[1]
        if g.a.buffer.dtype.name not in ("bfloat16", "float16", "float8_e4m3") or m % 16 or n % 8 or k % 16:
            return False
    return bool(gemms)


def _compile_set():
    big_gemm = gemm(512, 512, 512, bm=128, bn=128, bk=32, stages=3, threads=128)
    items = [("gemm", arch, big_gemm.ir, True) for arch in ("sm_90a", "sm_80")]
    items.append(("gemm_nt", "sm_90a", gemm(512, 512, 512, bm=128, bn=128, bk=64, stages=2, trans_b=True).ir, True))
    items.append(("scores_softmax", "sm_90a", scores_softmax().ir, True))
    for name, spec in sorted(registry.all_specs().items()):
        for label, archs in (("small", ("sm_90a", "sm_80", "sm_100a")), ("demo", ("sm_90a",))):
            if label in spec.problems:
                pf = spec.factory(**spec.problems[label].params)
                if not _tensor_core_family(spec, pf.ir):
                    # element-wise, routing and permutation kernels use no arch-specific instruction:
                    # one sm_90a build of the small problem covers them (their own tests build more)
                    if label != "small":
                        continue
                    archs = ("sm_90a",)
                items += [(f"{name}[{label}]", arch, pf.ir, _mma_shaped(pf.ir)) for arch in archs]
    return items


def _tensor_core_family(spec, kernel) -> bool:
    """Kernels whose code differs by architecture: every GEMM, and the attention kernels."""
    return any(isinstance(g, ir.Gemm) for g in ir.walk(kernel.body)) or "attention" in spec.tags


@pytest.fixture(scope="module")
def built():
    items = _compile_set()

    def one(item):
        label, arch, kernel, hot = item
        try:
            return item, cuda_backend.build_report(kernel, arch), None
        except CudaRenderError as e:
            return item, None, e

    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(one, items))


@functools.lru_cache(maxsize=None)
def _sass(path: str) -> str:
    return cuda_backend.disassemble(path)


def _sass_or_skip(path: str) -> str:
    try:
        return _sass(path)
    except BackendError as e:
        pytest.skip(f"no disassembler: {e}")


def test_everything_compiles_without_local_memory(built):
    failures = []
    for (label, arch, kernel, hot), report, error in built:
        if error is not None:
            failures.append(f"{label} {arch}: {error}")
            continue
        if report["spill_stores"] or report["spill_loads"] or report["local_bytes"]:
            failures.append(f"{label} {arch}: spills/stack {report}")
    assert not failures, "\n".join(failures)


def test_matrix_kernels_use_the_tensor_cores_of_their_target(built):
    missing = []
    for (label, arch, kernel, hot), report, error in built:
        if not hot or error is not None:
            continue
        sass = _sass_or_skip(report["path"])
        want = TENSOR_CORE[arch]
        if not any(w in sass for w in want):
            missing.append(f"{label} {arch}: none of {want}")
        if "LDL" in sass or "STL" in sass:
            missing.append(f"{label} {arch}: local memory traffic (LDL/STL)")
    assert not missing, "\n".join(missing)


def test_hopper_gemm_and_attention_issue_hgmma(built):
    """The Hopper GEMM and the attention (MLA decode, demo size) run on warpgroup MMA.  Only
    these builds are disassembled (cuobjdump takes ~0.4 s of CPU a cubin, and no other build's SASS
    bears on the assertion)."""
    want = {"gemm", "gemm_nt", "scores_softmax", "mla_decode[demo]", "m_grouped_gemm_nt_contiguous[demo]"}
    found = {label for (label, arch, kernel, hot), report, error in built
             if arch == "sm_90a" and label in want and error is None and "HGMMA" in _sass_or_skip(report["path"])}
    assert found == want


def test_hopper_fp8_grouped_gemm_issues_native_fp8_wgmma(built):
    """The fp8 grouped GEMM (demo) runs e4m3 wgmma on its fp8 tiles: QGMMA, no bf16 HGMMA and no
    fp8 -> bf16 shadow conversion (F2FP.*.E4M3 unpacks)."""
    (report,) = [r for (label, arch, _, _), r, e in built
                 if label == "m_grouped_fp8_gemm_nt_contiguous[demo]" and arch == "sm_90a"]
    sass = _sass_or_skip(report["path"])
    assert "QGMMA" in sass and "HGMMA" not in sass and "E4M3.UNPACK" not in sass


TMA_KERNELS = {"gemm", "gemm_nt", "mla_decode[demo]", "mla_decode[small]", "m_grouped_gemm_nt_contiguous[demo]",
               "m_grouped_gemm_nt_masked[demo]", "m_grouped_fp8_gemm_nt_contiguous[demo]"}


def test_pipelined_copies_are_async(built):
    """sm_80 pipelines use cp.async (LDGSTS); sm_90a ones load through TMA (UTMALDG) and
    wait on mbarriers (SYNCS), with no cp.async left in the GEMMs."""
    seen = set()
    for (label, arch, kernel, hot), report, error in built:
        if label == "gemm" and arch == "sm_80":
            assert "LDGSTS" in _sass_or_skip(report["path"])  # cp.async
        if label in TMA_KERNELS and arch == "sm_90a":
            sass = _sass_or_skip(report["path"])
            assert "UTMALDG" in sass and "SYNCS" in sass, label
            if label.startswith(("gemm", "m_grouped")):
                assert "LDGSTS" not in sass, label
            seen.add(label)
    assert seen == TMA_KERNELS


def test_hopper_cp_async_fallback_variant_compiles():
    """The variant a launch falls back to when its tensors break TMA's alignment rules."""
    kernel = gemm(512, 512, 512, bm=128, bn=128, bk=32, stages=3, threads=128).ir
    report = cuda_backend.build_report(kernel, "sm_90a", tma=False)
    assert not (report["spill_stores"] or report["spill_loads"] or report["local_bytes"])
    sass = _sass_or_skip(report["path"])
    assert "LDGSTS" in sass and "UTMALDG" not in sass and "HGMMA" in sass


def test_build_report_shape():
    report = cuda_backend.build_report(gemm().ir, "sm_80")
    assert set(report) == {"path", "arch", "registers", "shared_bytes", "spill_stores", "spill_loads", "local_bytes",
                           "advisories"}
    assert 0 < report["registers"] <= 255
    assert report["shared_bytes"] == render_cuda(gemm().ir, "sm_80").dynamic_smem
