"""The persistent tile loop (``kernforge/backends/cuda/persistent.py``) builds for sm_90a
(warp-specialized wgmma) and sm_100a (tcgen05) with nvcc and no GPU, at the grouped and dense GEMMs'
production configuration (``config.L2_GROUP``), with no spills and no serialized wgmma, and
the SASS shows its shape: the block index is read only along x (the tile coordinates come from
the scheduler, not ``blockIdx.y/z``), and a backward branch encloses the K loop (the loop over
tiles around the main loop).  The launch side needs no compiler.  Correctness is checked on
cuda-emu (``tests/emu/test_persistent.py``)."""
from __future__ import annotations

import re
import shutil

import pytest

from kernforge.backends.cuda import backend as cuda_backend, persistent
from kernforge.backends.cuda.renderer import render_cuda
from kernforge.kernels.grouped_gemm import config
from kernforge.kernels.registry import all_specs

SPECS = all_specs()


def _have_cuobjdump() -> bool:
    try:
        return bool(cuda_backend.cuobjdump())
    except Exception:  # noqa: BLE001 - BackendError: neither on PATH nor as a wheel
        return False


nvcc = pytest.mark.skipif(shutil.which("nvcc") is None or not _have_cuobjdump(),
                          reason="nvcc or cuobjdump (PATH or the nvidia-cuda-cuobjdump wheel) missing")
MMA = re.compile(r"\b(HGMMA|QGMMA|UTC\w*MMA)\b")
BRANCH = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\d\s+)?BRA(?:\.U)?(?:\s+!?UP\d,)?\s+0x([0-9a-f]+)")


def _bench_kernel(name: str):
    params = SPECS[name].problems["bench"].params
    assert params["persistent"] == config.L2_GROUP, "the bench configuration is no longer persistent"
    return SPECS[name].factory(**params).ir


def _loops(sass: str) -> list[tuple[int, int]]:
    """(target, branch address) of every backward branch."""
    out = []
    for m in BRANCH.finditer(sass):
        at, target = int(m.group(1), 16), int(m.group(2), 16)
        if target < at:
            out.append((target, at))
    return out


def tile_loop_encloses_k_loop(sass: str) -> bool:
    """A backward branch whose span holds another backward branch whose span holds every MMA."""
    mmas = [int(re.search(r"/\*([0-9a-f]{4,})\*/", line).group(1), 16)
            for line in sass.splitlines() if MMA.search(line) and "/*" in line]
    if not mmas:
        return False
    loops = _loops(sass)
    k_loops = [(a, b) for a, b in loops if a <= min(mmas) and max(mmas) <= b]
    return any(a < ka and kb < b for a, b in loops for ka, kb in k_loops)


@nvcc
@pytest.mark.nvcc
@pytest.mark.parametrize("name, arch", [("m_grouped_gemm_nt_masked", "sm_90a"),
                                        ("m_grouped_fp8_gemm_nt_contiguous", "sm_100a"),
                                        ("bf16_gemm_nt", "sm_90a"), ("fp8_gemm_nt", "sm_100a")])
def test_builds_and_sass_has_the_tile_loop(name, arch):
    kernel = _bench_kernel(name)
    report = cuda_backend.build_report(kernel, arch, report=True)
    assert not (report["spill_stores"] or report["spill_loads"] or report["local_bytes"]) and not report["advisories"]
    sass = cuda_backend.disassemble(report["path"])
    assert "SR_CTAID.X" in sass and "SR_CTAID.Y" not in sass and "SR_CTAID.Z" not in sass
    assert tile_loop_encloses_k_loop(sass)
    mma = "mma_utc" if arch == "sm_100a" else "mma_hgmma"
    assert report["sass"][mma] > 0


def test_the_sass_check_tells_a_tile_loop_from_a_k_loop():
    """The SASS predicate on hand-made listings: a K loop alone is not a tile loop."""
    k_only = ("/*0100*/ HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ ;\n"
              "/*0110*/ @!P0 BRA 0x80 ;\n")
    nested = "/*0040*/ S2R R0, SR_CTAID.X ;\n" + k_only + "/*0200*/ BAR.SYNC.DEFER_BLOCKING 0x1, 0x80 ;\n" \
                                                          "/*0210*/ BRA 0x50 ;\n"
    assert not tile_loop_encloses_k_loop(k_only) and tile_loop_encloses_k_loop(nested)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a", "sm_80"])
def test_the_program_is_marked_persistent_only_when_asked(arch):
    kernel = _bench_kernel("m_grouped_gemm_nt_contiguous")
    program = render_cuda(kernel, arch)
    assert program.persistent and "kf::next_tile(" in program.source and "blockIdx.y" not in program.source
    assert "#include \"kf/persistent.cuh\"" in program.source
    plain = dict(SPECS["m_grouped_gemm_nt_contiguous"].problems["bench"].params, persistent=0)
    program = render_cuda(SPECS["m_grouped_gemm_nt_contiguous"].factory(**plain).ir, arch)
    assert not program.persistent and "next_tile" not in program.source


def test_gpu_launcher_takes_the_device_sm_count():
    """The GPU launcher launches min(#blocks, #SMs) CTAs on a 1-D grid (no GPU needed: a fake
    driver function records the launch)."""
    kernel = _bench_kernel("m_grouped_gemm_nt_masked")
    program = render_cuda(kernel, "sm_90a", tma=False)
    seen = {}

    class Function:
        def launch(self, values, grid, block, smem_bytes, tensor_maps=()):
            seen.update(grid=grid, block=block)

    launcher = cuda_backend.CudaLauncher(kernel, program, Function())
    launcher.sm_count = 132
    launcher._launch([], [], [], (32, 2, 32))
    assert seen == {"grid": (132,), "block": (program.threads,)}
    launcher._launch([], [], [], (2, 3, 4))
    assert seen["grid"] == (24,)
    assert persistent.DEFAULT_SM_COUNT["sm_90a"] == 132 and persistent.DEFAULT_SM_COUNT["sm_100a"] == 148


def test_plan_falls_back_where_ring_state_cannot_carry_over():
    """A release ring that thread 0 refills (no producer warpgroup), or a ``live_rows`` buffer the
    kernel writes, keep one CTA per block; a warp-specialized ring is planned."""
    import kernforge.dsl as T
    from types import SimpleNamespace

    kernel = _bench_kernel("m_grouped_gemm_nt_contiguous")
    ring = object()
    assert persistent.plan_persistent(kernel, {ring: []}, {ring}, None) is None
    ws = SimpleNamespace(rings=frozenset({ring}))
    assert persistent.plan_persistent(kernel, {ring: []}, {ring}, ws) == persistent.PersistentPlan(config.L2_GROUP)

    @T.prim_func
    def writes_rows(A: T.Tensor((2, 4, 8), "float32"), rows: T.Tensor((2,), "int32")):
        with T.Kernel(8, 4, 2, threads=32) as (bx, by, bz):
            T.persistent(2, live_rows=rows, block_rows=1)
            A[bz, by, bx] = 1.0
            rows[bz] = 0

    plan = persistent.parse(writes_rows.ir)
    assert plan.live is not None and plan.live.name == "rows" and plan.block_rows == 1
    assert persistent.plan_persistent(writes_rows.ir, {}, set(), None) is None


def test_host_backends_run_a_persistent_kernel_as_is():
    """The CPU backend (like the interpreter, tests/emu/test_persistent.py) runs every block of a
    kernel that asks for the persistent schedule, with the same result."""
    import kernforge

    spec = SPECS["m_grouped_gemm_nt_masked"]
    params = dict(spec.problems["small"].params, persistent=2)
    inputs = spec.make_inputs(params, 0, "cpu")
    kernel = kernforge.compile(spec.factory, backend="cpu", **params)
    kernel(*inputs)
    spec.check([inputs[i] for i in spec.outputs], spec.reference(inputs, params), inputs, params)
