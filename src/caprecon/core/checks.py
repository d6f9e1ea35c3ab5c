"""The one check of a count's bound and a number's domain, for options and API arguments alike.

`count_problem` and `number_problem` say what is wrong with a value ("must be between 1 and
100, not 0"), or None; `check_count` and `check_number` raise it as a `ConfigError` naming the
option. The argparse types of `caprecon.cli.common` give the same words, so `--rounds 0` on
the command line and `rounds=0` in Python are refused alike.
"""

from __future__ import annotations

import math
from typing import Any

from caprecon.core.errors import ConfigError

# Upper bounds of the counts that size work or memory: far above any useful setting, and low
# enough that a typo (10**9) is refused instead of hanging or asking for tens of GiB.
MAX_ROUNDS = 100  # refinement rounds per caption
MAX_SEEDS = 1000  # reconstructions per caption
MAX_RESAMPLES = 100_000  # bootstrap resamples: each holds one draw per image in memory
MAX_LIMIT = 10**8  # the first N rows or questions of an input
MAX_CANDIDATES = 1000  # captions sampled per image for best-of-N
MAX_EPOCHS = 100_000  # passes of `distill` over its rows
MAX_WIDTH = 65_536  # units of `distill`'s head: its first layer holds width x feature size weights


def count_problem(value: Any, low: int, high: int | None = None) -> str | None:
    """What keeps `value` from being a whole number in [low, high], or None."""
    if isinstance(value, bool) or not isinstance(value, int):
        return f"must be a whole number, not {value!r}{_numpy_advice(value, 'int')}"
    if value < low or (high is not None and value > high):
        return f"must be {_bounds(low, high)}, not {value}"
    return None


def number_problem(value: Any, low: float | None = None, high: float | None = None, *,
                   low_open: bool = False, high_open: bool = False) -> str | None:
    """What keeps `value` from being a finite number in its range (an open end excludes the
    bound itself), or None. NaN and the infinities are never in range."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"must be a number, not {value!r}{_numpy_advice(value, 'float')}"
    below = low is not None and (value <= low if low_open else value < low)
    above = high is not None and (value >= high if high_open else value > high)
    if not math.isfinite(value) or below or above:
        return f"must be {_range(low, high, low_open, high_open)}, not {value!r}"
    return None


def _numpy_advice(value: Any, plain: str) -> str:
    """For a numpy scalar, which reads as a number yet is none of Python's: how to give one (stored as it
    is, it would reach a manifest as text)."""
    if type(value).__module__ != "numpy" or not hasattr(value, "item") or isinstance(value.item(), bool):
        return ""
    return f" (a numpy {type(value).__name__}: give {plain}(...) of it)"


def check_count(option: str, value: Any, low: int, high: int | None = None) -> int:
    problem = count_problem(value, low, high)
    if problem:
        raise ConfigError(f"{option} {problem}")
    return value


def check_number(option: str, value: Any, low: float | None = None, high: float | None = None, *,
                 low_open: bool = False, high_open: bool = False) -> float:
    problem = number_problem(value, low, high, low_open=low_open, high_open=high_open)
    if problem:
        raise ConfigError(f"{option} {problem}")
    return value


def _bounds(low: int, high: int | None) -> str:
    return f"at least {low}" if high is None else f"between {low} and {high}"


def _range(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    if low is None and high is None:
        return "a finite number"
    if high is None:
        return f"a finite number {'above' if low_open else 'at least'} {low:g}"
    if low is None:
        return f"a finite number {'below' if high_open else 'at most'} {high:g}"
    if low_open and high_open:
        return f"strictly between {low:g} and {high:g}"
    if not low_open and not high_open:
        return f"between {low:g} and {high:g}"
    return f"{'above' if low_open else 'at least'} {low:g} and {'below' if high_open else 'at most'} {high:g}"
