"""The FP8 KV page catalogue entries: problems, inputs (outputs poisoned), the torch oracles,
byte-exact checks."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kernforge.kernels.kv_quant import config
from kernforge.kernels.kv_quant.kernel import fp8_kv_dequantize, fp8_kv_quantize, scale_bytes
from kernforge.kernels.kv_quant.reference import fp8_kv_dequantize_pages, fp8_kv_quantize as quantize_oracle
from kernforge.kernels.registry import KernelSpec, Problem, register


@dataclass(frozen=True)
class PageLayout:
    """The oracles' view of a MODEL1 page (the fields of `kernforge.engine.cache.Fp8KVLayout`,
    which the kernels' family cannot import: the engine imports the ops, the ops the kernels)."""

    nope: int
    rope: int
    block_size: int = 64

    @property
    def token_bytes(self) -> int:
        return self.nope + 2 * self.rope

    @property
    def scale_bytes(self) -> int:
        return scale_bytes(self.nope)

    @property
    def page_bytes(self) -> int:
        return self.block_size * (self.token_bytes + self.scale_bytes)


def kv_rows(n: int, width: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Random KV rows with magnitudes from 2^-30 (below the 1e-4 amax floor) to 2^20, one per row."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, width, generator=g) * torch.exp2(torch.randint(-30, 21, (n, 1), generator=g).float())
    return x.to(dtype)


def pages_of(rows: torch.Tensor, lay) -> torch.Tensor:
    """The MODEL1 pages holding ``rows`` [P * block_size, width] in order (the oracle's bytes)."""
    data, scales = quantize_oracle(rows, lay)
    p = rows.shape[0] // lay.block_size
    return torch.cat([data.view(p, -1), scales.view(p, -1)], dim=1).contiguous()


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.uint8, 2: torch.int16}[t.element_size()])


def assert_same_bits(names, outputs, expected) -> None:
    for name, got, want in zip(names, outputs, expected):
        got, want = bits(got.cpu()), bits(want.cpu())
        if got.shape != want.shape or not torch.equal(got, want):
            bad = (got != want).nonzero()[:5].tolist() if got.shape == want.shape else "shape"
            raise AssertionError(f"{name} differ at {bad}")


def _layout(params) -> PageLayout:
    return PageLayout(params["nope"], params["rope"], params.get("block_size", 64))


def _quantize_inputs(params, seed, device):
    lay = _layout(params)
    n = params["N"]
    values = kv_rows(n, lay.nope + lay.rope, getattr(torch, params["dtype"]), seed)
    data = torch.full((n, lay.token_bytes), 0xA5, dtype=torch.uint8)
    scales = torch.full((n, lay.scale_bytes), 0xA5, dtype=torch.uint8)
    return [t.to(device) for t in (values, data, scales)]


def _dequantize_inputs(params, seed, device):
    lay = _layout(params)
    p = params["P"]
    pages = pages_of(kv_rows(p * lay.block_size, lay.nope + lay.rope, torch.float32, seed), lay)
    out = torch.full((p, lay.block_size, lay.nope + lay.rope), float("nan"), dtype=torch.bfloat16)
    return [t.to(device) for t in (pages, out)]


def _problems(sizes: dict, **kernel) -> dict:
    return {label: Problem(label, dict(size, **kernel)) for label, size in sizes.items()}


# V4-Flash: 448 nope + 64 rope dims per KV row (584 bytes a token)
SPEC_QUANTIZE = register(KernelSpec(
    name="fp8_kv_quantize",
    family="kv_quant",
    description="KV rows -> FP8 MODEL1 token bytes (e4m3 + E8M0 per 64 nope, bf16 rope)",
    factory=fp8_kv_quantize,
    runtime_sizes=("N",),
    problems={"small": Problem("small", dict(N=5, **config.choose_quantize.heuristic("cpu", 128, 32))),
              **_problems(dict(demo=dict(N=512), bench=dict(N=8192)),
                          **config.choose_quantize.heuristic("cuda", 448, 64, "bfloat16"))},
    make_inputs=_quantize_inputs,
    outputs=(1, 2),
    reference=lambda inputs, p: list(quantize_oracle(inputs[0].cpu(), _layout(p))),
    check=lambda outputs, expected, inputs, p: assert_same_bits(("data", "scales"), outputs, expected),
    bytes=lambda p: p["N"] * ((p["nope"] + p["rope"]) * 2 + _layout(p).token_bytes + _layout(p).scale_bytes),
    tags=("kv_cache", "fp8"),
))

SPEC_DEQUANTIZE = register(KernelSpec(
    name="fp8_kv_dequantize",
    family="kv_quant",
    description="FP8 MODEL1 KV pages -> bf16 pages (what the attention kernel reads)",
    factory=fp8_kv_dequantize,
    runtime_sizes=("P",),
    problems={"small": Problem("small", dict(P=2, **config.choose_dequantize.heuristic("cpu", 128, 32, 16))),
              **_problems(dict(demo=dict(P=64), bench=dict(P=1024)),
                          **config.choose_dequantize.heuristic("cuda", 448, 64, 64))},
    make_inputs=_dequantize_inputs,
    outputs=(1,),
    reference=lambda inputs, p: [fp8_kv_dequantize_pages(inputs[0].cpu(), _layout(p))[:, :, 0]],
    check=lambda outputs, expected, inputs, p: assert_same_bits(("pages",), outputs, expected),
    bytes=lambda p: p["P"] * (_layout(p).page_bytes + _layout(p).block_size * (p["nope"] + p["rope"]) * 2),
    tags=("kv_cache", "fp8"),
))
