"""The radix-select steps on CUDA and everywhere else.

* Histogram atomics in a T.Parallel map: warp-aggregated through kf::hist_add_warp when
  the shape fits (1-D int32 shared tile, constant increment), plain atomics otherwise;
  both against numpy on host emulation, with sizes that are not a multiple of the block.
* ``T.radix_find_bucket``: a whole radix select written with the op and with the
  statements it stands for: bit-identical on interp and cpu, kf::radix_find_bucket on
  cuda-emu (its expansion for blocks that are not whole warps), all against numpy.
"""
import shutil

import numpy as np
import pytest
import torch

import kernforge
import kernforge.dsl as T
from kernforge.codegen import ir
from kernforge.backends.cuda.renderer import render_cuda


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


DIGITS = ((24, 8), (16, 8), (8, 8), (0, 8))


def radix_select(n, k, threads, fused=True):
    """The k-th largest of n uint32 keys, one 8-bit digit at a time; writes the key, the
    final ``need`` (how many keys equal to it are among the k largest) and the last bucket."""

    @T.prim_func
    def kf_test_radix_select(keys: T.Tensor((n,), "uint32"), kth: T.Tensor((1,), "uint32"),
                             out: T.Tensor((2,), "int32")):
        with T.Kernel(1, threads=threads) as bx:
            k_s = T.alloc_shared((n,), "uint32")
            prefix = T.alloc_var("uint32", 0)
            need = T.alloc_var("int32", k)
            bucket = T.alloc_var("int32", 0)
            T.copy(keys[0], k_s)
            for p, (shift, width) in enumerate(DIGITS):
                hist = T.alloc_shared((1 << width,), "int32")
                above = T.alloc_shared((1 << width,), "int32")
                T.clear(hist)
                for i in T.Parallel(n):
                    if p == 0:
                        T.atomic_add(hist[T.cast((k_s[i] >> shift) & 255, "int32")], 1)
                    elif (k_s[i] >> (shift + width)) == (prefix >> (shift + width)):
                        T.atomic_add(hist[T.cast((k_s[i] >> shift) & 255, "int32")], 1)
                if fused:
                    T.radix_find_bucket(hist, above, need, bucket)
                else:
                    reached = T.alloc_fragment((1 << width,), "int32")
                    nreached = T.alloc_fragment((1,), "int32")
                    T.cumsum(hist, above, reverse=True)
                    for b in T.Parallel(1 << width):
                        reached[b] = T.where(above[b] >= need, 1, 0)
                    T.reduce_sum(reached, nreached)
                    if nreached[0] < (1 << width):
                        need = need - above[nreached[0]]
                    bucket = nreached[0] - 1
                prefix = prefix | (T.cast(bucket, "uint32") << shift)
            kth[0] = prefix
            out[0] = need
            out[1] = bucket
    return kf_test_radix_select


def _keys(n, seed):
    g = np.random.default_rng(seed)
    keys = g.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    keys[: n // 3] = keys[n // 2]                             # many ties, at the k-th key too
    keys[n // 3: n // 2] = keys[n // 2] ^ np.uint32(1)         # differs only in the last digit
    return keys


def _select(kernel, backend, keys, arch=None):
    kth, out = torch.full((1,), 7, dtype=torch.uint32), torch.full((2,), -77, dtype=torch.int32)
    kernforge.compile(kernel, backend=backend, arch=arch)(torch.from_numpy(keys), kth, out)
    return int(kth[0]), out.tolist()


def _expected(keys, k):
    kth = np.sort(keys)[::-1][k - 1]
    return int(kth), [int(k - (keys > kth).sum()), int(kth & 255)]


@pytest.mark.parametrize("backend", ["interp", "cpu"])
def test_find_bucket_expansion_is_bit_identical(backend):
    n, k = 700, 300
    keys = _keys(n, 1)
    fused = _select(radix_select(n, k, 128), backend, keys)
    manual = _select(radix_select(n, k, 128, fused=False), backend, keys)
    assert fused == manual == _expected(keys, k)


@pytest.mark.parametrize("n,k,threads,native", [(1000, 1, 96, True), (1000, 377, 96, True), (333, 333, 48, False)])
def test_radix_select_on_cuda_emu(n, k, threads, native):
    kernel = radix_select(n, k, threads)
    src = render_cuda(kernel.ir, "sm_80").source
    assert ("kf::radix_find_bucket<" in src) == native       # 48 threads: not whole warps, expanded
    assert ("kf::hist_add_warp(" in src) == native
    keys = _keys(n, n + k)
    assert _select(kernel, "cuda-emu", keys, "sm_80") == _expected(keys, k)


def _trace(call):
    @T.prim_func
    def kf_bad(X: T.Tensor((16,), "int32")):
        with T.Kernel(1, threads=32) as bx:
            h = T.alloc_shared((16,), "int32")
            a = T.alloc_shared((16,), "int32")
            short = T.alloc_shared((8,), "int32")
            f = T.alloc_shared((16,), "float32")
            need = T.alloc_var("int32", 3)
            b = T.alloc_var("int32", 0)
            call(locals())
    return kf_bad.ir


@pytest.mark.parametrize("call,message", [
    (lambda v: T.radix_find_bucket(v["X"], v["a"], v["need"], v["b"]), "hist must be a shared or fragment tile"),
    (lambda v: T.radix_find_bucket(v["h"], v["short"], v["need"], v["b"]), "two distinct 1-D tiles of one shape"),
    (lambda v: T.radix_find_bucket(v["h"], v["h"], v["need"], v["b"]), "two distinct 1-D tiles of one shape"),
    (lambda v: T.radix_find_bucket(v["f"], v["a"], v["need"], v["b"]), "hist f must be int32"),
    (lambda v: T.radix_find_bucket(v["h"], v["a"], v["a"], v["b"]), "need must be a T.alloc_var"),
    (lambda v: T.radix_find_bucket(v["h"], v["a"], v["need"], v["need"]), "two variables"),
])
def test_find_bucket_misuse_is_a_typed_error(call, message):
    with pytest.raises(ir.KernelError, match=message) as err:
        _trace(call)
    assert err.value.loc is not None and err.value.loc.file == __file__


def test_find_bucket_prints_and_verifies():
    k = radix_select(64, 5, 32).ir
    assert "radix_find_bucket hist -> above need=need bucket=bucket" in repr(k)
    op = next(n for n in ir.walk(k.body) if isinstance(n, ir.RadixFindBucket))
    bad = ir.RadixFindBucket(op.hist, op.above, op.need, op.hist)

    class Swap(ir.Mutator):
        def visit_RadixFindBucket(self, s):
            return bad
    from kernforge.codegen.verify import verify
    with pytest.raises(ir.KernelError, match="must be a T.alloc_var"):
        verify(k.with_body(Swap().visit(k.body)))


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_radix_helpers_compile_to_match_any_without_spills():
    """nvcc: the aggregated histogram is a real MATCH.ANY, the find-bucket a real block step."""
    from kernforge.backends.cuda import backend as cuda_backend

    k = radix_select(1000, 377, 96).ir
    report = cuda_backend.build_report(k, "sm_90a")
    assert (report["spill_stores"], report["spill_loads"], report["local_bytes"]) == (0, 0, 0)
    code = cuda_backend.sass(k, "sm_90a")
    assert "MATCH.ANY" in code and "ATOMS" in code          # warp match + shared-memory atomics
