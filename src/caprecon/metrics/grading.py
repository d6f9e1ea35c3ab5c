"""The answer grader: whether a free-form reply answers a bank question.

The Caption Turing Test, CaptionQA, CTTD curation and the task suites all grade here, so
one reply gets one grade wherever it is asked.

- mc: the option's letter ("B", "(b)", "B. blue", "Answer: B") or its text, case- and
  punctuation-insensitive;
- yesno: the first word, or the only yes/no word present;
- short: exact match after `normalize_short` (VQA-style);
- box: the reply's first four numbers as [x1, y1, x2, y2], right when its IoU with the
  answer box is at least the threshold.

A box's convention ("normalized", "1000", "pixel"; see `caprecon.data.qa`) is taken from
an explicit value where there is one (the bank's `coords`; for a reply, the convention
of the judge that gave it, `BoxReading`) and otherwise inferred:

1. every value <= 1: normalized;
2. with the image size known: a value beyond the image's width (x) or height (y) means
   1000, else pixel. A 0-1000 box that happens to fit inside an image larger than it
   reads as pixels here, so inference is a last resort, and `grade` records when it had
   to guess;
3. without the image size, pixel and 1000 cannot be told apart: two boxes in the same
   convention, known or not, are compared as they are (IoU does not change when both
   boxes are scaled alike); otherwise grading asks for the image size.

A pixel reply counts pixels of the image the judge was given after its processor made it
its input (Qwen2.5-VL resizes): that size is the reply's frame. The judge may look at
another image than the one the answer box was drawn on (a reconstruction): the answer
box is then taken to fractions of its own image first, which carry over because the
reconstruction keeps the aspect ratio.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any, Sequence

from caprecon.data.qa import COORDS, LETTERS, YES_NO, Box, QAItem, norm_choice, normalize_short

Size = tuple[int, int]  # (width, height) in pixels


@dataclass(frozen=True)
class Grade:
    correct: bool
    parsed: Any  # what was read from the prediction: a letter, yes/no, the normalised text, a box; None if nothing
    iou: float | None = None  # box questions: IoU with the answer box (0 when no box could be read)
    coords_guessed: bool = False  # box questions: the prediction's convention was inferred from its values


@dataclass(frozen=True)
class BoxReading:
    """How one judge's box replies are read: in `coords` (None: unknown, so each reply's
    convention is inferred from its values), and pixel replies in pixels of the frame the
    judge makes of the image it is given (its `box_frame`, where it has one)."""

    coords: str | None = None
    judge: Any = None

    def __post_init__(self) -> None:
        if self.coords is not None and self.coords not in COORDS:
            raise ValueError(f"box coords must be one of {', '.join(COORDS)}, not {self.coords!r}")

    @classmethod
    def of(cls, judge: Any, override: str | None = None) -> BoxReading:
        """`judge`'s replies read in `override` where given, else in the judge's own
        convention (its `box_coords`: its model family's, or its option)."""
        return cls(override if override is not None else getattr(judge, "box_coords", None), judge)

    def frame(self, size: Size) -> Size | None:
        """What a pixel reply about an image of `size` counts pixels of; None for the other
        conventions, or a judge that does not say (the image itself)."""
        if self.coords != "pixel" or not callable(getattr(self.judge, "box_frame", None)):
            return None
        return tuple(self.judge.box_frame(size))  # type: ignore[return-value]


def grade_reply(item: QAItem, reply: str, reading: BoxReading, *, seen_size: Size, source_size: Size | None = None,
                iou_threshold: float = 0.5) -> Grade:
    """Grade a judge's `reply` to `item`, its boxes read as `reading` says; `seen_size` is
    the image the judge looked at, `source_size` the one the answer box was drawn on
    (default: the same)."""
    frame = reading.frame(seen_size) if item.type == "box" else None
    return grade(item, reply, image_size=seen_size, source_size=source_size or seen_size,
                 pred_coords=reading.coords, pred_frame=frame, iou_threshold=iou_threshold)


def score_answer(item: QAItem, prediction: str, *, image_size: Size | None = None, source_size: Size | None = None,
                 pred_coords: str | None = None, iou_threshold: float = 0.5,
                 pred_frame: Size | None = None) -> float:
    """1.0 if `prediction` answers `item` correctly, else 0.0 (see `grade`)."""
    return float(grade(item, prediction, image_size=image_size, source_size=source_size, pred_coords=pred_coords,
                       iou_threshold=iou_threshold, pred_frame=pred_frame).correct)


def grade(item: QAItem, prediction: str, *, image_size: Size | None = None, source_size: Size | None = None,
          pred_coords: str | None = None, iou_threshold: float = 0.5, pred_frame: Size | None = None) -> Grade:
    """Grade a free-form answer (module doc). For box questions: `image_size` is the image
    the prediction is about; `source_size`, where given, the image the answer box was
    drawn on (its box is taken to fractions of it first); `pred_coords` the prediction's
    convention (inferred if None); `pred_frame` the size a pixel prediction counts pixels
    of (default `image_size`)."""
    prediction = str(prediction)
    if item.type == "mc":
        letter = read_choice(prediction, item.choices)
        return Grade(letter == item.answer, letter)
    if item.type == "yesno":
        said = read_yes_no(prediction)
        return Grade(said == item.answer, said)
    if item.type == "short":
        said = normalize_short(prediction)
        return Grade(said == normalize_short(item.answer), said or None)
    box = read_box(prediction)
    if box is None:
        return Grade(False, None, 0.0)
    if source_size is not None:
        item = _in_source_terms(item, source_size)
    guessed = pred_coords is None
    if pred_coords is None and image_size is not None:
        pred_coords = infer_coords(box, image_size)
    compared = box
    if pred_coords == "pixel" and pred_frame is not None:
        compared, pred_coords = to_normalized(box, "pixel", pred_frame), "normalized"
    iou = box_iou(item.answer, compared, image_size=image_size, a_coords=item.coords, b_coords=pred_coords)
    return Grade(iou >= iou_threshold, box, iou, coords_guessed=guessed)


def _in_source_terms(item: QAItem, source_size: Size) -> QAItem:
    """A box item with its answer in fractions of the image it was drawn on."""
    coords = item.coords or infer_coords(item.answer, source_size)
    return replace(item, answer=to_normalized(item.answer, coords, source_size), coords="normalized")


def read_choice(prediction: str, choices: Sequence[str]) -> str | None:
    """The option letter a free-form answer picks, or None.

    In order: the whole answer is an option's text; the answer is a letter, alone or
    wrapped and punctuated ("B", "(B)", "B." , "b)"), after an optional "answer:" /
    "the answer is" / "option", and possibly followed by text ("B. blue"); exactly one
    option's text occurs in the answer as whole words.
    """
    letters = LETTERS[: len(choices)]
    said = norm_choice(prediction)
    texts = [norm_choice(c) for c in choices]
    if said in texts:
        return letters[texts.index(said)]
    head = re.sub(r"^\s*(?:(?:the\s+)?(?:correct\s+)?answer\s*(?:is)?\s*[:\-]?|option)\s*", "", prediction.strip(),
                  flags=re.IGNORECASE)
    m = re.match(r"^[\(\[]?([A-Za-z])(?:[\)\]]|\s*[.:)\]]|\s*$)", head)
    if m and m.group(1).upper() in letters:
        return m.group(1).upper()
    found = [letters[i] for i, t in enumerate(texts) if t and re.search(rf"\b{re.escape(t)}\b", said)]
    return found[0] if len(found) == 1 else None


def read_yes_no(prediction: str) -> str | None:
    words = norm_choice(prediction).split()
    if not words:
        return None
    if words[0] in YES_NO:
        return YES_NO[words[0]]
    present = {w for w in words if w in ("yes", "no")}
    return present.pop() if len(present) == 1 else None


_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?")


def read_box(prediction: str) -> Box | None:
    """The first four numbers in the text as (x1, y1, x2, y2), each axis put in order; None
    with fewer than four. Digits inside words ("x1") are not numbers."""
    numbers = [float(n) for n in _NUMBER.findall(prediction)[:4]]
    if len(numbers) < 4:
        return None
    x1, y1, x2, y2 = numbers
    return (min(x1, x2), min(y1, y2), max(x1, x2), max(y1, y2))


def infer_coords(box: Sequence[float], image_size: Size | None = None) -> str | None:
    """The inferred convention of a box (module doc, rules 1-2); None when it is pixel or
    1000 and there is no image size to tell which."""
    if max(box) <= 1:
        return "normalized"
    if image_size is None:
        return None
    width, height = image_size
    return "1000" if max(box[0], box[2]) > width or max(box[1], box[3]) > height else "pixel"


def to_normalized(box: Sequence[float], coords: str, image_size: Size | None = None) -> Box:
    """A box in fractions of the image's width and height."""
    if coords == "normalized":
        return tuple(float(v) for v in box)  # type: ignore[return-value]
    if coords == "1000":
        return tuple(float(v) / 1000 for v in box)  # type: ignore[return-value]
    if coords == "pixel":
        if image_size is None:
            raise ValueError(f"box {list(box)} is in pixels: pass image_size to compare it with another convention")
        width, height = image_size
        return (box[0] / width, box[1] / height, box[2] / width, box[3] / height)
    raise ValueError(f"unknown coords {coords!r}; use one of {', '.join(COORDS)}")


def box_iou(a: Sequence[float], b: Sequence[float], *, image_size: Size | None = None,
            a_coords: str | None = None, b_coords: str | None = None) -> float:
    """Intersection over union of two [x1, y1, x2, y2] boxes, each in its own convention
    (given, or inferred as the module doc says)."""
    ca = a_coords or infer_coords(a, image_size)
    cb = b_coords or infer_coords(b, image_size)
    if ca == cb:  # one convention, known or not: IoU does not change when both boxes are scaled alike
        return _iou(a, b)
    if ca is None or cb is None:
        raise ValueError(f"cannot tell whether box {list(a if ca is None else b)} is in pixels or 0-1000 "
                         f"coordinates without the image size; pass image_size or the box's coords")
    return _iou(to_normalized(a, ca, image_size), to_normalized(b, cb, image_size))


def _iou(a: Sequence[float], b: Sequence[float]) -> float:
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def mc_from_probs(item: QAItem, option_probs: Sequence[float]) -> tuple[str | None, list[float], float]:
    """From a judge's probabilities for `item.options` (in that order): the predicted
    option, the probabilities normalised to sum to 1, and P(correct answer).

    When every probability is 0 (no option in a server's top-k, say) nothing is known:
    the distribution is uniform and no option is predicted.
    """
    options = item.options
    if len(option_probs) != len(options):
        raise ValueError(f"{item.id}: {len(option_probs)} probabilities for {len(options)} options {list(options)}")
    probs = [float(p) for p in option_probs]
    if any(not math.isfinite(p) or p < 0 for p in probs):
        raise ValueError(f"{item.id}: probabilities must be finite and non-negative, got {probs}")
    total = sum(probs)
    if total <= 0:
        uniform = [1.0 / len(options)] * len(options)
        return None, uniform, uniform[0]
    normalised = [p / total for p in probs]
    best = max(range(len(options)), key=lambda i: normalised[i])
    return options[best], normalised, normalised[options.index(item.correct_option)]
