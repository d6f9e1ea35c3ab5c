"""Accuracy per question category: the one place where "correct answers / questions" is counted.

A metric fills a `CategoryTally` per row (the Caption Turing Test, CaptionQA) and the
category report pools rows into one per captioner, so both read accuracy the same way.
"""

from __future__ import annotations

from typing import Any, Sequence


class CategoryTally:
    """Correct answers and questions asked, per category and over all questions.

    `add(category, correct, n)` counts `n` questions of which `correct` (possibly a
    fraction, when a row's accuracy is pooled) were right; `category=None` counts toward
    the overall figures only.
    """

    def __init__(self) -> None:
        self.correct: dict[str, float] = {}
        self.asked: dict[str, float] = {}
        self.total_correct = 0.0
        self.total_asked = 0.0

    def add(self, category: str | None, correct: float, n: float = 1.0) -> None:
        if category is not None:
            self.correct[category] = self.correct.get(category, 0.0) + correct
            self.asked[category] = self.asked.get(category, 0.0) + n
        self.total_correct += correct
        self.total_asked += n

    def accuracy(self, category: str) -> float | None:
        return self.correct[category] / self.asked[category] if self.asked.get(category) else None

    @property
    def overall(self) -> float | None:
        """Accuracy over all questions: categories weigh by their number of questions."""
        return self.total_correct / self.total_asked if self.total_asked else None

    def mean_over_categories(self, categories: Sequence[str] | None = None) -> float | None:
        """Every category weighs the same, however many questions it has."""
        present = [a for c in (categories if categories is not None else self.asked)
                   if (a := self.accuracy(c)) is not None]
        return sum(present) / len(present) if present else None

    def fields(self, name: str, *, counts: bool = True) -> dict[str, Any]:
        """A scored row's fields: `name` (over questions), `name/<category>`, and with
        `counts` the questions behind them (`name_n`, `name_n/<category>`), which the
        report needs to pool rows."""
        out: dict[str, Any] = {name: self.overall}
        if counts:
            out[f"{name}_n"] = int(self.total_asked)
        for category in self.asked:
            out[f"{name}/{category}"] = self.accuracy(category)
            if counts:
                out[f"{name}_n/{category}"] = int(self.asked[category])
        return out
