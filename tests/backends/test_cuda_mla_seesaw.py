"""The seesaw's SASS (issue 21 item 4), from nvcc for the bench problem on sm_90a: FlashMLA's
shape in the instructions themselves, with no GPU.

* QK with N = 64 per warpgroup: every score wgmma is ``HGMMA.64x64x16`` (the loop as written
  gave ``64x16x16``: a 64 x 32 tile split over two warpgroups);
* each warpgroup's own probabilities are the A operand in registers (``HGMMA.64x256x16 R.., R..,
  gdesc``), the other warpgroup's come from shared memory (``gdesc`` A);
* one producer warpgroup with ``setmaxnreg``, named barriers of one warpgroup (128 threads), no
  serialized wgmma (C7519/C7520), no spills, within the 227 KB of shared memory;
* the output leaves by TMA stores, staged in the drained KV stages."""
import re
import shutil

import pytest

from kernforge.backends.cuda import backend as cuda_backend
from kernforge.kernels import registry

pytestmark = [pytest.mark.nvcc, pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")]


def test_bench_sass_has_the_seesaw_shape():
    spec = registry.get("mla_decode")
    params = spec.problems["bench"].params
    assert params["block_N"] == 64
    rep = cuda_backend.build_report(spec.factory(**params).ir, "sm_90a", report=True)
    assert rep["advisories"] == [] and rep["spill_stores"] == 0 and rep["spill_loads"] == 0
    assert rep["shared_bytes"] <= 227 * 1024
    text = cuda_backend.disassemble(rep["path"])
    hgmma = re.findall(r"HGMMA\.(\d+x\d+x\d+)\.F32\.BF16 (R\d+), (\S+?),", text)
    shapes = [s for s, _, _ in hgmma]
    assert shapes.count("64x64x16") == 36 and set(shapes) == {"64x64x16", "64x256x16"}   # 576 / 16 K steps
    register_a = [s for s, _, a in hgmma if s == "64x256x16" and a.startswith("R")]
    shared_a = [s for s, _, a in hgmma if s == "64x256x16" and a.startswith("gdesc")]
    assert len(register_a) == 4 and len(shared_a) == 8   # own tile (4 K steps); the two fold sites
    assert "USETMAXREG.DEALLOC" in text and "USETMAXREG.TRY_ALLOC" in text
    assert re.search(r"BAR\.SYNC\.DEFER_BLOCKING R\d+, 0x80", text)   # one warpgroup's named barrier
    # one wait per gemm site (the fold's product is waited for after the softmax: two), not per wgmma
    assert rep["sass"]["wgmma_depbar"] == 6
    assert rep["sass"]["tma_store"] > 0 and rep["sass"]["stg"] <= 2   # the TMA-store epilogue (+ the lse rows)
