"""Test helpers shared by the model tests."""

import torch


def tokens(batch: int, length: int, seed: int, vocab: int = 512) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def prefill_then_decode(model, ids: torch.Tensor, prefill: int) -> torch.Tensor:
    """Logits for every position: one prefill call, then one decode call per token."""
    outs = [model(ids[:, :prefill], 0)]
    for p in range(prefill, ids.shape[1]):
        outs.append(model(ids[:, p:p + 1], p))
    return torch.cat(outs, dim=1)


def rope_reference(x: torch.Tensor, positions: torch.Tensor, freqs: torch.Tensor, inverse=False) -> torch.Tensor:
    """Interleaved RoPE on the last 2*len(freqs) dims via complex multiplication (float64)."""
    rd = 2 * freqs.shape[0]
    z = torch.view_as_complex(x[..., -rd:].double().reshape(*x.shape[:-1], rd // 2, 2).contiguous())
    angle = positions.double()[:, None] * freqs.double()[None]
    rot = torch.polar(torch.ones_like(angle), -angle if inverse else angle)
    if x.dim() == 4:
        rot = rot[:, None]
    out = torch.view_as_real(z * rot).flatten(-2)
    return torch.cat([x[..., :-rd].double(), out], dim=-1)
