"""Histogram atomics in a T.Parallel map on CUDA: warp-aggregated through kf::hist_add_warp
when the shape fits (1-D int32 shared tile, constant increment), plain atomics otherwise;
both against numpy on host emulation, with sizes that are not a multiple of the block."""
import numpy as np
import pytest
import torch

import kernforge
import kernforge.dsl as T
from kernforge.codegen.render.cuda import render_cuda


def histogram(n, bins, threads, step, runtime_value=False):
    @T.prim_func
    def kf_test_histogram(keys: T.Tensor((n,), "int32"), limit: T.int32, out: T.Tensor((bins,), "int32")):
        with T.Kernel(1, threads=threads) as bx:
            k_s = T.alloc_shared((n,), "int32")
            hist = T.alloc_shared((bins,), "int32")
            T.copy(keys[0], k_s)
            T.clear(hist)
            for i in T.Parallel(n):
                if k_s[i] < limit:
                    T.atomic_add(hist[k_s[i] % bins], (k_s[i] % 3) if runtime_value else step)
            T.copy(hist, out[0])
    return kf_test_histogram


@pytest.mark.parametrize("n,threads,step,runtime_value,aggregated", [
    (1000, 96, 1, False, True),     # n not a multiple of the block; 3 warps
    (77, 64, 5, False, True),       # fewer keys than the block
    (500, 64, 1, True, False),      # per-element increments: plain atomics
])
def test_histogram_on_cuda_emu(n, threads, step, runtime_value, aggregated):
    bins = 32
    kernel = histogram(n, bins, threads, step, runtime_value)
    src = render_cuda(kernel.ir, "sm_80").source
    assert ("kf::hist_add_warp(" in src) == aggregated
    g = torch.Generator().manual_seed(n)
    # skewed: most keys share a few bins, so warps hold many equal digits
    keys = torch.where(torch.rand(n, generator=g) < 0.7, torch.randint(0, 3, (n,), generator=g) * 11,
                       torch.randint(0, 10_000, (n,), generator=g)).int()
    limit = 9_000
    out = torch.full((bins,), -1, dtype=torch.int32)
    kernforge.compile(kernel, backend="cuda-emu", arch="sm_80")(keys, limit, out)
    k = keys.numpy()
    sel = k[k < limit]
    weights = (sel % 3) if runtime_value else np.full(sel.shape, step)
    np.testing.assert_array_equal(out.numpy(), np.bincount(sel % bins, weights=weights, minlength=bins).astype(np.int32))
