"""The reward's guards: the terms that keep a policy from gaming it (the length of a caption past
its target, the share of its word n-grams that repeat; the hallucination term's weight), and the
text measures they read."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Sequence

from caprecon.core.checks import count_problem, number_problem
from caprecon.core.errors import ConfigError

_WORD = re.compile(r"\w+(?:'\w+)?")


def words(caption: str) -> list[str]:
    return _WORD.findall(caption.lower())


def repetition(caption: str, n: int = 3) -> float:
    """The share of the caption's word n-grams that repeat an earlier n-gram of it (0: none repeats)."""
    return repeated_share(words(caption), n)


def repeated_share(tokens: Sequence[Any], n: int = 3) -> float:
    """The share of the n-grams of `tokens` (words, or token ids) that repeat an earlier one."""
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


@dataclass(frozen=True)
class Guards:
    """The terms that keep a policy from gaming the reward (see the module's docstring); a weight
    of 0 turns its term off. `Guards.off()` turns all of them off. Every setting is checked here,
    when the guards are built: `length_target` and `repetition_n` whole numbers >= 1, the weights
    finite numbers >= 0."""

    length_target: int = 60
    length_weight: float = 0.5
    repetition_n: int = 3
    repetition_weight: float = 1.0
    hallucination_weight: float = 1.0

    def __post_init__(self) -> None:
        for name in ("length_target", "repetition_n"):
            problem = count_problem(getattr(self, name), 1)
            if problem:
                raise ConfigError(f"guards: {name} {problem}")
        for name in ("length_weight", "repetition_weight", "hallucination_weight"):
            problem = number_problem(getattr(self, name), 0.0)
            if problem:
                raise ConfigError(f"guards: {name} {problem}")
            # Python's own float: a numpy float64 passes the check (it is a float) but would show as
            # np.float64(0.5) in the guards' repr and a manifest's text, and pickle with numpy's types
            object.__setattr__(self, name, float(getattr(self, name)))

    @classmethod
    def off(cls) -> "Guards":
        return cls(length_weight=0.0, repetition_weight=0.0, hallucination_weight=0.0)

    def length(self, caption: str) -> float:
        return self.length_of(len(words(caption)))

    def length_of(self, count: int) -> float:
        """The length term of a caption of `count` words (or tokens)."""
        return -self.length_weight * max(0.0, count / self.length_target - 1.0)

    def repetition(self, caption: str) -> float:
        return self.repetition_of(words(caption))

    def repetition_of(self, tokens: Sequence[Any]) -> float:
        """The repetition term of a caption split into `tokens` (words, or token ids)."""
        return -self.repetition_weight * repeated_share(tokens, self.repetition_n)
