"""caprecon's guards as plain TRL reward functions, so that `GRPOConfig.reward_weights` weighs them and
TRL logs them (`rewards/length/mean`, ...) as it does its own:

    from caprecon import Reward, rewards
    reward_funcs = [Reward(["recon"], guards=None, ...), rewards.length(target=60), rewards.repetition(n=3)]
    GRPOConfig(reward_weights=[1.0, 0.5, 1.0], ...)

Each is the rule of `caprecon.Guards` (the length and repetition terms of `Reward`), counted on the
completion's tokens (`completion_ids`, which TRL passes) when given, else on its words. Their own weight
is 1 by default: the raw term, which `reward_weights` then scales. Both are picklable (TRL's async GRPO
pickles its reward functions).
"""

from __future__ import annotations

from typing import Any, Sequence

from caprecon.apps.reward.guards import Guards, words
from caprecon.apps.reward.inputs import completion_text
from caprecon.core.errors import ConfigError


class GuardReward:
    """One guard of `Guards` as a TRL reward function; `length` and `repetition` make them."""

    def __init__(self, name: str, guards: Guards):
        self.__name__ = name  # TRL names a reward function by its __name__
        self.guards = guards

    def __repr__(self) -> str:
        return f"caprecon.rewards.{self.__name__}({self.guards})"

    def __call__(self, prompts: Sequence[Any] | None = None, completions: Sequence[Any] | None = None,
                 completion_ids: Sequence[Sequence[int]] | None = None, **columns: Any) -> list[float]:
        """One term per completion: on its `completion_ids` when TRL gives them, else on its words."""
        if completions is None:
            raise ConfigError(f"{self.__name__}: call it with TRL's keywords (completions=..., completion_ids=...)")
        if completion_ids is not None:
            if len(completion_ids) != len(completions):
                raise ConfigError(f"{self.__name__}: {len(completion_ids)} completion_ids for "
                                  f"{len(completions)} completions")
            units = [list(ids) for ids in completion_ids]
        else:
            units = [words(completion_text(c)) for c in completions]
        if self.__name__ == "length":
            return [self.guards.length_of(len(u)) for u in units]
        return [self.guards.repetition_of(u) for u in units]


def length(target: int = 60, weight: float = 1.0) -> GuardReward:
    """-weight * max(0, count / target - 1): nothing up to `target` tokens (words without
    `completion_ids`), then a penalty growing with the overshoot (`Guards`' length term)."""
    return GuardReward("length", Guards(length_target=target, length_weight=weight))


def repetition(n: int = 3, weight: float = 1.0) -> GuardReward:
    """-weight * the share of the completion's token n-grams (word n-grams without `completion_ids`)
    that repeat an earlier one (`Guards`' repetition term)."""
    return GuardReward("repetition", Guards(repetition_n=n, repetition_weight=weight))
