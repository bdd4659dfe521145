"""kernforge.tune.fit: a configuration that spills or overflows shared memory is named as a
misfit, a normal one is not, and backends with nothing to fit answer None.

The CUDA cases compile for sm_90a / sm_80 with nvcc (no GPU, no launch); the numbers in a
reason are checked against ptxas' own log, not against kernforge's parse of it.
"""
from __future__ import annotations

import os
import re
import shutil

import pytest

import kernforge
from kernforge.backends.cuda.backend import build_report
from kernforge.kernels import registry
from kernforge.tune import fit

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
GG = registry.get("m_grouped_gemm_nt_contiguous")
SIZES = dict(num_groups=4, N=256, K=512)
NORMAL = dict(block_M=64, block_N=64, block_K=64)
# a 128x256 fp32 accumulator over 128 threads is 256 registers per thread before anything else
SPILLS = dict(block_M=128, block_N=256, block_K=64)
# (256 + 256) x 128 bf16 per stage, three stages: 384 KB of tiles
HUGE_SMEM = dict(block_M=256, block_N=256, block_K=128, num_stages=3)


def _ptxas_log(kernel_ir, arch):
    """ptxas -v's text for the kernel's cache entry (beside the binary build_report names)."""
    path = build_report(kernel_ir, arch)["path"]
    return open(os.path.join(os.path.dirname(path), "build.log")).read()


@pytest.mark.nvcc
@needs_nvcc
def test_normal_config_fits_sm90a():
    assert fit.misfit(GG.factory(**SIZES, **NORMAL), "cuda") is None


@pytest.mark.nvcc
@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])
def test_spilling_config_is_a_misfit_with_ptxas_numbers(arch):
    kir = GG.factory(**SIZES, **SPILLS).ir
    why = fit.misfit(kir, "cuda", arch=arch)
    assert why is not None and why.startswith("fit: ") and arch in why
    stores = re.search(r"(\d+) bytes spill stores", _ptxas_log(kir, arch))
    assert stores and int(stores.group(1)) > 0
    assert f"{stores.group(1)} bytes spill stores" in why
    regs = re.findall(r"Used (\d+) registers", _ptxas_log(kir, arch))
    assert f"{regs[0]} registers" in why


@pytest.mark.nvcc
@needs_nvcc
def test_shared_memory_overflow_names_the_sizes():
    why = fit.misfit(GG.factory(**SIZES, **HUGE_SMEM), "cuda")
    tiles = (256 + 256) * 128 * 2 * 3  # bf16 A and B tiles, three stages
    found = re.fullmatch(r"fit: shared memory ([\d.]+) KB > 227 KB on sm_90a", why)
    assert found, why
    assert float(found.group(1)) * 1024 >= tiles


@pytest.mark.nvcc
@needs_nvcc
def test_cuda_emu_kernel_checked_against_a_real_cuda_compile():
    """A cuda-emu sweep has nothing to fit itself, but its IR can be screened for a GPU arch."""
    k = kernforge.compile(GG.factory, backend="cuda-emu", **SIZES, **SPILLS)
    assert fit.misfit(k, "cuda-emu") is None
    assert "spill stores" in fit.misfit(k, "cuda", arch="sm_90a")


@pytest.mark.parametrize("backend", ["cpu", "interp", "cuda-emu"])
def test_host_backends_have_nothing_to_fit(backend):
    assert fit.misfit(GG.factory(**SIZES, **SPILLS), backend) is None


def test_register_file_limit():
    """ptxas caps registers at the __launch_bounds__ budget, so this guards a report that
    somehow exceeds it: 255 registers round up to 8192 per warp, 16 warps need 131072."""
    report = dict(arch="sm_90a", registers=255, shared_bytes=0, spill_stores=0, spill_loads=0)
    assert fit.reason(report, 227 * 1024, 256) is None
    why = fit.reason(report, 227 * 1024, 512)
    assert why == "fit: 255 registers x 512 threads need 131072 > 65536 in the register file on sm_90a"
    assert fit.reason(dict(report, shared_bytes=300 * 1024), 227 * 1024, 128) == \
        "fit: shared memory 300.0 KB > 227 KB on sm_90a"


def test_bad_arguments_are_typed():
    with pytest.raises(TypeError, match="backend"):
        fit.misfit(GG.factory(**SIZES, **NORMAL), None)
    with pytest.raises(TypeError, match="kernel"):
        fit.misfit("not a kernel", "cuda")
