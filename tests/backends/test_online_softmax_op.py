"""``T.online_softmax``: the tile op against the eight primitive statements it replaces.

* interp and cpu run the op's expansion: bit-identical to the hand-written statements;
* cuda-emu runs ``kf::online_softmax_step`` on accumulator registers (and the row-wise
  helper when the scores are not an accumulator): matches the interpreter;
* the IR is printed, verified, and misuse is a typed error at the author's line.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import kernforge
import kernforge.dsl as T
from kernforge.codegen import ir
from kernforge.codegen.passes import run_pipeline
from kernforge.backends.cuda.renderer import render_cuda
from kernforge.codegen.verify import verify

LOG2E = math.log2(math.e)


def attention_steps(M=64, N=32, D=32, tiles=3, threads=256, fused=True):
    """Stream ``tiles`` key tiles: scores = Q K^T (masked by ``mask``), one online-softmax
    step each, and a running rescaled column sum of the probabilities (as P @ V would use
    them).  ``fused=False`` writes the step as the eight statements the op stands for."""

    @T.prim_func
    def kf_test_online_softmax(Q: T.Tensor((M, D), "bfloat16"), K: T.Tensor((tiles * N, D), "bfloat16"),
                               mask: T.Tensor((M, tiles * N), "int32"), scale: T.float32,
                               O: T.Tensor((M, N), "float32"), stats: T.Tensor((3, M), "float32")):
        with T.Kernel(1, threads=threads) as bx:
            Q_s = T.alloc_shared((M, D), "bfloat16")
            K_s = T.alloc_shared((N, D), "bfloat16")
            S = T.alloc_fragment((M, N), "float32")
            acc = T.alloc_fragment((M, N), "float32")
            m = T.alloc_fragment((M,), "float32")
            l = T.alloc_fragment((M,), "float32")
            r = T.alloc_fragment((M,), "float32")
            if not fused:
                m_prev = T.alloc_fragment((M,), "float32")
                row_sum = T.alloc_fragment((M,), "float32")
            scale_log2 = scale * LOG2E
            T.copy(Q[0, 0], Q_s)
            T.fill(acc, 0)
            T.fill(l, 0)
            T.fill(m, -T.infinity("float32"))
            for t in T.serial(tiles):
                T.copy(K[t * N, 0], K_s)
                T.gemm(Q_s, K_s, S, transpose_B=True, clear_accum=True)
                for i, j in T.Parallel(M, N):
                    S[i, j] = T.if_then_else(mask[i, t * N + j] != 0, S[i, j], -T.infinity("float32"))
                if fused:
                    T.online_softmax(S, m, l, r, scale_log2)
                else:
                    T.copy(m, m_prev)
                    T.reduce_max(S, m, dim=1, clear=False)
                    for i in T.Parallel(M):
                        shift = T.if_then_else(m[i] == -T.infinity("float32"), 0.0, m[i])
                        r[i] = T.exp2((m_prev[i] - shift) * scale_log2)
                    for i, j in T.Parallel(M, N):
                        shift = T.if_then_else(m[i] == -T.infinity("float32"), 0.0, m[i])
                        S[i, j] = T.exp2((S[i, j] - shift) * scale_log2)
                    T.reduce_sum(S, row_sum, dim=1)
                    for i in T.Parallel(M):
                        l[i] = l[i] * r[i] + row_sum[i]
                for i, j in T.Parallel(M, N):
                    acc[i, j] = acc[i, j] * r[i] + S[i, j]
            T.copy(acc, O[0, 0])
            for i in T.Parallel(M):
                stats[0, i] = m[i]
                stats[1, i] = l[i]
                stats[2, i] = r[i]
    return kf_test_online_softmax


def _inputs(M, N, D, tiles, seed):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(M, D, generator=g) * 2).bfloat16()
    k = (torch.randn(tiles * N, D, generator=g) * 2).bfloat16()
    mask = (torch.rand(M, tiles * N, generator=g) > 0.25).int()
    mask[1, :N] = 0          # a row masked in the first tile only
    mask[3] = 0              # a row that never sees a key: m = -inf, l = 0, no NaN
    k[N:N + 4] = k[N]        # tied scores
    out = torch.full((M, N), float("nan"))
    stats = torch.full((3, M), float("nan"))
    return [q, k, mask, 0.2, out, stats]


def _run(kernel, backend, inputs, arch=None):
    args = [a.clone() if isinstance(a, torch.Tensor) else a for a in inputs]
    kernforge.compile(kernel, backend=backend, arch=arch)(*args)
    return args[4], args[5]


def _bits(t):
    return t.view(torch.int32)


@pytest.mark.parametrize("backend", ["interp", "cpu"])
def test_expansion_is_bit_identical_to_the_statements_it_replaces(backend):
    shape = dict(M=32, N=16, D=32, tiles=3, threads=128)
    inputs = _inputs(shape["M"], shape["N"], shape["D"], shape["tiles"], seed=3)
    fused = _run(attention_steps(**shape, fused=True), backend, inputs)
    manual = _run(attention_steps(**shape, fused=False), backend, inputs)
    for a, b in zip(fused, manual):
        assert not torch.isnan(a).any()
        assert torch.equal(_bits(a), _bits(b))
    assert fused[1][1, 3] == 0 and fused[1][0, 3] == -math.inf


def _reference(inputs, M, N, tiles):
    """float64 statement of the streamed softmax (independent of the DSL)."""
    q, k, mask, scale = inputs[0].double(), inputs[1].double(), inputs[2], inputs[3]
    sl2 = scale * LOG2E
    m = torch.full((M,), -math.inf, dtype=torch.float64)
    l = torch.zeros(M, dtype=torch.float64)
    acc = torch.zeros(M, N, dtype=torch.float64)
    for t in range(tiles):
        s = q @ k[t * N:(t + 1) * N].T
        s = s.masked_fill(mask[:, t * N:(t + 1) * N] == 0, -math.inf)
        m_new = torch.maximum(m, s.max(1).values)
        shift = torch.where(m_new == -math.inf, 0.0, m_new)
        r = torch.exp2((m - shift) * sl2)
        p = torch.exp2((s - shift[:, None]) * sl2)
        l = l * r + p.sum(1)
        acc = acc * r[:, None] + p
        m = m_new
    return acc, torch.stack([m, l, r])


@pytest.mark.parametrize("arch,shape,helper", [
    ("sm_90a", dict(M=64, N=32, D=32, tiles=3, threads=256), "kf::online_softmax_step<1, 2, 4, 2, 8>"),
    ("sm_80", dict(M=32, N=16, D=32, tiles=2, threads=64), "kf::online_softmax_step<1, 2, 2, 1, 2>"),
    ("sm_80", dict(M=8, N=16, D=32, tiles=2, threads=64), "kf::online_softmax_row("),  # not an mma tile
])
def test_cuda_emu_helper_matches_interp_and_float64(arch, shape, helper):
    kernel = attention_steps(**shape)
    assert helper in render_cuda(kernel.ir, arch).source
    inputs = _inputs(shape["M"], shape["N"], shape["D"], shape["tiles"], seed=11)
    got = _run(kernel, "cuda-emu", inputs, arch)
    want = _run(kernel, "interp", inputs)
    ref = _reference(inputs, shape["M"], shape["N"], shape["tiles"])
    for g, w, r in zip(got, want, ref):
        assert not torch.isnan(g).any()
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(g.double().numpy(), r.numpy(), rtol=1e-4, atol=1e-5)


def test_only_cuda_keeps_the_op():
    k = attention_steps(M=32, N=16, threads=128).ir
    ops = lambda kern: [n for n in ir.walk(kern.body) if isinstance(n, ir.OnlineSoftmax)]  # noqa: E731
    assert len(ops(k)) == 1
    assert "online_softmax S max=m sum=l rescale=r" in repr(k)
    assert ops(run_pipeline(k, [])) == []                                # default: expanded
    assert len(ops(run_pipeline(k, [], native=(ir.OnlineSoftmax,)))) == 1
    src = render_cuda(k, "sm_90a").source
    assert '#include "kf/softmax.cuh"' in src and "exp2f" not in src      # no hand-expanded step left


def _trace(body):
    @T.prim_func
    def kf_bad(X: T.Tensor((16, 8), "float32"), Y: T.Tensor((16,), "float32")):
        with T.Kernel(1, threads=32) as bx:
            S = T.alloc_fragment((16, 8), "float32")
            m = T.alloc_fragment((16,), "float32")
            l = T.alloc_fragment((16,), "float32")
            r = T.alloc_fragment((16,), "float32")
            short = T.alloc_fragment((8,), "float32")
            ints = T.alloc_fragment((16,), "int32")
            body(locals())
    return kf_bad.ir


@pytest.mark.parametrize("call,message", [
    (lambda v: T.online_softmax(v["X"], v["m"], v["l"], v["r"], 1.0), "must be a shared or fragment tile"),
    (lambda v: T.online_softmax(v["S"], v["short"], v["l"], v["r"], 1.0), r"one value per row of S\(16, 8\)"),
    (lambda v: T.online_softmax(v["S"], v["ints"], v["l"], v["r"], 1.0), "row_max ints must be float32"),
    (lambda v: T.online_softmax(v["S"], v["m"], v["m"], v["r"], 1.0), "four distinct tiles"),
    (lambda v: T.online_softmax(v["m"], v["m"], v["l"], v["r"], 1.0), "must be 2-D"),
    (lambda v: T.online_softmax(v["S"], v["m"], v["l"], v["r"], v["bx"]), "scale_log2 must be a float"),
])
def test_misuse_is_a_typed_error_at_the_authors_line(call, message):
    with pytest.raises(ir.KernelError, match=message) as err:
        _trace(call)
    assert err.value.loc is not None and err.value.loc.file == __file__


def test_inside_parallel_is_rejected():
    def body(v):
        for i in T.Parallel(16):
            T.online_softmax(v["S"], v["m"], v["l"], v["r"], 1.0)
    with pytest.raises(ir.KernelError, match="inside T.Parallel"):
        _trace(body)


def test_verifier_rejects_a_malformed_op():
    k = attention_steps(M=32, N=16, threads=128).ir
    op = next(n for n in ir.walk(k.body) if isinstance(n, ir.OnlineSoftmax))
    bad = ir.OnlineSoftmax(op.scores, op.row_max, op.row_sum, ir.Buffer("g", (ir.const(32),), op.rescale.dtype,
                                                                      ir.Scope.GLOBAL), op.scale_log2)

    class Swap(ir.Mutator):
        def visit_OnlineSoftmax(self, s):
            return bad
    with pytest.raises(ir.KernelError, match="used out of scope|float32 shared/fragment"):
        verify(k.with_body(Swap().visit(k.body)))
