"""Means and spreads of scores as large as the largest float, without overflow.

Two scores near 1e308 sum to inf, and a spread around that mean is NaN. Divided by 2**e, where
e is the binary exponent of the largest |value| (`binary_exponent`), every value lies within 1,
so no sum, mean or spread of them overflows; a power of two changes only the exponent, so the
division is exact and every figure is the same once multiplied back (`rescale`). Scores within
1 have exponent 0 or below and are not touched.
"""

from __future__ import annotations

import math
import sys
from typing import Iterable, Sequence


def binary_exponent(values: Iterable[float]) -> int:
    """The binary exponent of the largest |value| (0 for none), never below 0."""
    return max(0, math.frexp(max((abs(v) for v in values), default=0.0))[1])


def unit_scale(values: Sequence[float]) -> tuple[list[float], int]:
    """`values` divided by 2**e so that each lies within 1, and e (`rescale` undoes it)."""
    exponent = binary_exponent(values)
    return [math.ldexp(float(v), -exponent) for v in values], exponent


def rescale(value: float, exponent: int) -> float:
    """`value` * 2**exponent. A figure beyond the largest float (the bound of an interval around
    scores near it) saturates at the largest float rather than becoming inf."""
    try:
        return math.ldexp(value, exponent)
    except OverflowError:
        return math.copysign(sys.float_info.max, value)
