"""A judge that replays recorded answers instead of running a model.

Published VQA answers (DSG's `pali17b_dsg.csv` and the files of its layout: `t2i_model, item_id,
question, question_id, answer, ...`) can then be scored by caprecon's own rules without the model
that gave them. An image is named by its key `"<t2i_model>/<item_id>"` (`image_key`): the
generator, or the source of the image, and the item. `answer(key, question_id)` is the recorded
answer, as recorded (possibly empty, or neither yes nor no).

As a judge role (`--judge recorded --judge-opt answers=FILE`), a request's `image_key` names the
image and its prompt must end with a recorded question of that image: `generate` returns the
recorded answer, `option_probs` 1 for the option that is the answer (case and surrounding
punctuation aside) and 0 for the others. A request with no recorded answer is NaN in
`option_probs` (unknown, never guessed) and an error in `generate`.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Sequence

from caprecon.data.loaders.dsg import RecordedAnswer, read_recorded_answers
from caprecon.models.vlm import VLMRequest


def image_key(source: str, item_id: str) -> str:
    """The key of the image `source` (a generator, or "photo") made or holds for `item_id`."""
    return f"{source}/{item_id}"


def normalised_answer(answer: str) -> str:
    return answer.strip().strip(".,!?").strip().lower()


class RecordedJudge:
    """Answers replayed from a file; `split` keeps only the rows of one `dsg_prompt_split`."""

    box_coords = None

    def __init__(self, answers: str | Path, *, split: str | None = None):
        self.path = Path(answers)
        rows = read_recorded_answers(self.path)
        if split is not None:
            rows = [r for r in rows if r.split == split]
        self.split = split
        self._by_id: dict[str, dict[int, RecordedAnswer]] = {}
        self._by_question: dict[str, dict[str, RecordedAnswer]] = {}
        for row in rows:  # a question recorded twice: the later row holds, as a dict built from the file would
            key = image_key(row.t2i_model, row.item_id)
            self._by_id.setdefault(key, {})[row.question_id] = row
            self._by_question.setdefault(key, {})[row.question.strip()] = row
        # the answers are the model: two files of the same name but other answers are other judges
        self._fingerprint = f"recorded:{hashlib.sha256(self.path.read_bytes()).hexdigest()}:{split or ''}"

    @property
    def fingerprint(self) -> str:
        return self._fingerprint

    def images(self) -> list[str]:
        return list(self._by_id)

    def answers(self, key: str) -> dict[int, RecordedAnswer]:
        """Every recorded answer about image `key`, by question id (empty: none recorded)."""
        return dict(self._by_id.get(key, {}))

    def answer(self, key: str, question_id: int) -> str | None:
        row = self._by_id.get(key, {}).get(question_id)
        return None if row is None else row.answer

    def _recorded(self, request: VLMRequest) -> RecordedAnswer | None:
        questions = self._by_question.get(request.image_key, {})
        prompt = request.prompt.strip()
        if prompt in questions:
            return questions[prompt]
        # a prompt that wraps the question (an instruction before it): the longest question it ends with
        ends = [q for q in questions if prompt.endswith(q)]
        return questions[max(ends, key=len)] if ends else None

    def generate(self, requests: Sequence[VLMRequest], max_new_tokens: int = 64) -> list[str]:
        out = []
        for r in requests:
            row = self._recorded(r)
            if row is None:
                raise KeyError(f"{self.path}: no recorded answer for image {r.image_key!r}, question {r.prompt!r}")
            out.append(row.answer)
        return out

    def option_probs(self, requests: Sequence[VLMRequest], options: Sequence[Sequence[str]]) -> list[list[float]]:
        out = []
        for r, opts in zip(requests, options):
            row = self._recorded(r)
            if row is None:
                out.append([math.nan] * len(opts))
                continue
            given = normalised_answer(row.answer)
            out.append([1.0 if normalised_answer(o) == given else 0.0 for o in opts])
        return out

    def answer_prob(self, requests: Sequence[VLMRequest], answers: Sequence[str]) -> list[float]:
        return [p[0] for p in self.option_probs(requests, [[a] for a in answers])]
