"""Float64 RoPE from the definition: each interleaved pair of the rope dims is a complex number
turned by ``e^{i angle}`` (independent of the kernel and of the model's cos/sin arithmetic)."""
from __future__ import annotations

import torch


def reference(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
              inverse: bool = False) -> torch.Tensor:
    """``x [tokens, heads, head_dim]`` with its last ``2 * cos.shape[-1]`` dims rotated, float64.

    The angle's cos/sin are the tables' rows at ``positions``; the rotation is the
    complex product ``(a + i b) (cos + i sin)`` (conjugate for ``inverse``)."""
    half = cos.shape[-1]
    xd = x.double()
    c = cos.double()[positions.long()][:, None, :]
    s = sin.double()[positions.long()][:, None, :]
    turn = torch.complex(c, -s if inverse else s)
    pairs = xd[..., -2 * half:].reshape(*xd.shape[:-1], half, 2)
    rotated = torch.view_as_real(torch.view_as_complex(pairs.contiguous()) * turn).flatten(-2)
    return torch.cat([xd[..., :-2 * half], rotated], dim=-1)


def angle_tables(rope_dim: int, length: int, freqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos, sin [length, rope_dim // 2]`` (float32) of ``t * freqs[i]``: the layout the kernel reads,
    from per-pair frequencies (the model's ``rope_frequencies``), angles in float64."""
    if freqs.shape != (rope_dim // 2,):
        raise ValueError(f"freqs must have shape ({rope_dim // 2},), got {tuple(freqs.shape)}")
    angles = torch.outer(torch.arange(length, dtype=torch.float64), freqs.double())
    return angles.cos().float(), angles.sin().float()
