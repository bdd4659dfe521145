"""Quantisation's compile-time configuration: the one place its launch shapes are chosen.

:func:`choose_token`, :func:`choose_block` and :func:`choose_fp4` are what
:mod:`kernforge.ops.quant` compiles and the catalogue's problems use.  A block always owns
one scale block (the scale granularity fixes the tile), so only the thread count varies;
the host backends run a block as one thread, so one value serves every backend and the
ops share their builds with the catalogue.
"""
from __future__ import annotations

from kernforge import backends
from kernforge.tune.consult import tuned

@tuned(("per_token_cast_to_fp8", "per_token_cast_to_fp8_ue8m0"))
def choose_token(backend: str, dtype: str, use_ue8m0: bool) -> dict:
    """:func:`~kernforge.kernels.quant.per_token_cast`: one thread per element of the 1x128
    block on GPUs (the block's reduction is one warp-shuffle tree per warp); the host
    backends run a block as one thread, where the count only sets the lowering's choices."""
    return dict(dtype=dtype, use_ue8m0=use_ue8m0, threads=128)


@tuned("per_block_cast_to_fp8")
def choose_block(backend: str, dtype: str, use_ue8m0: bool) -> dict:
    """:func:`~kernforge.kernels.quant.per_block_cast`: 256 threads (64 elements each) per
    128x128 block (the host backends ignore the count; one value shares their builds)."""
    return dict(dtype=dtype, use_ue8m0=use_ue8m0, threads=256)


@tuned("per_token_cast_to_fp4")
def choose_fp4(backend: str, dtype: str) -> dict:
    """:func:`~kernforge.kernels.quant.per_token_cast_fp4`: one warp per 32-element block."""
    return dict(dtype=dtype, threads=32)


@tuned("fake_quant_fp8")
def choose_fake_fp8(backend: str, dtype: str, block: int) -> dict:
    """:func:`~kernforge.kernels.quant.fake_quant_e4m3`: one thread per value of a 64-value
    block; the host backends take 16 rows' blocks a program (one program is one loop
    iteration there: its fixed costs shared by 16 blocks)."""
    return dict(dtype=dtype, block=block, block_rows=_host_rows(backend), threads=64)


@tuned("fake_quant_fp4")
def choose_fake_fp4(backend: str, block: int) -> dict:
    """:func:`~kernforge.kernels.quant.fake_quant_e2m1`: one warp per 32-value block; 16 rows'
    blocks a program on the host backends, as :func:`choose_fake_fp8`."""
    return dict(block=block, block_rows=_host_rows(backend), threads=32)


def _host_rows(backend: str) -> int:
    return 16 if backends.lang(backend) in ("ir", "c++") else 1
