"""Loading the official checkpoint layout: names, FP8/FP4 formats, dequantized or kept quantized."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from kernforge.model import Transformer, load_checkpoint, random_model, tiny
from kernforge.model.primitives import Linear

from ._helpers import tokens
from ._official_checkpoint import write_official_checkpoint


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("v4_tiny")
    source = random_model(tiny(), seed=21)
    expected = write_official_checkpoint(source.state_dict(), folder)
    return folder, expected


def _fresh():
    return Transformer(tiny())


def test_every_tensor_loads_to_the_dequantized_value(checkpoint):
    folder, expected = checkpoint
    model = load_checkpoint(_fresh(), folder)
    state = model.state_dict()
    assert set(state) == set(expected)
    for name, value in expected.items():
        assert torch.equal(state[name].to(value.dtype), value), name
    # The quantized tensors really are lossy: FP4 experts differ from their source values.
    src = random_model(tiny(), seed=21).state_dict()
    assert not torch.equal(src["layers.0.ffn.experts.0.w1.weight"], state["layers.0.ffn.experts.0.w1.weight"])


def test_loaded_model_runs_like_a_model_given_the_dense_values(checkpoint):
    folder, expected = checkpoint
    loaded = load_checkpoint(_fresh(), folder)
    reference = _fresh()
    reference.load_state_dict(expected)
    ids = tokens(2, 40, 22)
    assert torch.equal(loaded(ids), reference(ids))


def test_keep_quantized_stores_checkpoint_bytes_and_gives_identical_logits(checkpoint):
    folder, expected = checkpoint
    quant = load_checkpoint(_fresh(), folder, keep_quantized=True)
    dense = load_checkpoint(_fresh(), folder)
    exp0 = quant.layers[3].ffn.experts[5].w2
    assert exp0.format == "fp4" and exp0.weight.dtype == torch.int8 and exp0.weight.shape == (tiny().hidden_size, 64)
    wq = quant.layers[1].attn.wq_b
    assert wq.format == "fp8" and wq.weight.dtype == torch.float8_e4m3fn and wq.scale.shape == (3, 1)
    assert quant.head.format is None
    for name, mod in quant.named_modules():
        if isinstance(mod, Linear) and mod.format:
            assert torch.equal(mod.dense_weight(), expected[f"{name}.weight"]), name
    ids = tokens(2, 40, 23)
    assert torch.equal(quant(ids), dense(ids))
    assert set(quant.state_dict()) >= {"layers.1.attn.wq_b.scale", "mtp.0.e_proj.scale"}


def test_v3_era_spellings_load_the_same(tmp_path):
    source = random_model(tiny(), seed=24)
    expected = write_official_checkpoint(source.state_dict(), tmp_path, prefix="model.",
                                         scale_suffix="weight_scale_inv", shards=3)
    model = load_checkpoint(_fresh(), tmp_path)
    for name, value in expected.items():
        assert torch.equal(model.state_dict()[name].to(value.dtype), value)


def test_fp8_experts_when_expert_dtype_is_none(tmp_path):
    cfg = tiny(expert_dtype=None)
    expected = write_official_checkpoint(random_model(cfg, seed=25).state_dict(), tmp_path, fp4_experts=False)
    model = load_checkpoint(Transformer(cfg), tmp_path, keep_quantized=True)
    w1 = model.layers[2].ffn.experts[3].w1
    tiles = (-(-cfg.moe_intermediate_size // 128), -(-cfg.hidden_size // 128))  # 128 x 128 tiles
    assert w1.format == "fp8" and w1.scale.shape == tiles
    assert torch.equal(w1.dense_weight(), expected["layers.2.ffn.experts.3.w1.weight"])
    with pytest.raises(TypeError, match="int8"):  # an FP8 expert checkpoint is not an FP4 one
        load_checkpoint(Transformer(tiny()), tmp_path)


def _single_file(checkpoint, tmp_path, edit):
    folder, _ = checkpoint
    tensors = {}
    for f in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    edit(tensors)
    save_file(tensors, str(tmp_path / "one.safetensors"))
    return tmp_path / "one.safetensors"


@pytest.mark.parametrize("edit, error, match", [
    (lambda t: t.pop("layers.2.attn.compressor.ape"), KeyError, "compressor.ape"),
    (lambda t: t.pop("layers.0.attn.wq_a.scale"), KeyError, "wq_a.scale"),
    (lambda t: t.update({"layers.9.attn.attn_sink": torch.zeros(4)}), ValueError, "match nothing"),
    (lambda t: t.update({"layers.0.attn.wkv.weight": torch.zeros(96, tiny().hidden_size, dtype=torch.bfloat16)}),
     TypeError, "float8_e4m3fn"),
    (lambda t: t.update({"norm.weight": torch.zeros(255, dtype=torch.bfloat16)}), ValueError, "shape"),
    (lambda t: t.update({"layers.0.ffn.gate.tid2eid": torch.full((512, 2), 8)}), ValueError, "expert ids"),
    (lambda t: t.update({"layers.0.attn.wkv.scale": t["layers.0.attn.wkv.scale"].repeat(1, 2)}), ValueError,
     "scale shape"),
])
def test_bad_checkpoints_raise_clear_errors_and_leave_the_model_untouched(checkpoint, tmp_path, edit, error,
                                                                          match):
    path = _single_file(checkpoint, tmp_path, edit)
    model = random_model(tiny(), seed=26)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(error, match=match):
        load_checkpoint(model, path, keep_quantized=True)
    after = model.state_dict()
    assert set(after) == set(before) and all(torch.equal(after[k], before[k]) for k in before)


def test_index_json_names_the_shards(checkpoint):
    folder, _ = checkpoint
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert index["weight_map"]["layers.1.attn.indexer.wq_b.scale"].startswith("model-0000")
    assert index["weight_map"]["layers.0.ffn.experts.7.w3.weight"].endswith("-of-00002.safetensors")


def test_v4_flash_key_counts_match_the_official_index():
    # Spec §4: non-expert keys per block are 29 (ratio 0), 33 (ratio 128), 40 (ratio 4) and
    # 39 for mtp.0, plus 6 per routed expert (weight + scale for w1, w2, w3).
    from kernforge.model import official_format, v4_flash
    from kernforge.model.block import Block
    from kernforge.model.transformer import MTPBlock, rope_tables

    c = v4_flash(max_seq_len=128)
    plain, yarn = rope_tables(c)
    counts = {}
    with torch.device("meta"):
        for layer, cls in ((1, Block), (2, Block), (3, Block), (43, MTPBlock)):
            block = cls(layer, c, yarn if c.compress_ratios[layer] else plain)
            names = list(block.state_dict())
            scales = [n for n, m in block.named_modules() if isinstance(m, Linear) and official_format(n, "fp4")]
            expert = [n for n in names + scales if n.startswith("ffn.experts.")]
            counts[layer] = (len(names) + len(scales) - len(expert), len(expert))
    assert counts == {1: (29, 1536), 2: (40, 1536), 3: (33, 1536), 43: (39, 1536)}
