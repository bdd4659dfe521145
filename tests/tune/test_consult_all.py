"""Every family's chooser consults the tuning database (:func:`kernforge.tune.consult.tuned`).

For each chooser/kernel pair: a recorded configuration is what the chooser returns for
the call it was recorded for, whatever the runtime sizes; not for another compile-time
shape, nor with ``KERNFORGE_TUNE=0``.  Some families go through a real sweep
(``kernforge.tune.tune`` on the CPU backend) and their public ops, which must compile
the database's best and still match a torch reference."""
import importlib
import json
import os
import subprocess
import sys

import pytest
import torch

import kernforge
import kernforge.tune as kt
from kernforge.kernels import registry
from kernforge.kernels.compressor import config as compressor
from kernforge.kernels.embedding import config as emb
from kernforge.kernels.gemm import config as gemm
from kernforge.kernels.grouped_gemm import config as gg
from kernforge.kernels.hadamard import config as had
from kernforge.kernels.hyper_connection import config as hc
from kernforge.kernels.indexer import config as indexer
from kernforge.kernels.kv_quant import config as kvq
from kernforge.kernels.mla_decode import config as mla
from kernforge.kernels.moe_permute import config as mp
from kernforge.kernels.norm import config as norm
from kernforge.kernels.quant import config as quant
from kernforge.kernels.rope import config as rope
from kernforge.kernels.routing import config as routing
from kernforge.kernels.swiglu import config as swiglu
from kernforge.kernels.topk import config as topk
from kernforge.tune import Database, Row, consult, sweep
from tests.conftest import host_backends

B = "cpu"
MAJORS = dict(a_major="k", b_major="k", gran_n=128)
# (chooser, positional arguments after the backend, keyword arguments, registry name); the
# keyword ``alignment`` is a call argument in the sweeps' keys, not a kernel parameter
CASES = [
    (emb.choose, (4096, "bfloat16", "int64"), {}, "embedding"),
    (gemm.choose, (384, 640, 200), dict(accumulate=False, out_dtype="bfloat16", **MAJORS), "fp8_gemm_nt"),
    (gemm.choose, (384, 640, 200), dict(accumulate=False, out_dtype="bfloat16"), "fp8_fp4_gemm_nt"),
    (gemm.choose_dense, (512, 128, 256), dict(a_major="k", b_major="k", accumulate=False, dtype="bfloat16",
                                              out_dtype="bfloat16"), "bf16_gemm_nt"),
    (gemm.choose_dense, (512, 128, 256), dict(a_major="k", b_major="k", accumulate=False, dtype="float32",
                                              out_dtype="float32"), "fp32_gemm_nt"),
    (gg.choose, (4, 256, 512), dict(alignment=128), "m_grouped_gemm_nt_contiguous"),
    (gg.choose_fp8, (4, 256, 256), dict(alignment=128), "m_grouped_fp8_gemm_nt_contiguous"),
    (gg.choose_fp8_fp4, (4, 256, 384), dict(alignment=128), "m_grouped_fp8_fp4_gemm_nt_contiguous"),
    (gg.choose_masked, (6, 512, 512, 64), {}, "m_grouped_gemm_nt_masked"),
    (gg.choose_fp8_masked, (6, 512, 512, 64), {}, "m_grouped_fp8_gemm_nt_masked"),
    (gg.choose_fp8_fp4_masked, (6, 512, 512, 64), {}, "m_grouped_fp8_fp4_gemm_nt_masked"),
    (had.choose, (128, "bfloat16"), {}, "hadamard"),
    (hc.choose_pre, (4, 4096, 20, "bfloat16", "float32"), {}, "hc_pre"),
    (hc.choose_head, (4, 4096, "bfloat16", "float32"), {}, "hc_head"),
    (hc.choose_post, (4, 4096, "bfloat16"), {}, "hc_post"),
    (mla.choose, (64, 1, 1, 576, 512, 64, False), {}, "mla_decode"),
    (mla.choose_sparse, (64, 512, 1, 512, 512, False), {}, "mla_decode_sparse"),
    (mla.choose_combine, (64, 4), {}, "mla_decode_combine"),
    # the split count, keyed on the batch and the table's width (those of the catalogue's "small")
    (mla.choose_splits, (mla.choose.heuristic(B, 8, 1, 2, 96, 64, 16, True), 2, 5), {}, "mla_decode_splitkv"),
    (mp.choose_mapping, (6, 256, 128), {}, "moe_mapping_scan"),
    (mp.choose_scatter, (6, 256, 128, 256), {}, "moe_mapping_scatter"),
    (mp.choose_expand, (2048, 6, "float8_e4m3", 16, "float32", True), {}, "expand_to_fused"),
    (mp.choose_reduce, (2048, 6, "bfloat16", "bfloat16", True, False, False), {}, "reduce_fused"),
    (norm.choose, (4096, "bfloat16", "float32", "bfloat16"), {}, "rms_norm"),
    (quant.choose_token, ("bfloat16", False), {}, "per_token_cast_to_fp8"),
    (quant.choose_token, ("bfloat16", True), {}, "per_token_cast_to_fp8_ue8m0"),
    (quant.choose_block, ("bfloat16", False), {}, "per_block_cast_to_fp8"),
    (quant.choose_fp4, ("bfloat16",), {}, "per_token_cast_to_fp4"),
    (quant.choose_fake_fp8, ("float32", 64), {}, "fake_quant_fp8"),
    (quant.choose_fake_fp4, (32,), {}, "fake_quant_fp4"),
    (compressor.choose, (512, 4, True, "float32"), {}, "compressor_pool"),
    (indexer.choose, (4, 64, "float32"), {}, "indexer_scores"),
    (kvq.choose_quantize, (448, 64, "float32"), {}, "fp8_kv_quantize"),
    (kvq.choose_dequantize, (448, 64, 64), {}, "fp8_kv_dequantize"),
    (rope.choose, (512, 64, "bfloat16", "int64", False), {}, "rotary_embedding"),
    (routing.choose_topk, (256, 6), {}, "topk_gate"),
    (routing.choose_top2_sum, (), dict(num_experts=256, num_topk=8, num_groups=8, num_topk_groups=4,
                                       scoring_func="sigmoid"), "top2_sum_gate"),
    (routing.choose_normalize, (8,), {}, "normalize_weight"),
    (routing.choose_hash, (256, 6, "sqrtsoftplus", True), {}, "hash_gate"),
    (swiglu.choose, (2048, "bfloat16", True, True), {}, "swiglu"),
    (topk.choose, (512, "float32", "int64", True, True), {}, "topk_fp32"),
    (topk.choose, (512, "bfloat16", "int32", False, True), {}, "topk_bf16"),
]
KEYED = ("alignment",)


@pytest.fixture(autouse=True)
def _db(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNFORGE_TUNE_DB", str(tmp_path / "tune.sqlite"))
    monkeypatch.delenv("KERNFORGE_TUNE", raising=False)
    consult.reset()
    yield tmp_path / "tune.sqlite"
    consult.reset()


def _factory(name):
    f = registry.get(name).factory
    return getattr(f, "factory", f)


def _record(name, params, config, median=0.5):
    """A finished one-point sweep of ``name`` at ``params`` (non-tunables, runtime sizes
    included) whose best is ``config``, written as ``tune`` writes it."""
    space = {k: [v] for k, v in config.items()}
    key = sweep.make_key(name, B, sweep.bind_params(_factory(name), params), space)
    with Database() as db:
        db.begin_sweep(key, space, "grid", {}, force=False)
        db.record(key, Row(config, "timed", median, 0.0, 3))
        db.finish_sweep(key)
    consult.reset()


def _tuned_case(chooser, args, kwargs, name):
    """(heuristic, keyed sweep parameters, a complete tuned config differing in one tunable
    that the chooser does not pin)."""
    factory = _factory(name)
    heuristic = chooser.heuristic(B, *args, **kwargs)
    sig = factory.signature.parameters
    config = {t: heuristic.get(t, sig[t].default) for t in factory.space}
    t = next(t for t in factory.space if t not in chooser.pinned and any(v != config[t] for v in factory.space[t]))
    config[t] = next(v for v in factory.space[t] if v != config[t])
    spec = registry.get(name)
    small = spec.problems["small"].params
    params = {k: v for k, v in heuristic.items() if k not in factory.space}
    # the runtime sizes of the catalogue's problem, as a real sweep records them (scalars only)
    params.update({k: small[k] for k in spec.runtime_sizes if k in small and isinstance(small[k], (int, float))})
    params.update({k: kwargs[k] for k in KEYED if k in kwargs})
    return heuristic, params, config


def _other_shape(params, factory):
    """``params`` with its first compile-time, non-tuned parameter changed."""
    for k, v in params.items():
        if k not in factory.signature.parameters or k in factory.space:
            continue
        if isinstance(v, bool):
            return dict(params, **{k: not v})
        if isinstance(v, int):
            return dict(params, **{k: v * 2})
        if isinstance(v, str) and "dtype" in k:
            return dict(params, **{k: "float32" if v != "float32" else "bfloat16"})
    raise AssertionError(f"no parameter to change in {params}")


@pytest.mark.parametrize("chooser, args, kwargs, name", CASES,
                         ids=[f"{c[3]}-{c[0].__name__}" for c in CASES])
def test_every_chooser_follows_the_database(monkeypatch, chooser, args, kwargs, name):
    heuristic, params, config = _tuned_case(chooser, args, kwargs, name)
    assert chooser(B, *args, **kwargs) == heuristic          # an empty database: the heuristic
    _record(name, _other_shape(params, _factory(name)), config)
    assert chooser(B, *args, **kwargs) == heuristic          # tuned for another shape: not used
    _record(name, params, config)
    got = chooser(B, *args, **kwargs)
    assert got == dict(heuristic, **config) and got != heuristic
    got["poison"] = 1                                        # callers get their own dict
    assert "poison" not in chooser(B, *args, **kwargs)
    monkeypatch.setenv("KERNFORGE_TUNE", "0")
    assert chooser(B, *args, **kwargs) == heuristic
    monkeypatch.delenv("KERNFORGE_TUNE")
    assert chooser(B, *args, **kwargs) == dict(heuristic, **config)


def test_every_chooser_is_covered():
    """Each chooser in kernforge/kernels/*/config.py is tuned and in CASES."""
    families = sorted(os.listdir(os.path.dirname(registry.__file__)))
    found = set()
    for fam in families:
        if not os.path.exists(os.path.join(os.path.dirname(registry.__file__), fam, "config.py")):
            continue
        mod = importlib.import_module(f"kernforge.kernels.{fam}.config")
        for attr, fn in vars(mod).items():
            if attr.startswith("choose") and callable(fn):
                assert hasattr(fn, "heuristic"), f"{fam}.config.{attr} does not consult the database"
                found.add(fn)
    assert found == {c[0] for c in CASES}


@pytest.mark.parametrize("chooser, k", [(gg.choose, 512), (gg.choose_fp8, 256), (gg.choose_fp8_fp4, 384)])
def test_a_tile_spanning_two_experts_is_refused(chooser, k):
    """A sweep verified one layout; at alignment 64 a 128-row tile could span two experts."""
    name = {gg.choose: "m_grouped_gemm_nt_contiguous", gg.choose_fp8: "m_grouped_fp8_gemm_nt_contiguous",
            gg.choose_fp8_fp4: "m_grouped_fp8_fp4_gemm_nt_contiguous"}[chooser]
    heuristic, params, config = _tuned_case(chooser, (4, 256, k), dict(alignment=64), name)
    assert heuristic["block_M"] == 64
    _record(name, params, dict(config, block_M=128))
    assert chooser(B, 4, 256, k, alignment=64) == heuristic
    _record(name, params, dict(config, block_M=32), median=0.1)
    assert chooser(B, 4, 256, k, alignment=64)["block_M"] == 32


def test_a_pinned_tunable_keeps_the_callers_value():
    """The scatter reads the scan's per-chunk offsets: a faster scatter row at another chunk
    is not used; the fastest row at the scan's chunk is."""
    heuristic, params, config = _tuned_case(mp.choose_scatter, (6, 256, 128, 256), {}, "moe_mapping_scatter")
    space = {"chunk": [64, 256], "tail_tile": [256, 1024]}
    key = sweep.make_key("moe_mapping_scatter", B, sweep.bind_params(_factory("moe_mapping_scatter"), params), space)
    with Database() as db:
        db.begin_sweep(key, space, "grid", {}, force=False)
        db.record(key, Row(dict(chunk=64, tail_tile=256), "timed", 0.1, 0.0, 3))
        db.record(key, Row(dict(chunk=256, tail_tile=1024), "timed", 0.3, 0.0, 3))
        db.record(key, Row(dict(chunk=256, tail_tile=256), "timed", 0.2, 0.0, 3))
        db.finish_sweep(key)
    consult.reset()
    assert mp.choose_scatter(B, 6, 256, 128, 256) == dict(heuristic, tail_tile=256)
    assert mp.choose_scatter(B, 6, 256, 128, 64) == dict(mp.choose_scatter.heuristic(B, 6, 256, 128, 64),
                                                         tail_tile=256)
    assert mp.choose_scatter(B, 6, 256, 128, 1024) == mp.choose_scatter.heuristic(B, 6, 256, 128, 1024)


def test_the_latest_sweep_wins_over_runtime_sizes():
    """Two sweeps of one compile-time shape at different row counts: the newer one's best."""
    shape = {k: v for k, v in norm.choose.heuristic(B, 96).items() if k not in ("block_rows", "threads")}
    _record("rms_norm", dict(shape, rows=5), dict(block_rows=1, threads=64))
    _record("rms_norm", dict(shape, rows=4096), dict(block_rows=8, threads=64))
    assert norm.choose(B, 96)["block_rows"] == 8


def test_bad_keys_are_a_typed_error_naming_the_argument():
    with pytest.raises(TypeError, match="has no argument 'alignmnet'"):
        consult.tuned("m_grouped_gemm_nt_contiguous", keys=("alignmnet",))(gg.choose.heuristic)
    with pytest.raises(TypeError, match="pinned: choose_scatter has no argument 'chunks'"):
        consult.tuned("moe_mapping_scatter", pinned=("chunks",))(mp.choose_scatter.heuristic)


def test_the_catalogue_does_not_move_with_the_database(tmp_path):
    """The problems use the heuristics (a fresh process imports every family with a tuned
    mla_decode for its "small" shape in the database, without recursing into the registry)."""
    spec = registry.get("mla_decode")
    small = dict(spec.problems["small"].params)
    res = kt.tune("mla_decode", backend=B, problem="small", space=dict(block_N=[8]), repeats=3, settle=0)
    assert res.best["block_N"] == 8
    code = ("import json; from kernforge.kernels import registry; from kernforge.kernels.mla_decode import config;"
            "p = registry.get('mla_decode').problems['small'].params;"
            "print(json.dumps([p['block_N'], config.choose('cpu', 8, 1, 2, 96, 64, 16, True)['block_N']]))")
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ), capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [small["block_N"], 8]


# ---------------------------------------------------------------- real sweeps, public ops


@pytest.fixture
def compiled(monkeypatch):
    """The parameters of every kernel the ops compile (their kernel caches emptied)."""
    layers, mla_ops = (importlib.import_module(m) for m in ("kernforge.ops.layers", "kernforge.ops.mla"))
    topk_ops = importlib.import_module("kernforge.ops.topk")
    caches = (layers._compiled_cached, mla_ops._compiled, topk_ops._compiled)
    seen, real = [], kernforge.compile

    def record(factory, backend="interp", **params):
        seen.append((getattr(factory, "name", None), params))
        return real(factory, backend=backend, **params)

    for c in caches:
        c.cache_clear()
    monkeypatch.setattr(kernforge, "compile", record)
    yield seen
    for c in caches:
        c.cache_clear()


def _compiled_with(seen, factory_name):
    return [p for n, p in seen if n == factory_name][-1]


@pytest.mark.parametrize("backend", host_backends("cpu"))
def test_tuned_rms_norm_op(compiled, backend):
    res = kt.tune("rms_norm", backend=backend, problem="small", space=dict(block_rows=[8]), repeats=3, settle=0)
    assert res.best["block_rows"] == 8 != norm.choose.heuristic(backend, 96)["block_rows"]
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(7, 96, generator=g), torch.randn(96, generator=g)   # 7 rows: the sweep ran 5
    out = kernforge.ops.rms_norm(x, w, 1e-6, backend=backend)
    params = _compiled_with(compiled, "rms_norm")
    assert {k: params[k] for k in res.best} == res.best
    xd = x.double()
    want = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", host_backends("cpu"))
def test_tuned_topk_op(compiled, backend):
    res = kt.tune("topk_fp32", backend=backend, problem="small", space=dict(tile=[512]), repeats=3, settle=0)
    assert res.best["tile"] == 512 != topk.choose.heuristic(backend, 16, "float32", "int64", True)["tile"]
    x = torch.randperm(4 * 900, generator=torch.Generator().manual_seed(5)).float().view(4, 900)  # distinct
    values, indices = kernforge.ops.topk(x, 16, sorted=True, backend=backend)
    params = _compiled_with(compiled, "topk_select")
    assert {k: params[k] for k in res.best} == res.best
    want = torch.topk(x, 16)
    assert torch.equal(values, want.values) and torch.equal(indices, want.indices)


@pytest.mark.parametrize("backend", host_backends("cpu"))
def test_topk_op_follows_a_sweep_recorded_after_its_first_call(compiled, monkeypatch, backend):
    """The op caches its kernel per call signature, keyed on :func:`consult.stamp`: a row
    recorded later in the same process, and ``KERNFORGE_TUNE=0`` after it, take effect on
    the next call."""
    args = (16, "float32", "int64", True, True)
    # the op passes its rows' length bucket (700 scores: the CPU's short-row configuration)
    heuristic, params, config = _tuned_case(topk.choose, args, dict(row=topk.row_bucket(700)), "topk_fp32")
    sig = _factory("topk_fp32").signature.parameters
    untuned = {t: heuristic.get(t, sig[t].default) for t in config}
    x = torch.randperm(3 * 700, generator=torch.Generator().manual_seed(9)).float().view(3, 700)  # distinct
    want = torch.topk(x, 16)

    def run():
        values, indices = kernforge.ops.topk(x, 16, sorted=True, backend=backend)
        assert torch.equal(values, want.values) and torch.equal(indices, want.indices)
        params = _compiled_with(compiled, "topk_select")
        return {t: params.get(t, sig[t].default) for t in config}

    assert run() == untuned
    _record("topk_fp32", params, config)
    assert run() == config != untuned
    monkeypatch.setenv("KERNFORGE_TUNE", "0")
    n = len(compiled)
    assert run() == untuned and len(compiled) == n + 1


@pytest.mark.parametrize("backend", host_backends("cpu"))
def test_tuned_mla_decode_op(compiled, backend):
    from kernforge.kernels import mla_decode as M

    res = kt.tune("mla_decode", backend=backend, problem="small", space=dict(block_N=[8]), repeats=3, settle=0)
    assert res.best["block_N"] == 8 != mla.choose.heuristic(backend, 8, 1, 2, 96, 64, 16, True)["block_N"]
    g = torch.Generator().manual_seed(0)
    seqlens = [30, 12, 3]                                    # the sweep ran [37, 5]
    kv, table = M.make_cache(seqlens, 16, 1, 96, g)
    q = torch.randn(3, 2, 8, 96, generator=g).bfloat16()
    lens = torch.tensor(seqlens, dtype=torch.int32)
    out, lse = kernforge.ops.flash_mla_with_kvcache(q, kv, table, lens, 64, causal=True, backend=backend)
    params = _compiled_with(compiled, "mla_decode")
    assert {k: params[k] for k in res.best} == res.best
    exp_out, exp_lse = M.reference(q, kv, table, lens, None, 96 ** -0.5, 64, causal=True)
    M.assert_close(out, lse, exp_out, exp_lse, *M.tolerances(q, kv, 96 ** -0.5, max(seqlens), 64))


@pytest.mark.parametrize("backend", host_backends("cpu"))
def test_tuned_mla_decode_combine_op(compiled, backend):
    """Forced split-KV: the combine kernel the op compiles is the database's best for its
    shape (the catalogue's "small": 12 heads, 3 splits, 2 query tokens, dim_v 64)."""
    from kernforge.kernels import mla_decode as M

    res = kt.tune("mla_decode_combine", backend=backend, problem="small", space=dict(block_R=[8]), repeats=3,
                  settle=0)
    assert res.best["block_R"] == 8 != mla.choose_combine.heuristic(backend, 12, 3, 2, 64)["block_R"]
    g = torch.Generator().manual_seed(4)
    seqlens = [70, 0, 41]
    kv, table = M.make_cache(seqlens, 16, 1, 96, g)
    q = torch.randn(3, 2, 12, 96, generator=g).bfloat16()
    sink, lens = torch.randn(12, generator=g), torch.tensor(seqlens, dtype=torch.int32)
    out, lse = kernforge.ops.flash_mla_with_kvcache(q, kv, table, lens, 64, attn_sink=sink, backend=backend,
                                                    num_kv_splits=3)
    params = _compiled_with(compiled, "mla_decode_combine")
    assert {k: params[k] for k in res.best} == res.best
    exp_out, exp_lse = M.reference(q, kv, table, lens, sink, 96 ** -0.5, 64)
    M.assert_close(out, lse, exp_out, exp_lse, *M.tolerances(q, kv, 96 ** -0.5, max(seqlens), 64))


# ---------------------------------------------------------------- split-KV counts

SPLIT_SHAPE = dict(heads=8, heads_kv=1, seq_q=2, dim=96, dim_v=64, page_size=16, causal=True)  # "small"'s


def _record_splits(rows, batch=2, pages=5):
    """A finished sweep of ``mla_decode_splitkv`` at the catalogue's "small" shape and host
    tiles, for ``batch`` requests over ``pages`` pages: ``rows`` maps a split count to its
    median."""
    params = dict(mla.choose.heuristic(B, **SPLIT_SHAPE), batch=batch, pages=pages)
    space = {"num_splits": sorted(rows)}
    key = sweep.make_key("mla_decode_splitkv", B, sweep.bind_params(_factory("mla_decode_splitkv"), params), space)
    with Database() as db:
        db.begin_sweep(key, space, "grid", {}, force=False)
        for n, ms in rows.items():
            db.record(key, Row(dict(num_splits=n), "timed", ms, 0.0, 3))
        db.finish_sweep(key)
    consult.reset()


@pytest.mark.parametrize("backend", host_backends("cpu"))
def test_tuned_split_count_op(compiled, monkeypatch, backend):
    """The op splits as the database's fastest recorded count for its shape, batch and table
    width says (the host heuristic never splits), and still matches the reference; another
    batch, ``KERNFORGE_TUNE=0``, an explicit ``num_kv_splits`` and a schedule object's
    ``kv_splits`` do not take it."""
    from kernforge.kernels import mla_decode as M
    from kernforge.ops import mla as mla_ops

    _record_splits({1: 0.5, 3: 0.1, 4: 0.3})
    g = torch.Generator().manual_seed(6)
    sink = torch.randn(8, generator=g)

    def run(seqlens, **kw):
        """The split count the op compiled its decode kernel with; checks its output."""
        kv, table = M.make_cache(seqlens, 16, 1, 96, g)
        q = torch.randn(len(seqlens), 2, 8, 96, generator=g).bfloat16()
        lens = torch.tensor(seqlens, dtype=torch.int32)
        mla_ops._compiled.cache_clear()
        del compiled[:]
        out, lse = kernforge.ops.flash_mla_with_kvcache(q, kv, table, lens, 64, causal=True, attn_sink=sink,
                                                        backend=backend, **kw)
        exp_out, exp_lse = M.reference(q, kv, table, lens, sink, 96 ** -0.5, 64, causal=True)
        M.assert_close(out, lse, exp_out, exp_lse, *M.tolerances(q, kv, 96 ** -0.5, max(seqlens), 64))
        n = _compiled_with(compiled, "mla_decode").get("num_splits", 1)
        if n > 1:
            assert _compiled_with(compiled, "mla_decode_combine")["num_splits"] == n
        return n

    assert mla.split_count(backend, 2, 5, None) == 1
    assert run([75, 33]) == 3                                # other lengths, the same 5-page table
    assert run([75, 33, 50]) == 1                            # 3 requests: not what was tuned
    assert run([75, 90]) == 1                                # a 6-page table: neither
    assert run([75, 33], num_kv_splits=2) == 2               # the caller's count wins
    meta, _ = kernforge.ops.get_mla_metadata()
    assert run([75, 33], tile_scheduler_metadata=meta) == 3 and meta.kv_splits == 3
    meta.kv_splits = 4                                       # the step's schedule wins over the database
    assert run([75, 33], tile_scheduler_metadata=meta) == 4
    meta.kv_splits = 0
    with pytest.raises(ValueError, match="tile_scheduler_metadata.kv_splits must be a positive int"):
        run([75, 33], tile_scheduler_metadata=meta)
    monkeypatch.setenv("KERNFORGE_TUNE", "0")
    assert run([75, 33]) == 1


def _first_split_only(self, q, kv, table, lens, sink, scale, out, lse):
    """A planted bug: split 0's partial as the answer, no combine."""
    b, s_q, h_q, _ = q.shape
    o_part = torch.empty(b, self.num_splits, s_q, h_q, out.shape[-1])
    lse_part = torch.empty(b, self.num_splits, h_q, s_q)
    self.split(q, kv, table, lens, sink, scale, o_part, lse_part)
    out.copy_(o_part[:, 0])
    lse.copy_(lse_part[:, 0])


@pytest.mark.parametrize("backend", host_backends("cpu"))
def test_split_count_sweep_verifies_the_merged_output(monkeypatch, backend):
    """``kernforge tune mla_decode_splitkv`` builds each count as the op runs it (split kernel,
    then the combine) and checks the merged output against the attention reference: every
    count passes, the winner is a consulted choice; with the merge left out (split 0's
    partial taken as the answer) the split counts are rejected as verify mismatches."""
    from kernforge.kernels.mla_decode import split_kv

    space = dict(num_splits=[1, 2, 4])                      # 4 of 5 tiles: one split empty
    res = kt.tune("mla_decode_splitkv", backend=backend, problem="small", space=space, repeats=2, settle=0)
    assert not res.rejected, [(r.config, r.reason) for r in res.rejected]
    assert sorted(r.config["num_splits"] for r in res.ranked if r.status == "timed") == [1, 2, 4]
    cfg = mla.choose.heuristic(backend, **SPLIT_SHAPE)
    assert mla.choose_splits(backend, cfg, 2, 5) == dict(cfg, **res.best)
    monkeypatch.setattr(split_kv.SplitKV, "__call__", _first_split_only)
    res = kt.tune("mla_decode_splitkv", backend=backend, problem="small", space=space, repeats=2, settle=0,
                  force=True)
    assert [r.config["num_splits"] for r in res.ranked if r.status == "timed"] == [1]
    assert sorted(r.config["num_splits"] for r in res.rejected) == [2, 4]
    assert all(r.reason.startswith("verify: ") for r in res.rejected), [r.reason for r in res.rejected]


@pytest.mark.nvcc
@pytest.mark.skipif(__import__("shutil").which("nvcc") is None, reason="nvcc not on PATH")
def test_split_count_fit_checks_both_launches(monkeypatch):
    """A split count's fit is its split kernel's and its combine's: at the "demo" shape the
    split kernel fits sm_90a and a combine of 16 rows per block (as a tuned one could be; the
    heuristic's 4 fit) spills, so the pair does not fit."""
    from kernforge.kernels.mla_decode import split_kv
    from kernforge.tune.fit import misfit

    heuristic = mla.choose_combine
    monkeypatch.setattr(mla, "choose_combine", lambda *a, **k: dict(heuristic(*a, **k), block_R=16))
    pair = split_kv.build("cuda-emu", dict(mla.choose.heuristic("cuda", 64, dim=576, dim_v=512), num_splits=4))
    split, combine = pair.launches
    assert misfit(split, "cuda", "sm_90a") is None
    assert misfit(combine, "cuda", "sm_90a").startswith("fit: ")
    assert misfit(pair, "cuda", "sm_90a") == misfit(combine, "cuda", "sm_90a")
