"""Random weights for tests and the smoke path (no checkpoint download).

Scales keep every activation O(1) through the tiny model, so the logits carry
information from every layer and no test runs on near-zero data.
"""

from __future__ import annotations

import torch

from kernforge.model.transformer import Transformer


@torch.no_grad()
def init_random_(model: Transformer, seed: int = 0) -> Transformer:
    g = torch.Generator().manual_seed(seed)
    cfg = model.config

    def normal(shape, std):
        return torch.randn(shape, generator=g, dtype=torch.float64) * std

    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if name.endswith("norm.weight"):
            value = 1.0 + normal(p.shape, 0.1)
        elif leaf.endswith("_fn"):
            value = normal(p.shape, p.shape[1] ** -0.5)
        elif leaf.endswith("_base"):
            value = normal(p.shape, 0.5)
        elif leaf.endswith("_scale"):
            value = 0.5 + torch.rand(p.shape, generator=g, dtype=torch.float64)
        elif leaf == "attn_sink":
            value = normal(p.shape, 1.0)
        elif leaf == "ape":
            value = normal(p.shape, 0.5)
        elif name.endswith("gate.bias"):
            value = normal(p.shape, 0.1)
        elif name == "embed.weight":
            value = normal(p.shape, 1.0)
        else:  # projection weights [out, in]
            value = normal(p.shape, p.shape[-1] ** -0.5)
        p.copy_(value.to(p.dtype))
    for name, buf in model.named_buffers():
        if name.endswith("tid2eid"):  # distinct experts per token, like the real table
            rows = torch.stack([torch.randperm(cfg.n_routed_experts, generator=g)[:cfg.num_experts_per_tok]
                                for _ in range(cfg.vocab_size)])
            buf.copy_(rows)
    return model


def random_model(config, seed: int = 0, dtype: torch.dtype = torch.float32) -> Transformer:
    return init_random_(Transformer(config), seed).to(dtype)
