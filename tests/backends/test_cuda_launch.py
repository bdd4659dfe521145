"""The CUDA backend on a real GPU: build, launch through cuLaunchKernelEx, compare with torch.

Skipped with a reason on machines without an NVIDIA GPU (this repository's CI);
``benchmarks/gpu_check.py`` runs the full library on a GPU machine.
"""
from __future__ import annotations

import pytest
import torch

import kernforge
from kernforge.kernels import registry
from tests.backends.test_cuda_semantics import gemm, scores_softmax

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no NVIDIA GPU (torch.cuda.is_available() is False)")]


@pytest.mark.parametrize("trans_b", [False, True])
def test_gemm_matches_torch(trans_b):
    torch.manual_seed(0)
    M, N, K = 300, 260, 200
    k = kernforge.compile(gemm(M, N, K, bm=128, bn=128, bk=32, stages=3, trans_b=trans_b), backend="cuda")
    a = torch.randn(M, K, device="cuda").bfloat16()
    b = (torch.randn(N, K) if trans_b else torch.randn(K, N)).cuda().bfloat16()
    c = torch.full((M, N), float("nan"), device="cuda").bfloat16()
    k(a, b, c)
    ref = a.double() @ (b.double().T if trans_b else b.double())
    torch.testing.assert_close(c.double(), ref, atol=0.1, rtol=0.02)


def test_scores_softmax_matches_torch():
    torch.manual_seed(1)
    k = kernforge.compile(scores_softmax(), backend="cuda")
    q, kt = torch.randn(64, 64, device="cuda").bfloat16(), torch.randn(64, 64, device="cuda").bfloat16()
    p = torch.full((64, 64), float("nan"), device="cuda")
    k(q, kt, p)
    torch.testing.assert_close(p.double(), torch.softmax(q.double() @ kt.double().T, dim=1), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", sorted(registry.all_specs()))
def test_library_kernel_small_problem(name):
    spec = registry.get(name)
    params = spec.problems["small"].params
    k = kernforge.compile(spec.factory, backend="cuda", **params)
    inputs = spec.make_inputs(params, 0, "cuda")
    k(*inputs)
    spec.check([inputs[i] for i in spec.outputs], spec.reference(inputs, params), inputs, params)
