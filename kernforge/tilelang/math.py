"""``tilelang.math``: the integer helpers TileLang programs size their tiles with."""
from __future__ import annotations


def next_power_of_2(x: int) -> int:
    """The smallest power of two >= ``x`` (1 for ``x`` <= 1), as TileLang's helper."""
    x = int(x)
    return 1 if x <= 1 else 1 << (x - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for positive ints (``tilelang.cdiv``)."""
    return -(-int(a) // int(b))
