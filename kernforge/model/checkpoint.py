"""Load the official DeepSeek-V4 safetensors layout (spec §3, §4).

The module tree of `Transformer` uses the checkpoint's own tensor names
(`layers.3.attn.wq_a.weight`, `mtp.0.e_proj.scale`, ...), so loading is a
direct match; `RENAMES` holds the few V3-era spellings that convert.py also
accepts. Quantized linears arrive as `<name>.weight` plus `<name>.scale`:
FP8 e4m3 with 128x128 E8M0 tiles, or (routed experts) FP4 e2m1 packed in
int8 with 1x32 E8M0 scales. They are dequantized into the dense parameters,
or, with keep_quantized=True, kept as stored and dequantized on use.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import safe_open

from kernforge.model.primitives import Linear
from kernforge.model.quant import dequantize_fp4, dequantize_fp8
from kernforge.model.transformer import Transformer

# Spellings of other DeepSeek checkpoints -> the V4 inference names.
RENAMES = {
    "self_attn": "attn",
    "mlp": "ffn",
    "weight_scale_inv": "scale",
    "e_score_correction_bias": "bias",
}
STRIP_PREFIX = "model."
# Official storage format of each linear (by the end of its module name); others are BF16.
FP8_LINEARS = ("attn.wq_a", "attn.wq_b", "attn.wkv", "attn.wo_a", "attn.wo_b", "attn.indexer.wq_b",
               "ffn.shared_experts.w1", "ffn.shared_experts.w2", "ffn.shared_experts.w3", "e_proj", "h_proj")
ROUTED_EXPERT = re.compile(r"ffn\.experts\.\d+\.w[123]$")
STORAGE_DTYPES = {"fp8": torch.float8_e4m3fn, "fp4": torch.int8}


def official_format(module_name: str, expert_dtype: str | None) -> str | None:
    """'fp8', 'fp4' or None (BF16/F32) for the linear `module_name` in the official checkpoint."""
    if ROUTED_EXPERT.search(module_name):
        return "fp4" if expert_dtype == "fp4" else "fp8"
    if module_name.endswith(FP8_LINEARS):
        return "fp8"
    return None


def canonical_name(name: str) -> str:
    if name.startswith(STRIP_PREFIX):
        name = name[len(STRIP_PREFIX):]
    return ".".join(RENAMES.get(part, part) for part in name.split("."))


def checkpoint_files(path: str | Path) -> list[Path]:
    """Shards named by model.safetensors.index.json, every *.safetensors in a folder, or one file."""
    path = Path(path)
    if path.is_file():
        return [path]
    index = path / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [path / f for f in sorted(set(weight_map.values()))]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no safetensors checkpoint at {path}")
    return files


def read_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for file in checkpoint_files(path):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                key = canonical_name(name)
                if key in tensors:
                    raise ValueError(f"tensor {key} appears twice in the checkpoint")
                tensors[key] = f.get_tensor(name)
    return tensors


@torch.no_grad()
def load_checkpoint(model: Transformer, path: str | Path, keep_quantized: bool = False) -> Transformer:
    """Fill `model` from an official-layout checkpoint; every tensor must be used exactly once.

    Every tensor is checked (name, storage dtype, shapes, scale shapes, expert
    ids) before the first one is written, so a bad checkpoint raises and leaves
    the model untouched.
    """
    tensors = read_tensors(path)
    used: set[str] = set()
    writes: list[Callable[[], None]] = []
    linears = {name: mod for name, mod in model.named_modules() if isinstance(mod, Linear)}
    for name, mod in linears.items():
        writes.append(_plan_linear(name, mod, tensors, used, model.config.expert_dtype, keep_quantized))
    for name, target in model.state_dict(keep_vars=True).items():  # persistent tensors only
        if name.rsplit(".", 1)[0] not in linears:
            writes.append(_plan_copy(name, target, tensors, used, model.config))
    unused = sorted(set(tensors) - used)
    if unused:
        raise ValueError(f"{len(unused)} checkpoint tensors match nothing in the model, e.g. {unused[:5]}")
    for write in writes:
        write()
    return model


def _take(name: str, tensors: dict[str, torch.Tensor], used: set[str]) -> torch.Tensor:
    if name not in tensors:
        raise KeyError(f"checkpoint has no tensor {name}")
    used.add(name)
    return tensors[name]


def _plan_linear(name: str, mod: Linear, tensors, used, expert_dtype, keep_quantized: bool):
    fmt = official_format(name, expert_dtype)
    weight = _take(f"{name}.weight", tensors, used)
    if fmt is None:
        return _plan_assign(f"{name}.weight", mod.weight, weight)
    if weight.dtype != STORAGE_DTYPES[fmt]:
        raise TypeError(f"{name}.weight: official {fmt} storage is {STORAGE_DTYPES[fmt]}, got {weight.dtype}")
    scale = _take(f"{name}.scale", tensors, used)
    dense = dequantize_fp8(weight, scale) if fmt == "fp8" else dequantize_fp4(weight, scale)  # checks scales
    if keep_quantized:
        _check_shape(f"{name}.weight (dequantized)", mod.weight, dense)
        return lambda: mod.quantize_as(fmt, weight.clone(), scale.clone())
    return _plan_assign(f"{name}.weight", mod.weight, dense)


def _plan_copy(name: str, target: torch.Tensor, tensors, used, config):
    value = _take(name, tensors, used)
    if name.endswith("tid2eid"):
        if value.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{name}: expected an integer table, got {value.dtype}")
        if int(value.min()) < 0 or int(value.max()) >= config.n_routed_experts:
            raise ValueError(f"{name}: expert ids outside [0, {config.n_routed_experts})")
    return _plan_assign(name, target, value)


def _check_shape(name: str, target: torch.Tensor, value: torch.Tensor) -> None:
    if tuple(value.shape) != tuple(target.shape):
        raise ValueError(f"{name}: checkpoint shape {tuple(value.shape)} != model shape {tuple(target.shape)}")


def _plan_assign(name: str, target: torch.Tensor, value: torch.Tensor):
    _check_shape(name, target, value)
    return lambda: target.copy_(value.to(target.dtype))
