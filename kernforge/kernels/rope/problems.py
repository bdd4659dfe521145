"""The RoPE catalogue entry: YaRN tables from the model's frequencies, random positions per token."""
from __future__ import annotations

import torch

from kernforge.kernels.registry import KernelSpec, Problem, register
from kernforge.kernels.rope.config import choose
from kernforge.kernels.rope.kernel import rotary_embedding
from kernforge.kernels.rope.reference import angle_tables, reference
from kernforge.model.primitives import rope_frequencies


def tolerance(dtype: torch.dtype) -> dict:
    return dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2.0 ** -7, atol=1e-2)


def _make_inputs(params, seed, device):
    g = torch.Generator().manual_seed(seed)
    n, h, d, rd, length = params["tokens"], params["heads"], params["head_dim"], params["rope_dim"], params["table_len"]
    dt = getattr(torch, params["dtype"])
    # V4's compressed-layer table: YaRN over the compress base
    cos, sin = angle_tables(rd, length, rope_frequencies(rd, 160000.0, 65536, 16.0))
    x = torch.randn(n, h, d, generator=g).to(dt)
    positions = torch.randint(0, length, (n,), generator=g).to(getattr(torch, params["position_dtype"]))
    out = torch.full((n, h, d), float("nan"), dtype=dt)
    return [t.to(device) for t in (x, positions, cos, sin, out)]


def _reference(inputs, params):
    x, positions, cos, sin, _ = (t.cpu() for t in inputs)
    return [reference(x, positions, cos, sin, params.get("inverse", False))]


def peers(spec, inputs, params):
    """The model's torch function on the spec's inputs, for ``benchmarks/gpu_check.py``'s timing
    columns (``PEERS[family]``): what this kernel replaces in ``kernforge/model``."""
    from kernforge.model.primitives import RopeTable

    x, positions, cos, sin, _ = inputs
    table = RopeTable(params["rope_dim"], 1, torch.zeros(params["rope_dim"] // 2, dtype=torch.float64))
    table.cos, table.sin = cos.double(), sin.double()  # the spec's tables, in the model's float64 form
    return {"model RopeTable.rotate (torch)": lambda: table.rotate(x[None], positions, params.get("inverse", False))}


def _check(outputs, expected, inputs, params):
    got = outputs[0].cpu()
    torch.testing.assert_close(got.double(), expected[0], **tolerance(got.dtype),
                               msg=lambda m: f"rotary_embedding: {m}")


SPEC = register(KernelSpec(
    name="rotary_embedding",
    family="rope",
    description="RoPE (YaRN tables) on the last rope_dim dims, interleaved pairs, per-token positions",
    factory=rotary_embedding,
    runtime_sizes=("tokens", "heads", "table_len"),
    problems={
        "small": Problem("small", dict(tokens=7, heads=3, head_dim=96, rope_dim=32, table_len=64, dtype="float32",
                                       position_dtype="int64", block_heads=2)),
        # the op's CUDA configuration at V4-Flash's query shape (also what the nvcc tests build)
        "demo": Problem("demo", dict(tokens=1024, heads=64, table_len=4096,
                                     **choose.heuristic("cuda", 512, 64, "bfloat16", "int64"))),
        "bench": Problem("bench", dict(tokens=4096, heads=64, head_dim=512, rope_dim=64, table_len=65536,
                                      dtype="bfloat16", position_dtype="int64")),
    },
    make_inputs=_make_inputs,
    outputs=(4,),
    reference=_reference,
    check=_check,
    bytes=lambda p: 2 * p["tokens"] * p["heads"] * p["head_dim"] * (2 if p["dtype"] == "bfloat16" else 4),
    tags=("rope", "dense"),
))
