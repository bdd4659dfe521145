"""The MoE kernels build for Blackwell too (issue 14: CUDA for sm_90a and sm_100a), with nvcc and
no GPU.  tests/backends/test_cuda_compile.py builds the MoE GEMMs for sm_90a, sm_80 and sm_100a,
but the element-wise, routing, permutation and quantisation kernels once, for sm_90a (they use no
arch-specific instruction); this file adds their sm_100a builds, so every kernel tagged ``moe``
is known to compile for both targets.  The builds go through the runtime's cache, two at a time."""
from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest

from kernforge.backends.cuda import backend as cuda_backend
from kernforge.kernels import registry
from tests.backends.test_cuda_compile import _tensor_core_family

pytestmark = [pytest.mark.nvcc, pytest.mark.slow,
              pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")]


def _moe_specs():
    return {name: spec for name, spec in registry.all_specs().items() if "moe" in spec.tags}


def test_the_moe_kernels_are_the_ones_issue_14_names():
    """A guard on the selection below: a renamed tag would silently build nothing."""
    names = set(_moe_specs())
    assert {"moe_mapping_scan", "moe_mapping_scatter", "expand_to_fused", "reduce_fused", "swiglu",
            "top2_sum_gate", "topk_gate", "normalize_weight", "hash_gate", "per_token_cast_to_fp8",
            "per_block_cast_to_fp8", "per_token_cast_to_fp4", "m_grouped_fp8_fp4_gemm_nt_contiguous",
            "m_grouped_fp8_fp4_gemm_nt_masked"} <= names


def test_non_gemm_moe_kernels_build_for_sm_100a_without_local_memory():
    items = []
    for name, spec in sorted(_moe_specs().items()):
        kernel = spec.factory(**spec.problems["small"].params).ir
        if not _tensor_core_family(spec, kernel):   # the GEMMs: test_cuda_compile.py builds sm_100a
            items.append((name, kernel))
    assert len(items) >= 12

    def one(item):
        name, kernel = item
        try:
            return name, cuda_backend.build_report(kernel, "sm_100a"), None
        except Exception as e:  # noqa: BLE001 -- collected, reported together below
            return name, None, e

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(one, items))
    failures = [f"{name}: {error}" for name, _, error in results if error is not None]
    failures += [f"{name}: spills/stack {r}" for name, r, error in results
                 if error is None and (r["spill_stores"] or r["spill_loads"] or r["local_bytes"])]
    assert not failures, "\n".join(failures)
