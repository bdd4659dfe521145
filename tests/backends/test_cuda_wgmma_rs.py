"""Register-A wgmma (kf/wgmma.cuh ``wgmma_m64nNk16_f32_bf16_rs``) and the accumulator-to-A packer
build for sm_90a with nvcc and no GPU.  The same device code tests/emu/test_wgmma_rs.py emulates:
in SASS the P*V ``HGMMA`` takes a register (``R..``) as its A operand where the shared-memory form
has a second descriptor (``gdesc[..]``), the packer is one ``F2FP.BF16.F32.PACK_AB`` per A register
with no local memory, and ptxas serializes nothing (no C7519/C7520).  One small build."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from kernforge.backends.cuda import backend as cuda_backend, sass_report
from kernforge.backends.cuda.renderer import INCLUDE_DIR
from tests.emu.test_wgmma_rs import KQ, NS, SOURCE

REGISTER_A = re.compile(r"^R\d+, R\d+, gdesc\[")  # D, A (a register), desc_b
SMEM_A = re.compile(r"^R\d+, gdesc\[UR\d+\], (RZ|R\d+)")  # D, desc_a, then the accumulator input


def _hgmma(k: sass_report.SassKernel, shape: str) -> list[sass_report.Instr]:
    return [i for i in k.instrs if i.opcode.startswith(f"HGMMA.{shape}.F32.BF16")]


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_register_a_wgmma_is_hgmma_with_a_register_operand(tmp_path):
    src, cubin = tmp_path / "rs.cu", tmp_path / "rs.cubin"
    src.write_text('#include <cstdint>\n#include "kf/common.cuh"\n' + SOURCE)
    proc = subprocess.run(["nvcc", "-O3", "-std=c++17", "-arch=sm_90a", "-cubin", "-Xptxas", "-v", f"-I{INCLUDE_DIR}",
                           "-o", str(cubin), str(src)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "C7519" not in proc.stderr and "C7520" not in proc.stderr, proc.stderr
    try:
        sass = cuda_backend.disassemble(str(cubin))
    except Exception as e:  # noqa: BLE001 - cuobjdump missing: the build checks above still ran
        pytest.skip(f"cuobjdump unavailable: {e}")
    kernels = {k.name: k for k in sass_report.parse(sass)}
    for name, nv, tnsp in [("rs_chain", 256, True), ("rs_chain_kmajor_v", 40, False)]:
        k = kernels[name]
        qk, pv = _hgmma(k, f"64x{NS}x16"), _hgmma(k, f"64x{nv}x16")
        # S = Q K^T: KQ/16 shared-memory wgmmas; P V: NS/16 register-A wgmmas, B transposed iff TRANS_B
        assert len(qk) == KQ // 16 and all(SMEM_A.match(i.operands) for i in qk), qk
        assert len(pv) == NS // 16 and all(REGISTER_A.match(i.operands) for i in pv), pv
        assert all((".tnspB" in i.operands) == tnsp for i in pv), pv
        c = sass_report.counts(k.instrs)
        assert c["f2fp"] == NS // 2 // 2, c  # one cvt.rn.bf16x2.f32 per packed register (NS/2 floats)
        assert (c["wgmma_arrive"], c["wgmma_depbar"]) == (2, 2), c  # one group each, nothing serialized
        assert not [i for i in k.instrs if i.base in ("LDL", "STL")], "the packed fragments spilled to local memory"
