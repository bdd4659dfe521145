"""The dav-3510 (950) direct cube <-> vector hand-off: A and B go from the AIV's UB straight into
its half of the AIC's L1 (DataCopy Nd2Nz, UB -> L1) and the product from L0C straight into the
AIV's UB (Fixpipe L0C -> UB), the GM workspace keeping only the op words.  Results must match
float64 (bf16, half, float32, fp8), the GEMM library kernels must verify on the 950 shim, the
910B source must keep its GM workspace hand-off, the shim must refuse both paths on dav-c220
under their rules, and a missing cross-core wait on the direct path must stop the launch."""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
import torch

from kernforge import backends, cli
from kernforge.backends.ascend_emu import backend as emu
from kernforge.kernels.check import get_problem, run_spec
from kernforge.kernels.registry import get

from .test_ascend_cube import CASES, GROUPS, _build, _launch, _reference, two_gemms

TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
                "float8_e4m3": torch.float8_e4m3fn}


def _inputs(dtype: str, ta: bool, tb: bool, m: int, n: int, k: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(GROUPS * 2, *((k, m) if ta else (m, k)), generator=g).to(TORCH_DTYPES[dtype])
    b = torch.randn(GROUPS * 2, *((n, k) if tb else (k, n)), generator=g).to(TORCH_DTYPES[dtype])
    return a, b


def _render(dtype, ta, tb, m, n, k, arch):
    backend = backends.get("ascend-emu")
    return backend.render(two_gemms(dtype, ta, tb, m, n, k).ir, backend.target(arch))


# the CASES of test_ascend_cube (transposes, M and N off the fractal size, N = 4: scalar add of
# rows shorter than the product's 16-float pitch) plus fp8 e4m3 (K a multiple of 32)
DIRECT_CASES = CASES + [("float8_e4m3", False, True, 24, 48, 64)]


@pytest.mark.parametrize("dtype,ta,tb,m,n,k", DIRECT_CASES,
                         ids=["bf16_tn_m8", "f16_nn_m20_n24", "f32_nt_n4", "fp8_nt_m24_n48"])
def test_direct_gemms_match_float64(shim_cxx, dtype, ta, tb, m, n, k):
    program = _render(dtype, ta, tb, m, n, k, "dav-3510")
    assert program.direct_cv and "kf::gemm_direct<" in program.source and "kf::cube_gemm_direct<" in program.source
    assert "kf::gemm<" not in program.source and "kf::cube_gemm<" not in program.source
    assert program.workspace_group_bytes == 96  # done word + one op word per AIV: no A, B or C in GM
    kernel = two_gemms(dtype, ta, tb, m, n, k).ir
    a, b = _inputs(dtype, ta, tb, m, n, k, seed=3)
    d = _launch(_build(kernel, "dav-3510"), a, b, m, n)
    want = _reference(a, b, ta, tb)
    bound = 2 * k * 2.0 ** -23 * _reference(a.abs(), b.abs(), ta, tb) + 1e-30  # fp32 sums of exact products
    assert not torch.isnan(d).any()
    assert ((d.double() - want).abs() <= bound).all()


def test_910b_keeps_the_gm_workspace_hand_off():
    dtype, ta, tb, m, n, k = CASES[0]
    c220, c3510 = (_render(dtype, ta, tb, m, n, k, arch) for arch in ("dav-c220", "dav-3510"))
    assert not c220.direct_cv and "kf::gemm_direct" not in c220.source and "kf::cube_gemm<" in c220.source
    # [done][op | A | B | C fp32] per AIV on 910B, op words only on 950
    assert c220.workspace_group_bytes > 2 * (m * k * 2 + k * n * 2) > c3510.workspace_group_bytes


@pytest.mark.parametrize("name", ["bf16_gemm_nt", "m_grouped_gemm_nt_contiguous", "mla_decode", "fp8_gemm_nt"])
def test_library_gemm_kernels_verify_on_the_950_direct_path(shim_cxx, name):
    spec = get(name)
    kernel = spec.factory(**get_problem(spec, "small").params).ir
    program = backends.get("ascend").render(kernel, backends.get("ascend").target("dav-3510"))
    assert program.direct_cv and "kf::gemm_direct<" in program.source and "kf::cube_gemm<" not in program.source
    res = run_spec(spec, "ascend-emu", "small", repeat=1, seed=7, arch="dav-3510")
    assert res.verified, res.error
    assert res.label == "verified on the Ascend C CPU shim"


def test_build_reports_the_direct_hand_off(capsys, monkeypatch):
    monkeypatch.setenv("KERNFORGE_JIT_BISHENG", "/nonexistent/bisheng")
    assert cli.main(["build", "bf16_gemm_nt", "--backend", "ascend", "--problem", "small", "--arch", "dav-3510",
                     "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["cube hand-off"].startswith("direct: A, B UB -> L1")
    assert report["GM workspace"] == "96 bytes per group (op words only)"
    # block 32 x 64 x 64 bf16: each AIV's A (4 KiB) and B (8 KiB) in its half of L1
    assert report["L1 used"] == "24576 / 524288 bytes"
    # keyed by the gemm's source line in kernels/gemm/kernel.py, which moves with edits there
    (a_l1,) = [v for k, v in report.items() if k.startswith("L1 A_shared (T.gemm #1, line ") and k.endswith(") AIV 1")]
    assert a_l1.endswith("at 4096")
    assert cli.main(["build", "bf16_gemm_nt", "--backend", "ascend", "--problem", "small", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["cube hand-off"].startswith("GM workspace") and report["L1 used"] == "12288 / 524160 bytes"


# ---------------------------------------------------------------- planted bugs

# One MIX group: AIV 0 copies a UB tile into L1, the AIC Fixpipes L0C into AIV 0's UB; on
# dav-c220 each call must be refused under its rule, on dav-3510 the same program runs.
DIRECT_PROGRAM = r'''
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include "kernel_operator.h"

// KF_PATHS: "ub2l1", "fixpipe" or "both" (the calls this run makes)
static bool path(const char* p) {
  const std::string want = std::getenv("KF_PATHS");
  return want == "both" || want == p;
}

extern "C" __global__ __aicore__ void direct_paths(GM_ADDR) {
  KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
  AscendC::TPipe pipe;
  if ASCEND_IS_AIV {
    AscendC::TBuf<AscendC::TPosition::VECCALC> ub;
    pipe.InitBuffer(ub, 4096);
    AscendC::LocalTensor<half> l1;  // dav-c220: the AIV holds no L1 tensor at all
#if __NPU_ARCH__ == 3510
    AscendC::TBuf<AscendC::TPosition::A1> l1buf;
    pipe.InitBuffer(l1buf, 512);
    l1 = l1buf.Get<half>(256);
#endif
    AscendC::LocalTensor<half> a = ub.Get<half>(256);
    AscendC::Duplicate(a, half(1.0f), 256);
    AscendC::SetFlag<AscendC::HardEvent::V_MTE3>(0);
    AscendC::WaitFlag<AscendC::HardEvent::V_MTE3>(0);
    if (path("ub2l1") && AscendC::GetSubBlockIdx() == 0) AscendC::DataCopy(l1, a, AscendC::Nd2NzParams(1, 16, 16, 0, 16, 16, 1, 0));
    AscendC::CrossCoreSetFlag<2, PIPE_MTE3>(0);
    AscendC::CrossCoreWaitFlag(1);
    return;
  }
  AscendC::TBuf<AscendC::TPosition::CO1> l0c;
  pipe.InitBuffer(l0c, 1024);
  AscendC::LocalTensor<float> ub;  // dav-c220: the AIC holds no UB tensor at all
#if __NPU_ARCH__ == 3510
  AscendC::TBuf<AscendC::TPosition::VECIN> view;
  pipe.InitBuffer(view, 4096);
  ub = view.GetWithOffset<float>(256, 1024);
#endif
  AscendC::CrossCoreWaitFlag(0);
  AscendC::FixpipeParamsC310<AscendC::CO2Layout::ROW_MAJOR> fp(16, 16, 16, 16);
  if (path("fixpipe")) AscendC::Fixpipe<float, float, AscendC::CFG_ROW_MAJOR>(ub, l0c.Get<float>(), fp);
  AscendC::CrossCoreSetFlag<2, PIPE_FIX>(1);
}

int main() {
  std::vector<uint8_t> gm(32);
  kf_emu::GmScope scope({{gm.data(), gm.size(), "gm"}});
  const int rc = kf_emu::launch_mix(1, [&] { direct_paths(gm.data()); });
  std::printf("%s\n", rc ? kf_emu::last_error().c_str() : "OK");
  return 0;
}
'''


@pytest.fixture(scope="module")
def direct_program(shim_cxx, tmp_path_factory):
    src = tmp_path_factory.mktemp("direct") / "direct_paths.cpp"
    src.write_text(DIRECT_PROGRAM)
    exes = {}
    for arch in (2201, 3510):
        exes[arch] = str(src.with_name(f"direct_{arch}"))
        subprocess.run([shim_cxx, "-std=c++17", "-O0", "-pthread", f"-D__NPU_ARCH__={arch}", f"-I{emu.SHIM_INCLUDE_DIR}",
                        str(src), "-o", exes[arch]], check=True)

    def run(arch: int, paths: str) -> str:
        env = dict(os.environ, KF_PATHS=paths)
        return subprocess.run([exes[arch]], check=True, capture_output=True, text=True, env=env).stdout.strip()

    return run


def test_the_direct_paths_run_on_dav_3510(direct_program):
    assert direct_program(3510, "both") == "OK"


@pytest.mark.parametrize("paths, rule", [("ub2l1", "UB -> L1 copy"), ("fixpipe", "L0C -> UB Fixpipe")])
def test_the_direct_paths_are_refused_on_dav_c220(direct_program, paths, rule):
    out = direct_program(2201, paths)
    assert out.startswith(rule + "\x1f" + rule + ": not available on dav-c220"), out


def test_generated_direct_code_built_for_dav_c220_is_refused(shim_cxx, tmp_path):
    # plant: the 950 source (direct paths) built for 910B, the device library's 950-only helpers
    # let through: its AIV may not even carve L1
    dirs = _library_replacing(tmp_path, "#if __NPU_ARCH__ == 3510\n", "#if 1\n")
    dtype, ta, tb, m, n, k = CASES[2]
    kernel = two_gemms(dtype, ta, tb, m, n, k).ir
    program = _render(dtype, ta, tb, m, n, k, "dav-3510")
    module = emu.ShimModule(f"ascend_emu_direct_on_c220_{abs(hash(program.source))}", program.source, 2201, dirs)
    a, b = _inputs(dtype, ta, tb, m, n, k, seed=4)
    with pytest.raises(emu.AscendEmuError) as e:
        _launch(emu.EmuLauncher(kernel, module, program), a, b, m, n)
    # whichever core of the MIX group runs into 910B's memory map first names it: the AIV carving
    # L1 ("AIV has only UB") or the AIC touching UB ("AIC has no UB") -- thread order decides
    assert e.value.rule == "position", str(e.value)
    assert "AIV has only UB on dav-c220" in str(e.value) or "AIC has no UB on dav-c220" in str(e.value)


def _library_replacing(tmp_path, old: str, new: str):
    """The device library with `old` (once in kf/cube.h) replaced: a planted bug."""
    lib = tmp_path / "include"
    shutil.copytree(emu.INCLUDE_DIRS[0], lib)
    cube = lib / "kf" / "cube.h"
    text = cube.read_text()
    assert text.count(old) == 1, old
    cube.write_text(text.replace(old, new))
    return (str(lib), emu.SHIM_INCLUDE_DIR)


def test_a_missing_cross_core_wait_on_the_direct_path_is_caught(shim_cxx, tmp_path):
    # plant: the AIV reads the product without waiting for the AIC's answer
    dirs = _library_replacing(tmp_path, "  AscendC::CrossCoreWaitFlag(kCubeAck);  // the product is in `product`\n", "")
    dtype, ta, tb, m, n, k = CASES[0]
    kernel = two_gemms(dtype, ta, tb, m, n, k).ir
    a, b = _inputs(dtype, ta, tb, m, n, k, seed=5)
    with pytest.raises(emu.AscendEmuError) as e:
        _launch(_build(kernel, "dav-3510", include_dirs=dirs,
                       mutate=lambda s: s.replace("Generated by kernforge", "Generated by kernforge (no ack)")),
                a, b, m, n)
    assert e.value.rule == "cross-core missing wait", str(e.value)
