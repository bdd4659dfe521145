"""The ops compile what their family's configuration chooser says (the chooser the
catalogue's problems use too): replace the chooser and the op's kernel changes."""
import importlib

import pytest
import torch

import kernforge
from kernforge.kernels import grouped_gemm as G
from kernforge.kernels import mla_decode as M
from kernforge.kernels.topk import config as topk_config
from kernforge.ops import grouped_gemm as gg_ops
from kernforge.ops import mla as mla_ops

topk_ops = importlib.import_module("kernforge.ops.topk")   # `kernforge.ops.topk` is also the op itself


@pytest.fixture
def compiled(monkeypatch):
    """Records the parameters of every kernel the ops compile; the ops' kernel caches are
    emptied before and after, so nothing compiled here leaks into other tests."""
    seen = []
    real = kernforge.compile

    def record(factory, backend="interp", **params):
        kernel = real(factory, backend=backend, **params)
        seen.append((getattr(factory, "name", None), kernel.ir.attrs, kernel.prim_func.artifact_name))
        return kernel

    caches = (topk_ops._compiled, mla_ops._compiled, gg_ops._compiled)
    for c in caches:
        c.cache_clear()
    monkeypatch.setattr(kernforge, "compile", record)
    yield seen
    for c in caches:
        c.cache_clear()


def test_topk_compiles_the_choosers_configuration(monkeypatch, compiled):
    x = torch.randn(2, 300)
    topk_ops.topk(x, 8, backend="interp")
    assert compiled[-1][1]["tile"] == topk_config.choose("interp", 8)["tile"] == 256
    default_name = compiled[-1][2]

    real = topk_config.choose
    monkeypatch.setattr(topk_config, "choose", lambda *a, **kw: dict(real(*a, **kw), tile=64, slack=64))
    topk_ops._compiled.cache_clear()
    v, i = topk_ops.topk(x, 8, backend="interp")
    assert compiled[-1][1]["tile"] == 64 and compiled[-1][1]["slack"] == 64
    assert compiled[-1][2] != default_name          # another specialisation, another artifact
    assert torch.equal(torch.sort(v, dim=1).values, torch.sort(torch.topk(x, 8).values, dim=1).values)


def test_mla_compiles_the_choosers_configuration(monkeypatch, compiled):
    g = torch.Generator().manual_seed(0)
    kv, table = M.make_cache([40, 9], 16, 1, 96, g)
    q = torch.randn(2, 1, 4, 96, generator=g).bfloat16()
    lens = torch.tensor([40, 9], dtype=torch.int32)
    real = M.config.choose
    monkeypatch.setattr(M.config, "choose", lambda *a, **kw: dict(real(*a, **kw), block_N=8))
    out, lse = mla_ops.flash_mla_with_kvcache(q, kv, table, lens, 64, backend="interp")
    name, attrs, _ = compiled[-1]
    assert name == "mla_decode" and attrs["block_N"] == 8 and attrs["block_H"] == 4
    exp_out, exp_lse = M.reference(q, kv, table, lens, None, 96 ** -0.5, 64)
    M.assert_close(out, lse, exp_out, exp_lse, *M.tolerances(q, kv, 96 ** -0.5, 40, 64))

    monkeypatch.setattr(M.config, "choose_combine", lambda *a, **kw: dict(block_R=2, heads=4, num_splits=2,
                                                                          seq_q=1, dim_v=64))
    mla_ops.flash_mla_with_kvcache(q, kv, table, lens, 64, backend="interp", num_kv_splits=2)
    assert compiled[-1][0] == "mla_decode_combine" and compiled[-1][1]["block_R"] == 2


def test_grouped_gemm_compiles_the_choosers_configuration(monkeypatch, compiled):
    g = torch.Generator().manual_seed(0)
    gg_ops.set_mk_alignment_for_contiguous_layout(32)
    try:
        m_indices = G.contiguous_layout([5, 30], 32)
        a = torch.randn(m_indices.numel(), 48, generator=g).bfloat16()
        b = torch.randn(2, 40, 48, generator=g).bfloat16()
        d = torch.empty(m_indices.numel(), 40, dtype=torch.bfloat16)
        real = G.config.choose
        monkeypatch.setattr(G.config, "choose", lambda *a, **kw: dict(real(*a, **kw), block_N=16, block_K=16))
        gg_ops.m_grouped_bf16_gemm_nt_contiguous(a, b, d, m_indices, backend="interp")
        attrs = compiled[-1][1]
        assert (attrs["block_M"], attrs["block_N"], attrs["block_K"]) == (32, 16, 16)
        expected = G.reference(a, b, m_indices)
        G.assert_close(d, expected, G.error_bound(a, b, m_indices, expected))
    finally:
        gg_ops.set_mk_alignment_for_contiguous_layout(128)
