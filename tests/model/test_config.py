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
        shell = Transformer(c.replace(num_hidden_layers=1, num_nextn_predict_layers=0, compress_ratios=(0,),
                                      num_hash_layers=0, n_routed_experts=6))  # for the outer tensors
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
    ({"rope_scaling": None}, "rope_scaling"),
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


def test_official_style_config_json_loads_strictly(tmp_path):
    # The key set of the published config.json (spec §1), including keys the reference ignores.
    ratios = [0, 0] + [4, 128] * 20 + [4, 0]
    official = {
        "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "torch_dtype": "bfloat16",
        "vocab_size": 129280, "hidden_size": 4096, "moe_intermediate_size": 2048, "num_hidden_layers": 43,
        "num_attention_heads": 64, "num_key_value_heads": 1, "n_routed_experts": 256, "n_shared_experts": 1,
        "num_experts_per_tok": 6, "first_k_dense_replace": 0, "max_position_embeddings": 1048576,
        "rms_norm_eps": 1e-6, "rope_theta": 10000, "q_lora_rank": 1024, "qk_rope_head_dim": 64,
        "head_dim": 512, "compress_ratios": ratios, "sliding_window": 128, "compress_rope_theta": 160000,
        "o_lora_rank": 1024, "o_groups": 8, "index_n_heads": 64, "index_head_dim": 128, "index_topk": 512,
        "num_hash_layers": 3, "hc_mult": 4, "hc_eps": 1e-6, "hc_sinkhorn_iters": 20, "swiglu_limit": 10.0,
        "routed_scaling_factor": 1.5, "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc",
        "norm_topk_prob": True, "hidden_act": "silu", "tie_word_embeddings": False, "bos_token_id": 0,
        "eos_token_id": 1, "num_nextn_predict_layers": 1, "expert_dtype": "fp4",
        "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                         "beta_fast": 32, "beta_slow": 1},
        "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                "scale_fmt": "ue8m0", "weight_block_size": [128, 128]},
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(official))
    assert ModelConfig.from_json(path) == v4_flash()
    assert ModelConfig.from_json(path, max_seq_len=8192).max_seq_len == 8192
