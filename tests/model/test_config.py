"""ModelConfig: official field names, presets, validation, and V4-Flash shapes."""

import dataclasses
import json

import pytest
import torch

from kernforge.model import ModelConfig, Transformer, tiny, v4_flash
from kernforge.model.block import Block
from kernforge.model.transformer import MTPBlock, rope_tables


def test_v4_flash_matches_the_published_config():
    c = v4_flash()
    assert (c.hidden_size, c.num_hidden_layers, c.vocab_size, c.num_attention_heads) == (4096, 43, 129280, 64)
    assert len(c.compress_ratios) == 44 and c.compress_ratios[:4] == (0, 0, 4, 128)
    assert c.compress_ratios[42:] == (4, 0)
    assert c.compress_ratios.count(4) == 21 and c.compress_ratios.count(128) == 20
    assert (c.index_topk, c.num_hash_layers, c.swiglu_limit, c.routed_scaling_factor) == (512, 3, 10.0, 1.5)


def test_v4_flash_parameter_count_is_284b():
    # Shapes only (meta device). One block per layer kind stands in for the 43 blocks; the
    # model card says 284B total parameters (spec §1: ~284.3B without MTP, ~291B with it).
    c = v4_flash(max_seq_len=128)
    with torch.device("meta"):
        shell = Transformer(c.replace(num_hidden_layers=1, compress_ratios=(0, 0), num_hash_layers=0))
        plain, yarn = rope_tables(c)
        kinds = {}
        for i, r in enumerate(c.compress_ratios):
            key = (r, c.is_hash_layer(i), i >= c.num_hidden_layers)
            if key not in kinds:
                block = (MTPBlock if key[2] else Block)(i, c, yarn if r else plain)
                kinds[key] = sum(p.numel() for p in block.parameters())
    per_layer = [kinds[(r, c.is_hash_layer(i), i >= c.num_hidden_layers)] for i, r in enumerate(c.compress_ratios)]
    outer = sum(p.numel() for n, p in shell.named_parameters() if not n.startswith(("mtp.", "layers.")))
    main = outer + sum(per_layer[:c.num_hidden_layers])
    assert 284.0e9 < main < 284.6e9
    assert 290.5e9 < main + per_layer[-1] < 291.5e9


def test_from_dict_round_trip_and_hf_spellings():
    c = tiny()
    data = json.loads(json.dumps(c.to_dict()))
    data["architectures"] = ["DeepseekV4ForCausalLM"]  # ignored key
    data["rope_scaling"] = {"rope_type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                            "beta_fast": 32, "beta_slow": 1}
    assert ModelConfig.from_dict(data) == c


def test_unknown_keys_raise_unless_not_strict():
    data = tiny().to_dict() | {"engram_layer_ids": [1]}
    with pytest.raises(ValueError, match="engram_layer_ids"):
        ModelConfig.from_dict(data)
    assert ModelConfig.from_dict(data, strict=False) == tiny()


@pytest.mark.parametrize("change, message", [
    ({"compress_ratios": (0, 4, 128, 4)}, "one entry per main layer"),
    ({"compress_ratios": (0, 4, 128, 4, 4)}, "MTP layers"),
    ({"num_key_value_heads": 2}, "one shared KV head"),
    ({"n_shared_experts": 2}, "exactly one shared expert"),
    ({"o_groups": 3}, "o_groups"),
    ({"index_head_dim": 48}, "power of two"),
    ({"head_dim": 80}, "FP8 block 64"),
    ({"scoring_func": "relu"}, "scoring_func"),
    ({"variant": "v4.1"}, "not built"),
    ({"max_seq_len": 1000}, "multiple of every compress ratio"),
    ({"hidden_size": 0}, "positive"),
])
def test_validation_rejects_inconsistent_configs(change, message):
    with pytest.raises(ValueError, match=message):
        tiny(**change) if "max_seq_len" in change else dataclasses.replace(tiny(), **change)


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        tiny().hidden_size = 8  # type: ignore[misc]


def test_tiny_has_every_layer_kind():
    c = tiny()
    kinds = {(r, c.is_hash_layer(i)) for i, r in enumerate(c.compress_ratios[:c.num_hidden_layers])}
    assert {(0, True), (4, True), (128, False), (4, False)} <= kinds
    assert c.num_nextn_predict_layers == 1 and c.max_batch_size >= 8 and c.max_seq_len >= 1024
