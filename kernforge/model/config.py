"""`ModelConfig`: the DeepSeek-V4 hyper-parameters under their HF config.json names.

Field names are the keys of the official `config.json` (spec §1), so a config
loads with no renaming. A few fields are runtime choices that config.json does
not hold (cache capacity, deterministic numerics, QAT simulation, the
architecture variant); they are listed last with their defaults.

`variant` is the hook for the V4.1 family (spec §7): it is validated here and
only "v4" is built today; docs/model.md lists what "v4.1" would add.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCORING_FUNCS = ("sqrtsoftplus", "sigmoid", "softmax")
VARIANTS = ("v4",)
# config.json keys that carry no information this reference needs.
IGNORED_KEYS = frozenset({
    "architectures", "model_type", "torch_dtype", "dtype", "transformers_version",
    "auto_map", "hidden_act", "attention_bias", "attention_dropout", "initializer_range",
    "use_cache", "first_k_dense_replace", "n_group", "topk_group", "kv_lora_rank",
    "qk_nope_head_dim", "v_head_dim", "moe_layer_freq", "ep_size", "pretraining_tp",
})


@dataclass(frozen=True)
class RopeScaling:
    """YaRN parameters (`rope_scaling` in config.json); used by compressed layers only."""

    factor: float = 16.0
    original_max_position_embeddings: int = 65536
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    type: str = "yarn"

    def __post_init__(self) -> None:
        if self.type != "yarn":
            raise ValueError(f"rope_scaling.type must be 'yarn', got {self.type!r}")
        if self.factor < 1 or self.original_max_position_embeddings < 0:
            raise ValueError(f"invalid rope_scaling {self}")


@dataclass(frozen=True)
class QuantizationConfig:
    """How dense weights are stored: FP8 e4m3 with one E8M0 scale per block."""

    quant_method: str = "fp8"
    fmt: str = "e4m3"
    scale_fmt: str = "ue8m0"
    weight_block_size: tuple[int, int] = (128, 128)

    def __post_init__(self) -> None:
        if (self.quant_method, self.fmt, self.scale_fmt) != ("fp8", "e4m3", "ue8m0"):
            raise ValueError(f"only fp8/e4m3/ue8m0 block quantization is supported, got {self}")
        object.__setattr__(self, "weight_block_size", tuple(self.weight_block_size))


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_nextn_predict_layers: int
    num_attention_heads: int
    head_dim: int
    qk_rope_head_dim: int
    q_lora_rank: int
    o_groups: int
    o_lora_rank: int
    sliding_window: int
    compress_ratios: tuple[int, ...]
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    n_routed_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    num_hash_layers: int
    num_key_value_heads: int = 1
    n_shared_experts: int = 1
    scoring_func: str = "sqrtsoftplus"
    routed_scaling_factor: float = 1.5
    topk_method: str = "noaux_tc"
    norm_topk_prob: bool = True
    swiglu_limit: float = 10.0
    rope_theta: float = 10000.0
    compress_rope_theta: float = 160000.0
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    rms_norm_eps: float = 1e-6
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    max_position_embeddings: int = 1048576
    bos_token_id: int = 0
    eos_token_id: int = 1
    tie_word_embeddings: bool = False
    expert_dtype: str | None = "fp4"
    quantization_config: QuantizationConfig | None = field(default_factory=QuantizationConfig)
    # Runtime fields (not in config.json).
    max_batch_size: int = 4
    max_seq_len: int = 4096
    deterministic: bool = False
    fake_quant: bool = True  # QAT simulation: FP8 window/compressed KV, FP4 indexer q/k.
    variant: str = "v4"

    def __post_init__(self) -> None:
        object.__setattr__(self, "compress_ratios", tuple(int(r) for r in self.compress_ratios))
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "head_dim",
                     "qk_rope_head_dim", "q_lora_rank", "o_groups", "o_lora_rank", "sliding_window",
                     "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size", "hc_mult",
                     "hc_sinkhorn_iters", "max_batch_size", "max_seq_len", "index_topk"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        self._check(self.variant in VARIANTS,
                    f"variant {self.variant!r} is not built; supported: {VARIANTS} (see docs/model.md for v4.1)")
        self._check(isinstance(self.rope_scaling, RopeScaling), "rope_scaling must be a RopeScaling (YaRN) entry")
        self._check(self.num_key_value_heads == 1, "V4 attention has one shared KV head")
        self._check(self.n_shared_experts == 1, "V4 MoE has exactly one shared expert")
        self._check(not self.tie_word_embeddings, "V4 does not tie embed and head")
        self._check(self.scoring_func in SCORING_FUNCS, f"scoring_func must be one of {SCORING_FUNCS}")
        self._check(self.num_experts_per_tok <= self.n_routed_experts, "num_experts_per_tok > n_routed_experts")
        self._check(0 <= self.num_hash_layers <= self.num_hidden_layers, "num_hash_layers out of range")
        self._check(self.num_nextn_predict_layers >= 0, "num_nextn_predict_layers must be >= 0")
        self._check(len(self.compress_ratios) == self.num_hidden_layers + self.num_nextn_predict_layers,
                    "compress_ratios needs one entry per main layer and per MTP layer")
        self._check(all(r >= 0 for r in self.compress_ratios), "compress_ratios must be >= 0")
        self._check(all(r == 0 for r in self.compress_ratios[self.num_hidden_layers:]),
                    "MTP layers use sliding-window attention only (ratio 0)")
        self._check(all(r == 0 or self.max_seq_len % r == 0 for r in self.compress_ratios),
                    "max_seq_len must be a multiple of every compress ratio")
        self._check(self.qk_rope_head_dim % 2 == 0 and self.qk_rope_head_dim < self.head_dim,
                    "qk_rope_head_dim must be even and smaller than head_dim")
        self._check(self.num_attention_heads % self.o_groups == 0, "num_attention_heads % o_groups != 0")
        if 4 in self.compress_ratios:
            d = self.index_head_dim
            self._check(d & (d - 1) == 0 and d % 32 == 0 and d > self.qk_rope_head_dim,
                        "index_head_dim must be a power of two, a multiple of 32 and > qk_rope_head_dim")
            self._check(self.index_n_heads > 0, "index_n_heads must be positive")
        if self.fake_quant:
            self._check((self.head_dim - self.qk_rope_head_dim) % 64 == 0,
                        "fake_quant needs (head_dim - qk_rope_head_dim) % 64 == 0 (FP8 block 64)")
        if self.expert_dtype is not None:
            self._check(self.expert_dtype == "fp4", "expert_dtype must be 'fp4' or None (FP8 experts)")

    @staticmethod
    def _check(ok: bool, message: str) -> None:
        if not ok:
            raise ValueError(f"ModelConfig: {message}")

    # Derived quantities -------------------------------------------------------
    def is_hash_layer(self, layer_id: int) -> bool:
        return layer_id < self.num_hash_layers

    # Serialisation ------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: dict[str, Any], *, strict: bool = True, **runtime: Any) -> "ModelConfig":
        """Build from a config.json dict. Unknown keys raise unless strict=False."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names - IGNORED_KEYS)
        if unknown and strict:
            raise ValueError(f"unknown config.json keys {unknown}; pass strict=False to ignore them")
        kwargs = {k: v for k, v in data.items() if k in names}
        if isinstance(kwargs.get("rope_scaling"), dict):
            rs = dict(kwargs["rope_scaling"])
            rs.setdefault("type", rs.pop("rope_type", "yarn"))
            keep = {f.name for f in dataclasses.fields(RopeScaling)}
            kwargs["rope_scaling"] = RopeScaling(**{k: v for k, v in rs.items() if k in keep})
        if isinstance(kwargs.get("quantization_config"), dict):
            q = kwargs["quantization_config"]
            keep = {f.name for f in dataclasses.fields(QuantizationConfig)}
            kwargs["quantization_config"] = QuantizationConfig(**{k: v for k, v in q.items() if k in keep})
        kwargs.update(runtime)
        return cls(**kwargs)

    @classmethod
    def from_json(cls, path: str | Path, **kwargs: Any) -> "ModelConfig":
        return cls.from_dict(json.loads(Path(path).read_text()), **kwargs)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["compress_ratios"] = list(self.compress_ratios)
        if self.quantization_config is not None:
            out["quantization_config"]["weight_block_size"] = list(self.quantization_config.weight_block_size)
        return out

    def replace(self, **changes: Any) -> "ModelConfig":
        return dataclasses.replace(self, **changes)


def v4_flash(**runtime: Any) -> ModelConfig:
    """DeepSeek-V4-Flash at full size (spec §1). For shapes and counts, not for running on a CPU."""
    n_layers = 43
    ratios = (0, 0) + (4, 128) * 20 + (4,) + (0,)  # 43 main layers + the MTP layer
    return ModelConfig(
        vocab_size=129280, hidden_size=4096, num_hidden_layers=n_layers, num_nextn_predict_layers=1,
        num_attention_heads=64, head_dim=512, qk_rope_head_dim=64, q_lora_rank=1024, o_groups=8,
        o_lora_rank=1024, sliding_window=128, compress_ratios=ratios, index_n_heads=64,
        index_head_dim=128, index_topk=512, n_routed_experts=256, num_experts_per_tok=6,
        moe_intermediate_size=2048, num_hash_layers=3, **runtime,
    )


def tiny(**overrides: Any) -> ModelConfig:
    """The V4-Flash structure at CPU-test size (spec §6); keyword arguments override fields.

    Layer kinds: 0 sliding-window + hash routing, 1 ratio-4 with indexer + hash
    routing (like real layer 2), 2 ratio-128, 3 ratio-4 with scored routing,
    then the MTP layer (sliding window). Capacity: batch 8, 1024 tokens.

    Why each size: vocab 512 holds the byte tokenizer (256 bytes + the DeepSeek
    special tokens). hidden_size 128 is the smallest multiple of 128 (the FP8
    activation block of the GEMM inputs) and of 32 (the FP4 expert scale
    block); spec §6 proposes 256, halved here so that one 8 x 1024 forward
    stays well under a second on 2 CPU cores (issue 6 §1; the hidden size sets
    the GEMMs' inner dim and the size of the 4 hyper-connection copies).
    head_dim 96 = one FP8 block of 64 nope dims + 32 rope dims; 4 heads in
    o_groups=2 so the grouped output has several heads per group. Indexer: 4
    heads of 64 dims (a power of two, a multiple of 32, above the rope dims),
    top-8 of its entries. 8 experts, 2 per token, moe_intermediate_size 128 (a
    multiple of 128, for the FP4 -> FP8 recast). Window 16, so a 1024-token
    sequence crosses the window, 256 ratio-4 entries and 8 ratio-128 entries.
    """
    fields: dict[str, Any] = dict(
        vocab_size=512, hidden_size=128, num_hidden_layers=4, num_nextn_predict_layers=1,
        num_attention_heads=4, head_dim=96, qk_rope_head_dim=32, q_lora_rank=128, o_groups=2,
        o_lora_rank=64, sliding_window=16, compress_ratios=(0, 4, 128, 4, 0), index_n_heads=4,
        index_head_dim=64, index_topk=8, n_routed_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=128, num_hash_layers=2,
        rope_scaling=RopeScaling(factor=16.0, original_max_position_embeddings=65536),
        max_batch_size=8, max_seq_len=1024,
    )
    fields.update(overrides)
    return ModelConfig(**fields)
