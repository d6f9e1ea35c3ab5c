"""Grading one reply, and turning graded questions into a dataset's number.

Rules (rule-based throughout, no LLM answer extraction):

- mc / yesno / box: as every bank question is graded (`caprecon.metrics.grading`): an
  option's letter or text; the first yes/no word; a box in the judge's own convention.
- math: the reply's number is the first after "answer is" / "answer:" when the reply
  says so, else its last number. Numbers are read with thousands commas dropped
  ("1,234"), fractions ("3/4", "\\frac{3}{4}") as their value, and units or currency
  around them ignored ("12 cm", "$5"). A reply with a percent sign matches a gold number
  equal to its value or to its value / 100 ("45%" answers 45 and 0.45). Right when
  within `abs_tol` or `rel_tol`·|gold| of the gold number, or equal after rounding both
  to the row's `precision`. A gold answer that is no number is compared as text (VQA
  normalisation); a gold option letter without option texts is matched by letter.
- ocr `contains` (OCRBench's rule): an accepted answer, lower-cased and stripped, occurs
  in the lower-cased reply; for handwritten mathematical expressions spaces and line
  breaks are dropped on both sides first. ocr `exact` (OCRVQA): the reply equals an
  accepted answer after VQA normalisation.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Sequence

from caprecon.data.qa import normalize_short
from caprecon.metrics.grading import BoxReading, grade_reply
from caprecon.apps.suites.entries import SuiteEntry
from caprecon.apps.suites.loaders import BenchQuestion

_FRACTION = r"-?\d+(?:\.\d+)?\s*/\s*\d+(?:\.\d+)?"
_DECIMAL = r"-?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_NUMBER = re.compile(rf"(?<![\w.])(?:{_FRACTION}|{_DECIMAL})")
_ANSWER_MARK = re.compile(r"answer\s*(?:is|:)\s*", re.IGNORECASE)
_LATEX_FRAC = re.compile(r"\\d?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_HANDWRITTEN = "handwritten mathematical expression recognition"


def _clean_numbers(text: str) -> str:
    text = _LATEX_FRAC.sub(r"(\1)/(\2)", str(text))
    text = re.sub(r"\\[,;!]|\\%|[{}$€£¥]|\\left|\\right", lambda m: "%" if m.group() == "\\%" else " ", text)
    text = re.sub(r"\((-?\d+(?:\.\d+)?)\)", r"\1", text)  # (3)/(4) from \frac
    return re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", text)


def _value(token: str) -> float:
    if "/" in token:
        top, bottom = (float(p) for p in token.split("/"))
        return top / bottom if bottom else math.nan
    return float(token)


def read_number(text: str, *, gold: bool = False) -> tuple[float, bool] | None:
    """(value, had a percent sign) of the number a text gives, or None.

    A gold answer gives its first number; a reply the first number after "answer is" /
    "answer:", else its last."""
    cleaned = _clean_numbers(text)
    if not gold:
        marks = list(_ANSWER_MARK.finditer(cleaned))
        if marks:
            after = cleaned[marks[-1].end():]
            if _NUMBER.search(after):
                cleaned = after
                gold = True  # first number after the mark
    found = list(_NUMBER.finditer(cleaned))
    if not found:
        return None
    match = found[0] if gold else found[-1]
    value = _value(match.group().replace(" ", ""))
    if not math.isfinite(value):
        return None
    percent = cleaned[match.end():].lstrip().startswith("%") or bool(re.match(r"\s*percent", cleaned[match.end():]))
    return value, percent


def _close(a: float, b: float, entry: SuiteEntry, precision: int | None) -> bool:
    if precision is not None and round(a, precision) == round(b, precision):
        return True
    return abs(a - b) <= max(entry.abs_tol, entry.rel_tol * abs(b))


def grade_math(question: BenchQuestion, reply: str, entry: SuiteEntry) -> bool:
    gold_text = question.answer
    if re.fullmatch(r"[A-Za-z]", gold_text.strip()):  # an option letter whose options are in the question text
        head = _ANSWER_MARK.split(reply)[-1].strip()
        m = re.match(r"^[\(\[]?([A-Za-z])(?:[\)\]]|\s*[.:)\]]|\s*$)", head)
        return bool(m) and m.group(1).upper() == gold_text.strip().upper()
    gold = read_number(gold_text, gold=True)
    if gold is None:  # a worded answer
        return normalize_short(reply) == normalize_short(gold_text)
    said = read_number(reply)
    if said is None:
        return False
    value, percent = said
    precision = question.meta.get("precision")
    candidates = [value, value / 100] if percent and not gold[1] else [value]
    return any(_close(v, gold[0], entry, precision) for v in candidates)


def grade_ocr(question: BenchQuestion, reply: str, entry: SuiteEntry) -> bool:
    if entry.match == "exact":
        said = normalize_short(reply)
        return any(said == normalize_short(a) for a in question.answer)
    said = reply.lower().strip()
    accepted = [a.lower().strip() for a in question.answer]
    if question.category.lower().strip() == _HANDWRITTEN:
        said = re.sub(r"\s+", "", said)
        accepted = [re.sub(r"\s+", "", a) for a in accepted]
    return any(a in said for a in accepted)


@dataclass(frozen=True)
class Graded:
    correct: bool
    iou: float | None = None


def grade(question: BenchQuestion, reply: str, entry: SuiteEntry, *, source_size: tuple[int, int],
          seen_size: tuple[int, int], reading: BoxReading = BoxReading()) -> Graded:
    """Grade the judge's reply; `source_size` is the original's (width, height), `seen_size`
    that of the image the judge looked at, `reading` how the judge's boxes read."""
    reply = str(reply)
    if question.type == "math":
        return Graded(grade_math(question, reply, entry))
    if question.type == "ocr":
        return Graded(grade_ocr(question, reply, entry))
    result = grade_reply(question.item, reply, reading, seen_size=seen_size, source_size=source_size,
                         iou_threshold=entry.iou_threshold)
    return Graded(result.correct, result.iou)


def dataset_scores(entry: SuiteEntry, questions: Sequence[BenchQuestion], graded: Sequence[Graded]) -> dict[str, Any]:
    """The dataset's numbers, in percent: `score` (the headline) and what goes with it
    (`accuracy`, `accuracy_plus`, `miou`), plus `n` and per-category accuracy. The headline
    is the accuracy, except for grounding: the mean IoU (the Caption Turing Test paper's
    grounding number), with the accuracy at IoU >= `iou_threshold` beside it."""
    if not graded:
        return {"score": math.nan, "n": 0}
    correct = [float(g.correct) for g in graded]
    out: dict[str, Any] = {"accuracy": 100 * sum(correct) / len(correct), "n": len(correct)}
    if entry.metric == "accuracy+":
        groups: dict[str, list[float]] = {}
        for q, c in zip(questions, correct):
            groups.setdefault(q.group, []).append(c)
        out["accuracy_plus"] = 100 * sum(all(v) for v in groups.values()) / len(groups)
    out["score"] = out["accuracy"]
    if entry.metric == "grounding":
        ious = [g.iou or 0.0 for g in graded]
        out["miou"] = out["score"] = 100 * sum(ious) / len(ious)
        out["iou_threshold"] = entry.iou_threshold
    by_category: dict[str, list[float]] = {}
    for q, c in zip(questions, correct):
        if q.category:
            by_category.setdefault(q.category, []).append(c)
    if by_category:
        out["categories"] = {k: 100 * sum(v) / len(v) for k, v in sorted(by_category.items())}
    return out
