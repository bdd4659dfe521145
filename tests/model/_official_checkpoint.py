"""Writes a checkpoint in the official V4 layout (spec §3-§4), independently of kernforge.

Quantization uses numpy and ml_dtypes: FP8 e4m3 weights with one E8M0 scale
per 128x128 tile, FP4 e2m1 routed experts packed two per int8 (low nibble =
even column) with one E8M0 scale per 32 inputs. Returns the dense tensors a
correct loader must produce.
"""

import json
import re
from pathlib import Path

import ml_dtypes
import numpy as np
import torch
from safetensors.torch import save_file

FP8 = re.compile(r"(attn\.(wq_a|wq_b|wkv|wo_a|wo_b|indexer\.wq_b)|ffn\.shared_experts\.w[123]|e_proj|h_proj)\.weight$")
FP4 = re.compile(r"ffn\.experts\.\d+\.w[123]\.weight$")
F32 = re.compile(r"(hc_\w+|attn_sink|ape|gate\.bias)$")


def _exp2_ceil(amax: np.ndarray, qmax: float) -> np.ndarray:
    return np.ceil(np.log2(np.maximum(amax, 1e-30) / qmax)).astype(np.int64)


def quantize_fp8(w: np.ndarray):
    o, i = w.shape
    to, ti = -(-o // 128), -(-i // 128)
    padded = np.zeros((to * 128, ti * 128), np.float32)
    padded[:o, :i] = w
    amax = np.abs(padded.reshape(to, 128, ti, 128)).max(axis=(1, 3))
    e = _exp2_ceil(amax, 448.0)
    s = np.kron(2.0 ** e, np.ones((128, 128)))[:o, :i]
    q = (w / s).astype(ml_dtypes.float8_e4m3fn)
    return q, (e + 127).astype(np.uint8), (q.astype(np.float64) * s).astype(np.float32)


def quantize_fp4(w: np.ndarray):
    o, i = w.shape
    e = _exp2_ceil(np.abs(w.reshape(o, i // 32, 32)).max(-1), 6.0)
    s = np.repeat(2.0 ** e, 32, axis=1)
    q = (w / s).astype(ml_dtypes.float4_e2m1fn)
    codes = q.view(np.uint8)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).view(np.int8)
    return packed, (e + 127).astype(np.uint8), (q.astype(np.float64) * s).astype(np.float32)


def write_official_checkpoint(dense: dict[str, torch.Tensor], folder: Path, prefix: str = "",
                              scale_suffix: str = "scale", shards: int = 2,
                              fp4_experts: bool = True) -> dict[str, torch.Tensor]:
    """Quantize `dense` (model-named float tensors) into shards; return what loading must give."""
    stored, expected = {}, {}
    for name, t in dense.items():
        arr = t.detach().float().numpy()
        fp8 = bool(FP8.search(name)) or (not fp4_experts and bool(FP4.search(name)))
        if fp8 or FP4.search(name):
            q, scale, deq = (quantize_fp8 if fp8 else quantize_fp4)(arr)
            base = name[: -len(".weight")]
            stored[name] = torch.from_numpy(q.view(np.uint8)).view(torch.float8_e4m3fn) if fp8 \
                else torch.from_numpy(q)
            stored[f"{base}.{scale_suffix}"] = torch.from_numpy(scale).view(torch.float8_e8m0fnu)
            expected[name] = torch.from_numpy(deq)
        elif name.endswith("tid2eid"):
            stored[name] = t.to(torch.int64)
            expected[name] = t.to(torch.int64)
        elif F32.search(name):
            stored[name] = t.float().contiguous()
            expected[name] = t.float()
        else:
            stored[name] = t.to(torch.bfloat16).contiguous()
            expected[name] = stored[name].float()
    names = sorted(stored)
    weight_map = {}
    for k in range(shards):
        file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        part = {prefix + n: stored[n] for n in names[k::shards]}
        save_file(part, str(folder / file))
        weight_map.update({n: file for n in part})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return expected
