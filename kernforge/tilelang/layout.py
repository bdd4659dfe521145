"""``tilelang.layout`` (and ``tilelang.cuda.intrinsics``' layout makers): shared-memory
layouts a TileLang author asks for with ``T.annotate_layout``.

Layouts are performance hints on kernforge: ``T.annotate_layout`` records which buffers were
annotated, and kernforge's CUDA layout planner picks the swizzles itself.  So a layout here
is only a named marker that says which maker built it for which buffer.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    """A requested layout: the maker's name and the buffer it is for."""

    kind: str
    buffer: object


def make_swizzled_layout(buffer, *args, **kwargs) -> Layout:
    """TileLang's swizzled shared-memory layout for ``buffer``: a hint marker."""
    return Layout("swizzled", buffer)


def make_mma_swizzle_layout(buffer, *args, **kwargs) -> Layout:
    """TileLang's MMA-operand swizzle for ``buffer`` (``tilelang.cuda.intrinsics``): a hint marker."""
    return Layout("mma_swizzle", buffer)
