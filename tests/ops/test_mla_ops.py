"""flash_mla_with_kvcache: FlashMLA's call forms, results against the torch reference,
and typed errors for bad input before any kernel runs."""
import math

import pytest
import torch

from kernforge.kernels import mla_decode as M
from kernforge.ops import mla
from tests.conftest import host_backends

BACKENDS = host_backends("interp", "cpu")


def make(seqlens, heads=16, s_q=1, h_kv=1, d=576, page=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    kv, table = M.make_cache(seqlens, page, h_kv, d, g)
    q = torch.randn(len(seqlens), s_q, heads, d, generator=g).bfloat16()
    return q, kv, table, torch.tensor(seqlens, dtype=torch.int32)


def check(out, lse, q, kv, table, lens, sink, scale, causal, dim_v=512):
    exp_out, exp_lse = M.reference(q, kv, table, lens, sink, scale, dim_v, causal)
    tol_out, tol_lse = M.tolerances(q, kv, scale, int(lens.max()), dim_v)
    M.assert_close(out, lse, exp_out, exp_lse, tol_out, tol_lse)


@pytest.mark.parametrize("backend", BACKENDS)
def test_current_api_with_sched_meta(backend):
    q, kv, table, lens = make([100, 1, 64])
    meta, none = mla.get_mla_metadata()
    assert none is None and not meta.have_initialized
    out, lse = mla.flash_mla_with_kvcache(q, kv, table, lens, 512, meta, backend=backend)
    assert out.shape == (3, 1, 16, 512) and out.dtype == torch.bfloat16
    assert lse.shape == (3, 16, 1) and lse.dtype == torch.float32
    check(out, lse, q, kv, table, lens, None, 576 ** -0.5, False)
    assert meta.have_initialized and meta.config["h_q"] == 16
    # the same meta with another shape is refused, as FlashMLA does
    q2, kv2, table2, lens2 = make([5], heads=32)
    with pytest.raises(ValueError, match="inconsistent with sched_meta"):
        mla.flash_mla_with_kvcache(q2, kv2, table2, lens2, 512, meta, backend=backend)


def test_causal_mtp_sink_and_scale():
    q, kv, table, lens = make([70, 2], heads=8, s_q=2)
    sink = torch.randn(8)
    out, lse = mla.flash_mla_with_kvcache(q, kv, table, lens, 512, None, softmax_scale=0.07,
                                          causal=True, attn_sink=sink, backend="interp")
    check(out, lse, q, kv, table, lens, sink, 0.07, True)


def test_legacy_forms_are_accepted():
    q, kv, table, lens = make([10])
    legacy_meta, legacy_splits = torch.zeros(4, 8, dtype=torch.int32), torch.zeros(2, dtype=torch.int32)
    out, lse = mla.flash_mla_with_kvcache(q, kv, table, lens, 512, legacy_meta, legacy_splits,
                                          backend="interp")
    check(out, lse, q, kv, table, lens, None, 576 ** -0.5, False)


def test_gqa_and_v4_head_dims():
    q, kv, table, lens = make([33, 17], heads=4, h_kv=2, d=512, page=16)
    out, lse = mla.flash_mla_with_kvcache(q, kv, table, lens, 512, backend="interp")
    check(out, lse, q, kv, table, lens, None, 512 ** -0.5, False)


def test_zero_length_request():
    q, kv, table, lens = make([0, 3], heads=2)
    out, lse = mla.flash_mla_with_kvcache(q, kv, table, lens, 512, backend="interp")
    assert torch.all(out[0] == 0) and torch.all(torch.isposinf(lse[0]))
    check(out, lse, q, kv, table, lens, None, 576 ** -0.5, False)


def test_config_choice():
    assert mla.choose_config("cpu", 16, 1, 2, 576, 512, 64, True)["block_H"] == 32
    assert mla.choose_config("cuda", 16, 1, 1, 576, 512, 64, False)["block_H"] == 64
    assert mla.choose_config("cpu", 128, 1, 1, 576, 512, 64, False)["block_H"] == 64
    assert mla.choose_config("cpu", 4, 1, 1, 576, 512, 48, False)["block_N"] == 16
    assert mla.choose_config("cpu", 4, 1, 1, 576, 512, 64, False)["block_N"] == 64
    assert mla.choose_config("cuda", 4, 1, 1, 576, 512, 64, False)["block_N"] == 32


@pytest.mark.parametrize("mutate, error, match", [
    (lambda a: a.update(q=a["q"].float()), TypeError, "bfloat16"),
    (lambda a: a.update(q=a["q"][0]), ValueError, r"q must be \[batch"),
    (lambda a: a.update(k_cache=a["k_cache"].half()), TypeError, "k_cache dtype"),
    (lambda a: a.update(k_cache=a["k_cache"][..., :64]), ValueError, r"q's head dim d = 576 .* must "
     r"equal k_cache's 64"),
    (lambda a: a.update(k_cache=a["k_cache"][0]), ValueError, r"k_cache must be \[num_blocks"),
    (lambda a: a.update(head_dim_v=600), ValueError, "head_dim_v"),
    (lambda a: a.update(block_table=a["block_table"].long()), ValueError, "block_table must be int32"),
    (lambda a: a.update(cache_seqlens=a["cache_seqlens"][:1]), ValueError, "cache_seqlens must be int32"),
    (lambda a: a.update(cache_seqlens=torch.tensor([500, 3], dtype=torch.int32)), ValueError, r"in \[0, 128\]"),
    (lambda a: a.update(cache_seqlens=torch.tensor([-1, 3], dtype=torch.int32)), ValueError, "cache_seqlens must be in"),
    (lambda a: a["block_table"].__setitem__((0, 0), 999), ValueError, "page ids outside"),
    (lambda a: a.update(attn_sink=torch.zeros(3)), ValueError, "attn_sink"),
    (lambda a: a.update(is_fp8_kvcache=True, k_cache=a["k_cache"].view(torch.uint8)),
     NotImplementedError, "sparse"),
    (lambda a: a.update(is_fp8_kvcache=True), TypeError, "is_fp8_kvcache=True, but k_cache is"),
    (lambda a: a.update(topk_length=torch.zeros(2, dtype=torch.int32)), ValueError, "only meaningful with indices"),
    (lambda a: a.update(num_splits=torch.zeros(3)), ValueError, "num_splits must be None"),
    (lambda a: a.update(tile_scheduler_metadata="x"), TypeError, "FlashMLASchedMeta"),
])
def test_bad_input_raises_before_launch(mutate, error, match):
    q, kv, table, lens = make([70, 3], heads=4)
    args = dict(q=q, k_cache=kv, block_table=table, cache_seqlens=lens, head_dim_v=512,
                tile_scheduler_metadata=mla.get_mla_metadata()[0])
    mutate(args)
    with pytest.raises(error, match=match):
        mla.flash_mla_with_kvcache(**args, backend="interp")


def test_unused_block_table_slots_are_not_validated():
    """FlashMLA fills slots past the sequence with garbage (2147480000); they are legal."""
    q, kv, table, lens = make([100, 3], heads=2)
    assert (table == M.UNUSED_BLOCK).any()
    mla.flash_mla_with_kvcache(q, kv, table, lens, 512, backend="interp")


def sparse_case(seed=0, b=2, s_q=2, heads=8, d=576, topk=40, page=64, num_blocks=3):
    g = torch.Generator().manual_seed(seed)
    kv = torch.randn(num_blocks, page, 1, d, generator=g).bfloat16()
    q = torch.randn(b, s_q, heads, d, generator=g).bfloat16()
    indices = torch.randint(0, num_blocks * page, (b, s_q, topk), generator=g, dtype=torch.int32)
    indices[0, 1, ::3] = -1                              # empty slots
    indices[1, 0] = -1                                   # a token with nothing to attend
    topk_length = torch.tensor([topk, topk - 7], dtype=torch.int32)
    indices[1, 1, topk - 7:] = 2**30                     # garbage past topk_length is ignored
    return q, kv, indices, topk_length


def test_sparse_indices_with_sink(backend="interp"):
    q, kv, indices, topk_length = sparse_case()
    sink = torch.randn(8)
    meta, _ = mla.get_mla_metadata()
    out, lse = mla.flash_mla_with_kvcache(q, kv, None, None, 512, meta, indices=indices,
                                          topk_length=topk_length, attn_sink=sink,
                                          backend=backend)
    assert meta.config["topk"] == 40
    exp_out, exp_lse = M.reference_sparse(q, kv.view(-1, 576), indices, topk_length, sink,
                                          576 ** -0.5, 512)
    tol_out, tol_lse = M.tolerances(q, kv, 576 ** -0.5, 40, 512)
    M.assert_close(out, lse, exp_out, exp_lse, tol_out, tol_lse)
    assert torch.all(out[1, 0] == 0) and torch.all(torch.isposinf(lse[1, :, 0]))


@pytest.mark.parametrize("mutate, error, match", [
    (lambda a: a.update(indices=a["indices"].long()), ValueError, "indices must be"),
    (lambda a: a["indices"].__setitem__((0, 0, 0), 3 * 64), ValueError, "token ids in"),
    (lambda a: a["indices"].__setitem__((0, 0, 1), -2), ValueError, "token ids in"),
    (lambda a: a.update(topk_length=torch.tensor([-1, 3], dtype=torch.int32)), ValueError, "topk_length"),
    (lambda a: a.update(causal=True), ValueError, "causal must be False"),
    (lambda a: a.update(k_cache=a["k_cache"].expand(3, 64, 2, 576).contiguous(), q=a["q"]),
     ValueError, "only MQA"),
])
def test_sparse_bad_input(mutate, error, match):
    q, kv, indices, topk_length = sparse_case()
    args = dict(q=q, k_cache=kv, block_table=None, cache_seqlens=None, head_dim_v=512,
                indices=indices, topk_length=topk_length)
    mutate(args)
    with pytest.raises(error, match=match):
        mla.flash_mla_with_kvcache(**args, backend="interp")


@pytest.mark.parametrize("backend", BACKENDS)
def test_split_kv_matches_reference(backend):
    """Forced split-KV + combine: more splits than some requests have tiles, an empty request,
    causal MTP and the sink (applied once, in the combine kernel)."""
    q, kv, table, lens = make([300, 5, 0], heads=4, s_q=2)
    sink = torch.randn(4)
    out, lse = mla.flash_mla_with_kvcache(q, kv, table, lens, 512, causal=True, attn_sink=sink,
                                          backend=backend, num_kv_splits=4)
    check(out, lse, q, kv, table, lens, sink, 576 ** -0.5, True)


def test_split_choice():
    cpu = torch.device("cpu")
    assert M.config.split_count("cpu", 1, 10_000, cpu) == 1               # host default: no split
    with pytest.raises(ValueError, match="num_kv_splits"):
        q, kv, table, lens = make([10], heads=2)
        mla.flash_mla_with_kvcache(q, kv, table, lens, 512, backend="interp", num_kv_splits=0)


def test_gpu_split_choice(monkeypatch):
    """On a 132-SM GPU: split until requests x row blocks x splits fill the SMs, keeping
    at least 4 KV tiles per split, at most 32 splits (no GPU needed: SM count stubbed)."""
    class Props:
        multi_processor_count = 132
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: Props())
    dev = torch.device("cpu")
    assert M.config.split_count("cuda", 1, 10_000, dev) == 32
    assert M.config.split_count("cuda", 128, 10_000, dev) == 2
    assert M.config.split_count("cuda", 132, 10_000, dev) == 1
    assert M.config.split_count("cuda", 1, 12, dev) == 2          # 2 splits of 6 tiles, not 4 of 3
    # the op's chooser counts requests x row blocks of 64 heads and the table's tiles of 32
    monkeypatch.setenv("KERNFORGE_TUNE", "0")
    cfg = mla.choose_config("cuda", 128, 1, 1, 576, 512, 64, False)
    assert mla.choose_splits("cuda", cfg, 64, 64, dev) == dict(cfg, num_splits=2)     # 128 blocks
    assert mla.choose_splits("cuda", cfg, 1, 6, dev)["num_splits"] == 2                # 12 tiles



@pytest.mark.parametrize("d_q", [500, 512, 640])
def test_q_with_the_wrong_head_dim_is_named(d_q):
    """A q whose last dimension differs from the cache's used to read "k_cache must be
    [..., <q's d>]", blaming the cache for q's mistake: the message names both."""
    q, kv, table, lens = make([20], heads=2)
    bad_q = torch.randn(1, 1, 2, d_q).bfloat16()
    with pytest.raises(ValueError, match=rf"q's head dim d = {d_q} \(q.shape\[3\].* must equal "
                                         r"k_cache's 576 \(k_cache.shape\[3\]") as info:
        mla.flash_mla_with_kvcache(bad_q, kv, table, lens, 512, backend="interp")
    assert not str(info.value).startswith("k_cache must be")


@pytest.mark.parametrize("backend", BACKENDS)
def test_sparse_fp8_v32_cache(backend):
    """FlashMLA's V3.2 FP8 cache ([blocks, page, 1, 656] bytes) on the sparse path: equal to
    attention over the dequantized (e4m3 x scale -> bf16) cache."""
    q, kv, indices, topk_length = sparse_case(seed=4)
    raw = M.quantize_kv_v32(kv.float() * 3)
    assert raw.shape == (3, 64, 1, 656) and raw.dtype == torch.uint8
    sink = torch.randn(8)
    out, lse = mla.flash_mla_with_kvcache(q, raw.view(torch.float8_e4m3fn), None, None, 512,
                                          indices=indices, topk_length=topk_length,
                                          is_fp8_kvcache=True, attn_sink=sink, backend=backend)
    deq = M.dequantize_kv_v32(raw).view(-1, 576)
    exp_out, exp_lse = M.reference_sparse(q, deq, indices, topk_length, sink, 576 ** -0.5, 512)
    tol_out, tol_lse = M.tolerances(q, deq, 576 ** -0.5, 40, 512)
    M.assert_close(out, lse, exp_out, exp_lse, tol_out, tol_lse)


def test_v32_quantizer_round_trip():
    """Power-of-two scales, e4m3 relative step 2^-3 of each 128-value tile's amax, RoPE exact."""
    x = torch.randn(5, 576) * torch.logspace(-2, 2, 576)
    raw = M.quantize_kv_v32(x)
    scales = raw[:, 512:528].contiguous().view(torch.float32)
    assert torch.equal(scales, torch.exp2(torch.round(torch.log2(scales))))
    back = M.dequantize_kv_v32(raw).float()
    step = scales.repeat_interleave(128, dim=1) * 448 * 2.0 ** -3
    assert ((back[:, :512] - x[:, :512]).abs() <= step + x[:, :512].abs() * 2.0 ** -8).all()
    assert torch.equal(back[:, 512:], x[:, 512:].bfloat16().float())


def test_sparse_fp8_bad_cache():
    q, kv, indices, topk_length = sparse_case()
    with pytest.raises(ValueError, match=r"\[num_blocks, page_block_size, h_kv, 656\]"):
        mla.flash_mla_with_kvcache(q, kv.view(torch.uint8)[..., :600], None, None, 512,
                                   indices=indices, is_fp8_kvcache=True, backend="interp")
    with pytest.raises(TypeError, match="holds bytes"):
        mla.flash_mla_with_kvcache(q, kv, None, None, 512, indices=indices, is_fp8_kvcache=True,
                                   backend="interp")


def test_cuda_devices_run_the_balanced_schedule_by_default(monkeypatch):
    """Where buffers live on a CUDA device the dense path runs FlashMLA's balanced schedule
    with FlashMLA's partition count (``config.sm_parts``) unless a uniform split is asked
    for; under CUDA-graph capture with no schedule recorded it cannot read the lengths and
    takes the uniform path.  Emulated here: the interpreter posing as a CUDA device."""
    from kernforge.kernels.mla_decode import config, schedule

    q, kv, table, lens = make([700, 3, 0, 2000], heads=8, d=96, page=16)
    monkeypatch.setattr(mla.backends, "device", lambda backend: "cuda")
    monkeypatch.setattr(config, "sm_parts", lambda cfg, device=None: 5)
    monkeypatch.setattr(config, "choose_splits", lambda backend, cfg, b, pages, device=None: dict(cfg, num_splits=2))
    meta, _ = mla.get_mla_metadata()
    out, lse = mla.flash_mla_with_kvcache(q, kv, table, lens, 64, meta, backend="interp")
    want_meta, want_splits = schedule.schedule([700, 3, 0, 2000], 5)
    assert torch.equal(meta.tile_scheduler_metadata, want_meta) and torch.equal(meta.num_splits, want_splits)
    assert meta.kv_splits is None and want_splits[-1] > 4          # some request was cut
    check(out, lse, q, kv, table, lens, None, 96 ** -0.5, False, dim_v=64)
    # an explicit uniform split wins, and is recorded as before
    meta2, _ = mla.get_mla_metadata()
    mla.flash_mla_with_kvcache(q, kv, table, lens, 64, meta2, backend="interp", num_kv_splits=2)
    assert meta2.kv_splits == 2 and meta2.tile_scheduler_metadata is None
    # capture without a recorded schedule: the uniform path (choose_splits), no host read
    monkeypatch.setattr(mla, "capturing", lambda t: True)
    meta3, _ = mla.get_mla_metadata()
    out3, lse3 = mla.flash_mla_with_kvcache(q, kv, table, lens, 64, meta3, backend="interp")
    assert meta3.tile_scheduler_metadata is None and meta3.kv_splits == 2
    check(out3, lse3, q, kv, table, lens, None, 96 ** -0.5, False, dim_v=64)
    # capture with the schedule recorded by an earlier call reuses it
    again, _ = mla.flash_mla_with_kvcache(q, kv, table, lens, 64, meta, backend="interp")
    assert torch.equal(again, out)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("h_kv,s_q,causal", [(2, 2, True), (1, 1, False)])
def test_balanced_schedule_gqa_and_mtp(backend, h_kv, s_q, causal):
    """The scheduled kernel's grid covers every latent head's row blocks (GQA) and the causal
    MTP mask across the pieces of a cut request."""
    q, kv, table, lens = make([333, 0, 1200, 17], heads=8, s_q=s_q, h_kv=h_kv, d=96, page=16, seed=5)
    sink = torch.randn(8)
    meta, _ = mla.get_mla_metadata()
    out, lse = mla.flash_mla_with_kvcache(q, kv, table, lens, 64, meta, causal=causal, attn_sink=sink,
                                          backend=backend, num_sm_parts=7)
    assert meta.num_splits[-1] > 4
    check(out, lse, q, kv, table, lens, sink, 96 ** -0.5, causal, dim_v=64)


def test_host_split_only_when_threads_would_idle(monkeypatch):
    """On a host the balanced schedule runs only when the batch's blocks leave threads of
    the team idle, with one partition per idle multiple; never in deterministic mode (the
    split follows the batch size, so a row's bits would follow its batch)."""
    from kernforge.backends.cpu.backend import CpuBackend
    from kernforge.kernels.mla_decode import config
    from kernforge.model import deterministic

    cfg = dict(heads=64, heads_kv=1, seq_q=1, block_H=64)
    assert config.host_parts(cfg, 1, 2) == 2 and config.host_parts(cfg, 1, 8) == 8
    assert config.host_parts(cfg, 2, 2) is None and config.host_parts(cfg, 1, 1) is None
    assert config.host_parts(dict(cfg, heads=128), 1, 2) is None  # two row blocks fill two threads
    assert config.host_parts(dict(cfg, heads=128), 1, 4) == 2

    q, kv, table, lens = make([900], heads=16, d=96, page=16, seed=3)
    monkeypatch.setattr(CpuBackend, "workers", lambda self: 4)
    meta, _ = mla.get_mla_metadata()
    out, lse = mla.flash_mla_with_kvcache(q, kv, table, lens, 64, meta, backend="cpu")
    assert meta.tile_scheduler_metadata.shape[0] == 4 and meta.num_splits[-1] > 1  # the one request was cut
    check(out, lse, q, kv, table, lens, None, 96 ** -0.5, False, dim_v=64)
    with deterministic():
        meta2, _ = mla.get_mla_metadata()
        out2, _ = mla.flash_mla_with_kvcache(q, kv, table, lens, 64, meta2, backend="cpu")
    assert meta2.tile_scheduler_metadata is None and meta2.kv_splits == 1
    monkeypatch.setattr(CpuBackend, "workers", lambda self: 1)
    assert torch.equal(mla.flash_mla_with_kvcache(q, kv, table, lens, 64, backend="cpu")[0], out2)
