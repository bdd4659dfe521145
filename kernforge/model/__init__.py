"""DeepSeek-V4-Flash reference model: the oracle for kernforge's generated kernels.

Read in spec order: config, numerics/quant/primitives, attention,
compressor (+ indexer), moe, block (hyper-connections), transformer (+ MTP),
then checkpoint loading, the byte tokenizer and the generate smoke path.
"""

from kernforge.model.checkpoint import load_checkpoint, official_format
from kernforge.model.config import ModelConfig, QuantizationConfig, RopeScaling, tiny, v4_flash
from kernforge.model.init import init_random_, random_model
from kernforge.model.numerics import deterministic, is_deterministic
from kernforge.model.tokenizer import ByteTokenizer
from kernforge.model.transformer import MTPBlock, Transformer, exact_rebuild_tail

__all__ = [
    "ByteTokenizer", "ModelConfig", "MTPBlock", "QuantizationConfig", "RopeScaling", "Transformer",
    "deterministic", "exact_rebuild_tail", "init_random_", "is_deterministic", "load_checkpoint", "official_format",
    "random_model", "tiny", "v4_flash",
]
