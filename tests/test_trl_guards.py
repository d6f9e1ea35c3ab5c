"""caprecon.rewards.length / repetition: the guards as TRL reward functions, each value worked out by hand."""

from __future__ import annotations

import pickle

import pytest

import caprecon
from caprecon.core.errors import ConfigError


def chat(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


def test_length_counts_words_without_ids_and_tokens_with_them():
    length = caprecon.rewards.length(target=4, weight=2.0)
    texts = ["a b c d e f", "a b", "one two three four"]
    # 6 words: -2 * (6/4 - 1) = -1; 2 words and 4 words: within the target, 0
    assert length(prompts=["p"] * 3, completions=texts) == pytest.approx([-1.0, 0.0, 0.0])
    assert length(completions=[chat(t) for t in texts]) == pytest.approx([-1.0, 0.0, 0.0])
    # the token counts rule when TRL passes them: 10 tokens -> -2 * (10/4 - 1) = -3; 5 -> -0.5
    assert length(completions=texts[:2], completion_ids=[[7] * 10, [7] * 5]) == pytest.approx([-3.0, -0.5])


def test_repetition_counts_word_and_token_ngrams():
    repetition = caprecon.rewards.repetition(n=2)
    # bigrams of "the cat the cat": (the cat), (cat the), (the cat): 1 - 2/3 repeat
    assert repetition(completions=["the cat the cat", "a red ball"]) == pytest.approx([-1 / 3, 0.0])
    # ids 1 2 1 2 1 2: five bigrams, two distinct: 1 - 2/5; weight 3 scales it
    heavy = caprecon.rewards.repetition(n=2, weight=3.0)
    assert heavy(completions=[chat("x"), chat("y")], completion_ids=[[1, 2, 1, 2, 1, 2], [5]]) == \
        pytest.approx([-3 * 0.6, 0.0])


def test_trl_names_and_pickles_them():
    from trl.trainer.utils import get_callable_name, is_async_callable

    length, repetition = caprecon.rewards.length(), caprecon.rewards.repetition()
    assert get_callable_name(length) == "length" and get_callable_name(repetition) == "repetition"
    assert not is_async_callable(length)
    copy = pickle.loads(pickle.dumps(length))
    assert copy(completions=["w " * 90]) == pytest.approx([-(90 / 60 - 1)])  # the default target, weight 1


def test_bad_calls_and_settings_are_config_errors():
    with pytest.raises(ConfigError, match="length: 1 completion_ids for 2 completions"):
        caprecon.rewards.length()(completions=["a", "b"], completion_ids=[[1]])
    with pytest.raises(ConfigError, match="TRL's keywords"):
        caprecon.rewards.repetition()()
    with pytest.raises(ConfigError, match="length_target must be at least 1, not 0"):
        caprecon.rewards.length(target=0)
    with pytest.raises(ConfigError, match="repetition_weight must be a finite number at least 0, not -1.0"):
        caprecon.rewards.repetition(weight=-1.0)
