"""Units shared by every stage: bytes per GiB, rounding to a multiple, GiB as text."""

from __future__ import annotations

import math

__all__ = ["GIB", "divisors", "gib", "round_up"]

GIB = 1024**3


def round_up(value: int, multiple: int) -> int:
    """The smallest multiple of `multiple` that is >= `value` (both positive)."""
    return -(-value // multiple) * multiple


def divisors(number: int) -> list[int]:
    """Every divisor of a positive `number`, ascending, in O(sqrt(number)) steps (no range up to it)."""
    small, large = [], []
    i = 1
    while i * i <= number:
        if number % i == 0:
            small.append(i)
            if i != number // i:
                large.append(number // i)
        i += 1
    return small + large[::-1]


def gib(value: float | None, digits: int | None = 3) -> str:
    """Bytes as GiB with `digits` decimals ('-' for None, 'inf' for an infinite value); `digits=None` is
    short: two decimals below 10 GiB (a CPU study's peaks are fractions of a GiB), one above."""
    if value is None:
        return "-"
    if not math.isfinite(value):
        return "inf"
    if digits is None:
        digits = 2 if abs(value) < 10 * GIB else 1
    return f"{value / GIB:.{digits}f}"
