"""Building blocks shared by every layer (spec §2.2): linear, RMSNorm, RoPE/YaRN, Hadamard."""

from __future__ import annotations

import math

import torch
from torch import nn

from kernforge.model import numerics as nx
from kernforge.model.quant import dequantize_fp4, dequantize_fp8


class Linear(nn.Module):
    """y = x W^T with W [out, in], stored dense or as the checkpoint's quantized bytes.

    `quantize_as(fmt, weight, scale)` swaps the dense parameter for the
    checkpoint's FP8/FP4 tensors (kept under the official names `weight` and
    `scale`); forward then dequantizes on every call, which keeps memory at
    the checkpoint's size and gives the same values as dequantizing at load.
    """

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.format: str | None = None

    def quantize_as(self, fmt: str, weight: torch.Tensor, scale: torch.Tensor) -> None:
        if fmt not in ("fp8", "fp4"):
            raise ValueError(f"unknown weight format {fmt!r}")
        del self.weight
        self.register_buffer("weight", weight)
        self.register_buffer("scale", scale)
        self.format = fmt
        if tuple(self.dense_weight().shape) != (self.out_features, self.in_features):
            raise ValueError(f"{fmt} weight dequantizes to {tuple(self.dense_weight().shape)}, "
                             f"expected {(self.out_features, self.in_features)}")

    def dense_weight(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        if self.format == "fp8":
            w = dequantize_fp8(self.weight, self.scale)
        elif self.format == "fp4":
            w = dequantize_fp4(self.weight, self.scale)
        else:
            w = self.weight
        return w if dtype is None else w.to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nx.linear(x, self.dense_weight(x.dtype))


class Embedding(nn.Module):
    """Token embedding table [vocab, dim]; left uninitialised (weights come from a loader or init.py)."""

    def __init__(self, vocab_size: int, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, dim))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.weight[ids]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_normalize(x, self.eps) * self.weight


def rms_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x * (mean(x^2) + eps)^-1/2 over the last dim, without a weight."""
    return x * nx.rsqrt(nx.mean_square(x, dim=-1, keepdim=True) + eps)


def rope_frequencies(rope_dim: int, base: float, yarn_original_len: int = 0, factor: float = 1.0,
                     beta_fast: float = 32.0, beta_slow: float = 1.0) -> torch.Tensor:
    """Per-pair frequencies f_i = base^(-2i/rd), blended toward f_i/factor by the YaRN ramp.

    YaRN applies only when `yarn_original_len` > 0 (compressed layers); there is
    no attention-scale correction in V4.
    """
    # Tables are built on the CPU (explicit device), also inside a meta-device context.
    freqs = base ** (-torch.arange(0, rope_dim, 2, dtype=torch.float64, device="cpu") / rope_dim)
    if yarn_original_len > 0:
        low, high = yarn_correction_range(rope_dim, base, yarn_original_len, beta_fast, beta_slow)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(rope_dim // 2, dtype=torch.float64, device="cpu") - low) / (high - low)).clamp(0, 1)
        freqs = freqs * (1 - ramp) + (freqs / factor) * ramp
    return freqs


def yarn_correction_range(rope_dim: int, base: float, original_len: int, beta_fast: float,
                          beta_slow: float) -> tuple[int, int]:
    def corr(n_rotations: float) -> float:
        return rope_dim * math.log(original_len / (n_rotations * 2 * math.pi)) / (2 * math.log(base))

    return max(math.floor(corr(beta_fast)), 0), min(math.ceil(corr(beta_slow)), rope_dim - 1)


class RopeTable(nn.Module):
    """cos/sin of t * f_i for every position t < max_seq_len, computed once in float64."""

    def __init__(self, rope_dim: int, max_seq_len: int, freqs: torch.Tensor):
        super().__init__()
        angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float64, device=freqs.device), freqs)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)
        self.rope_dim = rope_dim

    def rotate(self, x: torch.Tensor, positions: torch.Tensor, inverse: bool = False) -> torch.Tensor:
        """Rotate the LAST rope_dim dims of x [b, s, (h,) d] at positions [s]; pairs are interleaved.

        Each pair (a, b) becomes (a cos - b sin, a sin + b cos), computed as
        rope * (cos, cos) + swap(rope) * (-sin, sin) with swap(a, b) = (b, a):
        the same products and sums, but on contiguous runs instead of the
        stride-2 views a = rope[0::2], b = rope[1::2], which torch does not
        vectorise (3-4x slower on the [8, 1024, 4, 96] queries).
        """
        cos = self.cos[positions].to(x.dtype).repeat_interleave(2, dim=-1)
        sin = self.sin[positions].to(x.dtype)
        sin = torch.stack([sin, -sin] if inverse else [-sin, sin], dim=-1).flatten(-2)
        if x.dim() == 4:
            cos, sin = cos[:, None], sin[:, None]
        out = x.clone()
        rope = out[..., -self.rope_dim:]
        swapped = rope.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)  # a new tensor: (b, a) per pair
        rope.mul_(cos).add_(swapped.mul_(sin))
        return out


def hadamard(x: torch.Tensor) -> torch.Tensor:
    """Sylvester-ordered Walsh-Hadamard transform over the last dim, scaled by n^-1/2.

    log2(n) butterfly stages (a, b) -> (a + b, a - b), each written into one of
    two scratch buffers in turn, so a stage costs one pass and no allocation.
    """
    n = x.shape[-1]
    if n & (n - 1):
        raise ValueError(f"Hadamard size must be a power of two, got {n}")
    src = x.reshape(-1, n)
    scratch = [torch.empty_like(src), torch.empty_like(src)]
    h = 1
    while h < n:
        dst = scratch[0]
        pairs, out = src.view(-1, n // (2 * h), 2, h), dst.view(-1, n // (2 * h), 2, h)
        torch.add(pairs[:, :, 0], pairs[:, :, 1], out=out[:, :, 0])
        torch.sub(pairs[:, :, 0], pairs[:, :, 1], out=out[:, :, 1])
        src, scratch = dst, scratch[::-1]
        h *= 2
    return (src * n ** -0.5).view(x.shape)
