"""The question bank: questions about images, and the prompts that ask them.

A bank is a JSONL file, one question per line:

    {"image_id": "img1", "question": "What colour is the bus?", "category": "colour",
     "type": "mc", "choices": ["red", "blue", "green"], "answer": "B"}

Fields: `image_id`, `question` and `type` are required; `category` (default ""),
`id` (default "<image_id>#<n>"), `choices` (mc only), `coords` (box only) and `parents`
are optional; any other field is kept in `QAItem.meta`. `parents` lists the ids of other
questions about the same image that this one presupposes (DSG's dependencies: "What colour
is the dog?" presupposes "Is there a dog?"); the Caption Turing Test scores a question 0
on an image where one of its parents was answered wrong. Types and their answers:

- `mc`: `choices` is a list of at least two options, lettered A, B, C... in order;
  `answer` is the correct option's letter or its text.
- `yesno`: `answer` is yes or no.
- `short`: `answer` is a word or phrase, compared after VQA-style normalisation.
- `box`: `answer` is [x1, y1, x2, y2]; `coords` says its convention (see below).

Box coordinates come in three conventions: "normalized" (fractions of the width and
height, 0-1), "1000" (Qwen-VL's 0-1000 grid over each side) and "pixel". A bank box
without `coords` has its convention inferred when it is graded. A judge's own
convention is a property of its model family (`judge_box_coords`: Qwen3-VL and Qwen2-VL
"1000", Qwen2.5-VL "pixel", in pixels of the image after its processor resized it).
Grading lives in `caprecon.metrics.grading`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from caprecon.core.records import read_jsonl

QUESTION_TYPES = ("mc", "yesno", "short", "box")
COORDS = ("normalized", "1000", "pixel")
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"

# The box convention of a judge's own grounding answers, by model family (a model type as
# transformers names it, or a served model's name): first match wins. Qwen2.5-VL answers
# in absolute pixels of its resized input; Qwen2-VL and Qwen3-VL on a 0-1000 grid.
_FAMILY_COORDS = (("qwen2_5_vl", "pixel"), ("qwen2.5-vl", "pixel"), ("qwen3_vl", "1000"), ("qwen3-vl", "1000"),
                  ("qwen2_vl", "1000"), ("qwen2-vl", "1000"))

Box = tuple[float, float, float, float]


class QABankError(ValueError):
    """A bank line that cannot be used: the message names the file, line and problem."""


@dataclass(frozen=True)
class QAItem:
    image_id: str
    question: str
    type: str
    answer: Any  # mc: the correct letter; yesno: "yes"/"no"; short: the text; box: (x1, y1, x2, y2)
    category: str = ""
    choices: tuple[str, ...] = ()
    id: str = ""
    coords: str | None = None  # box convention of `answer`; None: inferred when grading
    meta: dict[str, Any] = field(default_factory=dict, compare=False)
    parents: tuple[str, ...] = ()  # ids of questions about the same image this one presupposes

    @property
    def options(self) -> tuple[str, ...]:
        """What a judge picks from: the letters of an mc item, Yes/No for a yes/no item."""
        if self.type == "mc":
            return tuple(LETTERS[: len(self.choices)])
        if self.type == "yesno":
            return ("Yes", "No")
        raise ValueError(f"a {self.type} question has no options")

    @property
    def correct_option(self) -> str:
        return self.answer if self.type == "mc" else ("Yes" if self.answer == "yes" else "No")


# ---------------------------------------------------------------------------------------
# loading


def load_qa_bank(path: str | Path) -> dict[str, list[QAItem]]:
    """Questions per image id, in file order. Blank lines are skipped; any problem raises
    `QABankError` naming the line."""
    path = Path(path)
    bank: dict[str, list[QAItem]] = {}
    seen: dict[str, str] = {}
    asked: dict[tuple[str, str], str] = {}  # (image, question as compared) -> its line
    for where, record in read_jsonl(path, QABankError):
        item = parse_item(record, where)
        # the same question twice about one image would count twice in its accuracy (and may disagree)
        question = (item.image_id, " ".join(item.question.split()).casefold())
        if question in asked:
            raise QABankError(f"{where}: image {item.image_id!r} is asked this question on line {asked[question]} "
                              "already")
        asked[question] = where.rsplit(":", 1)[1]
        if not item.id:
            item = replace(item, id=f"{item.image_id}#{len(bank.get(item.image_id, []))}")
        if item.id in seen:
            raise QABankError(f"{where}: id {item.id!r} already used on line {seen[item.id]}")
        seen[item.id] = where.rsplit(":", 1)[1]
        bank.setdefault(item.image_id, []).append(item)
    check_parents(bank, path)
    return bank


def check_parents(bank: dict[str, list[QAItem]], source: Any = "bank") -> None:
    """Each question's parents must be other questions about the same image, without a cycle."""
    for image_id, items in bank.items():
        ids = {item.id: item for item in items}
        for item in items:
            for parent in item.parents:
                if parent == item.id or parent not in ids:
                    what = "itself" if parent == item.id else f"{parent!r}, which is no question about this image"
                    raise QABankError(f"{source}: question {item.id!r} of image {image_id!r} has as parent {what}")
        state: dict[str, int] = {}  # 1: being visited, 2: done

        def visit(qid: str, path: tuple[str, ...]) -> None:
            if state.get(qid) == 2:
                return
            if state.get(qid) == 1:
                raise QABankError(f"{source}: the parents of image {image_id!r} form a cycle: "
                                  f"{' -> '.join((*path, qid))}")
            state[qid] = 1
            for parent in ids[qid].parents:
                visit(parent, (*path, qid))
            state[qid] = 2

        for item in items:
            visit(item.id, ())


def parse_item(record: Any, where: str = "item") -> QAItem:
    """One bank record as a `QAItem` (its id "" when the record has none); `where`
    prefixes error messages."""

    def fail(problem: str):
        raise QABankError(f"{where}: {problem}")

    if not isinstance(record, dict):
        fail(f"expected a JSON object, got {type(record).__name__}")
    for key in ("image_id", "question", "type", "answer"):
        if key not in record:
            fail(f"missing field {key!r}")
    image_id, question, kind = str(record["image_id"]), record["question"], record["type"]
    if not isinstance(question, str) or not question.strip():
        fail("question must be a non-empty string")
    if kind not in QUESTION_TYPES:
        fail(f"unknown type {kind!r}; use one of {', '.join(QUESTION_TYPES)}")
    raw_choices = record.get("choices")
    if kind != "mc" and raw_choices:
        fail(f"choices are for mc questions, not {kind}")
    coords = record.get("coords")
    if coords is not None and kind != "box":
        fail(f"coords is for box questions, not {kind}")
    answer = record["answer"]
    choices: tuple[str, ...] = ()
    try:
        if kind == "mc":
            if not isinstance(raw_choices, list) or len(raw_choices) < 2:
                fail("an mc question needs 'choices': a list of at least two options")
            if len(raw_choices) > len(LETTERS):
                fail(f"at most {len(LETTERS)} choices")
            choices = tuple(str(c) for c in raw_choices)
            if len({norm_choice(c) for c in choices}) < len(choices):
                fail(f"two choices read the same: {list(choices)}")
            answer = _mc_answer(str(answer), choices)
        elif kind == "yesno":
            answer = YES_NO.get(str(answer).strip().lower())
            if answer is None:
                fail(f"a yesno answer must be yes or no, got {record['answer']!r}")
        elif kind == "short":
            if not isinstance(answer, (str, int, float)) or not normalize_short(str(answer)):
                fail(f"a short answer must be a non-empty word or phrase, got {answer!r}")
            answer = str(answer)
        else:
            if coords is not None and coords not in COORDS:
                fail(f"unknown coords {coords!r}; use one of {', '.join(COORDS)}")
            answer = _answer_box(answer, coords)
    except ValueError as e:
        if isinstance(e, QABankError):
            raise
        fail(str(e))
    parents = record.get("parents") or []
    if not isinstance(parents, list) or not all(isinstance(p, (str, int)) and not isinstance(p, bool)
                                                for p in parents):
        fail(f"parents must be a list of question ids, not {record.get('parents')!r}")
    known = {"image_id", "question", "type", "answer", "category", "choices", "id", "coords", "parents"}
    return QAItem(image_id=image_id, question=question.strip(), type=kind, answer=answer,
                  category=str(record.get("category") or ""), choices=choices,
                  id=str(record.get("id") or ""), coords=coords,
                  meta={k: v for k, v in record.items() if k not in known},
                  parents=tuple(dict.fromkeys(str(p) for p in parents)))


def _mc_answer(answer: str, choices: tuple[str, ...]) -> str:
    """The letter of the correct option, given its letter or its text."""
    letters = LETTERS[: len(choices)]
    by_text = [letters[i] for i, c in enumerate(choices) if norm_choice(c) == norm_choice(answer)]
    by_letter = answer.strip().upper() if len(answer.strip()) == 1 and answer.strip().upper() in letters else None
    if by_text and by_letter and by_text[0] != by_letter:
        raise ValueError(f"answer {answer!r} is ambiguous: it is the letter of option {by_letter} "
                         f"({choices[letters.index(by_letter)]!r}) and the text of option {by_text[0]}; "
                         f"give the other option's text instead")
    if by_letter or by_text:
        return by_letter or by_text[0]
    listed = ", ".join(f"{letters[i]}. {c}" for i, c in enumerate(choices))
    raise ValueError(f"answer {answer!r} is neither an option letter nor one of the choices ({listed})")


def _answer_box(value: Any, coords: str | None) -> Box:
    if not isinstance(value, (list, tuple)) or len(value) != 4:
        raise ValueError(f"a box answer must be [x1, y1, x2, y2], got {value!r}")
    try:
        box = tuple(float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"a box answer must hold four numbers, got {value!r}") from None
    if not all(math.isfinite(v) and v >= 0 for v in box):
        raise ValueError(f"box coordinates must be finite and non-negative, got {list(value)}")
    x1, y1, x2, y2 = box
    if x2 <= x1 or y2 <= y1:
        raise ValueError(f"a box needs x1 < x2 and y1 < y2, got {list(value)}")
    limit = {"normalized": 1.0, "1000": 1000.0}.get(coords or "")
    if limit is not None and max(box) > limit:
        raise ValueError(f"coords is {coords!r} but the box goes beyond {limit:g}: {list(value)}")
    return box  # type: ignore[return-value]


def judge_box_coords(family: str | None) -> str | None:
    """The box convention of a model family (see `_FAMILY_COORDS`); None when not known."""
    name = (family or "").lower()
    return next((coords for key, coords in _FAMILY_COORDS if key in name), None)


# ---------------------------------------------------------------------------------------
# prompts

_INSTRUCTIONS = {
    "mc": "Answer with the option's letter from the given choices directly.",
    "yesno": "Answer the question with yes or no.",
    "short": "Answer the question using a single word or phrase.",
    "box": "Answer with the bounding box as [x1, y1, x2, y2].",
}
_BOX_UNITS = {
    "normalized": " Give the coordinates as fractions of the image width and height, from 0 to 1.",
    "1000": " Give the coordinates on a 0-1000 scale over the image width and height.",
    "pixel": " Give the coordinates in pixels.",
}


def build_prompt(item: QAItem, *, box_coords: str | None = None) -> str:
    """The user turn that asks `item`: the question, the lettered options for mc, and how
    to answer. For box questions `box_coords` adds the coordinate convention to ask for
    (grade with the same `pred_coords`)."""
    parts = [item.question]
    if item.type == "mc":
        parts += [f"{letter}. {choice}" for letter, choice in zip(LETTERS, item.choices)]
    instruction = _INSTRUCTIONS[item.type]
    if item.type == "box" and box_coords is not None:
        if box_coords not in COORDS:
            raise ValueError(f"unknown box_coords {box_coords!r}; use one of {', '.join(COORDS)}")
        instruction += _BOX_UNITS[box_coords]
    parts.append(instruction)
    return "\n".join(parts)


# ---------------------------------------------------------------------------------------
# normalisation

_ARTICLES = {"a", "an", "the"}
_NUMBER_WORDS = {"none": "0", "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5",
                 "six": "6", "seven": "7", "eight": "8", "nine": "9", "ten": "10", "eleven": "11",
                 "twelve": "12"}
YES_NO = {"yes": "yes", "y": "yes", "yeah": "yes", "yep": "yes", "true": "yes", "correct": "yes",
          "no": "no", "n": "no", "nope": "no", "false": "no", "incorrect": "no"}


def normalize_short(text: str) -> str:
    """VQA-style normalisation of a short answer: lowercase; thousands separators and
    punctuation dropped (a decimal point kept); apostrophes dropped, so a contraction
    matches with or without one ("don't" = "dont"); articles a/an/the removed; number
    words up to twelve as digits ("two" -> "2"); whitespace collapsed."""
    text = text.lower().strip()
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)  # 1,000 -> 1000
    text = re.sub(r"['’`]", "", text)
    text = re.sub(r"(?<!\d)\.|\.(?!\d)", " ", text)  # a period that is not a decimal point
    text = re.sub(r"[^\w\s.]|_", " ", text)
    words = [_NUMBER_WORDS.get(w, w) for w in text.split() if w not in _ARTICLES]
    return " ".join(words)


def norm_choice(text: str) -> str:
    """Case- and punctuation-insensitive form of an option's text."""
    return " ".join(re.sub(r"[^\w\s]|_", " ", str(text).lower()).split())
