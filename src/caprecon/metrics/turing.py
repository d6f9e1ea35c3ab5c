"""The Caption Turing Test: can a judge answer questions about the image from Î alone?

For each sample, the judge answers the QA bank's questions about its image twice: once
looking at the reconstruction Î (the score) and once at the original I (the upper bound,
cached once per image however many captions share it). Reported per row:

    turing          accuracy over the row's questions, on Î
    turing_upper    the same questions on I
    turing_gap      turing_upper - turing
    turing_n        questions asked
    turing/<cat>, turing_upper/<cat>, turing_n/<cat>   the same per question category
    turing_flipped  the questions answered right on I but wrong on Î, with both answers
                    (what a reader of the report looks at first; empty when none flipped)

A question with `parents` in the bank (DSG's dependencies) counts as wrong on an image where
one of its parents was answered wrong (DSG's gate: no credit for the colour of a dog the
judge did not see); with such questions the row also carries `turing_ungated` (and
`turing_upper_ungated`), the accuracy without the gate, and `turing_gated`, how many
questions the gate set to wrong on Î.

Box questions score by IoU >= `iou_threshold` (the raw IoUs are averaged into `turing_iou`).
The judge's answers are read in its own box convention (`box_coords`: a property of the
judge, from its model family or its options; `judge_box_coords` overrides it), pixel
answers in pixels of the image its processor made; the prompt names the convention. Only
for a judge whose convention is unknown are answers read by their values, and the row
then counts them in `turing_box_coords_guessed`. `judges_for` gives some categories their
own judge (the paper: Qwen2.5-VL-72B for grounding, Qwen3-VL-8B for the rest).
Across rows, `caprecon.report` weights categories by their question counts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from caprecon.core.describe import describe_model
from caprecon.models.generator import TextToImage
from caprecon.models.vlm import VisionLanguageModel
from caprecon.data.qa import COORDS, QAItem, build_prompt, load_qa_bank
from caprecon.reconstruct.reconstructor import ReconstructionSpec
from caprecon.data.images import LoadedSample
from caprecon.metrics.categories import CategoryTally
from caprecon.metrics.base import Column, Context, Metric
from caprecon.metrics.grading import BoxReading, grade_reply
from caprecon.metrics.judging import LazyImages, answers
from caprecon.models.build import model_of


class CaptionTuringTest(Metric):
    columns = (Column("turing", low=0.0, high=1.0, needs_source_image=True, needs_judge=True),
               Column("turing_upper", low=0.0, high=1.0, needs_source_image=True, needs_judge=True),
               # how much the reconstruction loses against the source image: smaller is better
               Column("turing_gap", higher_is_better=False, low=-1.0, high=1.0, needs_source_image=True,
                      needs_judge=True),
               Column("turing_iou", low=0.0, high=1.0, needs_source_image=True, needs_judge=True))

    def __init__(self, generator: TextToImage, judge: VisionLanguageModel, bank: str | Path | dict[str, list[QAItem]],
                 spec: ReconstructionSpec | None = None, *, upper: bool = True, max_new_tokens: int = 32,
                 iou_threshold: float = 0.5, judge_box_coords: str | None = None,
                 judges_for: Mapping[str, VisionLanguageModel] | None = None, **spec_options: Any):
        if not 0 < iou_threshold <= 1:
            raise ValueError(f"iou_threshold must be in (0, 1], not {iou_threshold!r}")
        if judge_box_coords is not None and judge_box_coords not in COORDS:
            raise ValueError(f"judge_box_coords must be one of {', '.join(COORDS)}, not {judge_box_coords!r}")
        self.generator = model_of("generator", generator)
        self.judge = model_of("judge", judge)
        self.judges_for = dict(judges_for or {})  # category -> the judge of that category's questions
        self.bank = load_qa_bank(bank) if isinstance(bank, (str, Path)) else bank
        self.spec = spec or ReconstructionSpec(**spec_options)
        self.upper = upper
        self.max_new_tokens = max_new_tokens
        self.iou_threshold = iou_threshold
        self.judge_box_coords = judge_box_coords  # overrides the default judge's own convention

    @classmethod
    def from_roles(cls, roles: Any, config: Any) -> CaptionTuringTest:
        bank = roles.qa_bank  # a bad bank is found before any model loads
        return cls(roles.generator, roles.judge, bank, config.spec, iou_threshold=config.iou_threshold,
                   judges_for=roles.judges_for)

    def judge_of(self, category: str) -> VisionLanguageModel:
        return self.judges_for.get(category, self.judge)

    def reading_of(self, judge: VisionLanguageModel) -> BoxReading:
        """How the judge's box answers are read (coords None: unknown, guessed per answer and
        recorded); `judge_box_coords` is the default judge's only."""
        return BoxReading.of(judge, self.judge_box_coords if judge is self.judge else None)

    def describe(self) -> dict[str, Any]:
        return {"metric": self.name, "judge": describe_model(self.judge), "generator": describe_model(self.generator),
                "judges_for": {cat: describe_model(j) for cat, j in self.judges_for.items()},
                "box_coords": {cat: self.reading_of(self.judge_of(cat)).coords or "guessed per answer"
                               for cat in ["", *self.judges_for]},
                "questions": sum(len(v) for v in self.bank.values()), "images_in_bank": len(self.bank),
                "iou_threshold": self.iou_threshold, "upper_bound": self.upper}

    def score(self, items: Sequence[LoadedSample], ctx: Context) -> list[dict[str, Any]]:
        for item in items:
            if not self.bank.get(item.sample.image_id):
                raise ValueError(f"no questions in the QA bank for image_id {item.sample.image_id!r}")
        recons = ctx.reconstructor(self.generator, self.spec).reconstruct(items)
        images = LazyImages()
        # what the judge looks at, per row: (image key, size); opened only if an answer is missing
        views = {"turing": [(images.add(r.key, r.image), (r.width, r.height)) for r in recons]}
        if self.upper:
            views["turing_upper"] = [(images.add(it.image_key, lambda it=it: it.image), it.size) for it in items]

        rows: list[dict[str, Any]] = [r.record() for r in recons]
        # per field and row, each question's (item, answer, right) by its position in the bank
        graded: dict[str, list[dict[int, tuple[QAItem, str, bool]]]] = {}
        for field, seen in views.items():
            # questions per judge: with a judge per category, each judge answers its own in one batch
            asks: dict[int, list] = {}
            owners: dict[int, list] = {}
            judges: dict[int, VisionLanguageModel] = {}
            for row, (item, (key, size)) in enumerate(zip(items, seen)):
                for index, q in enumerate(self.bank[item.sample.image_id]):
                    judge = self.judge_of(q.category)
                    slot = id(judge)
                    judges[slot] = judge
                    asks.setdefault(slot, []).append((key, build_prompt(q, box_coords=self.reading_of(judge).coords)))
                    owners.setdefault(slot, []).append((row, q, size, index))
            ious: list[list[float]] = [[] for _ in items]
            guessed = [0] * len(items)
            graded[field] = [{} for _ in items]
            for slot, judge in judges.items():
                reading = self.reading_of(judge)
                replies = answers(ctx, judge, asks[slot], images, self.max_new_tokens)
                for (row, q, size, index), answer in zip(owners[slot], replies):
                    result = grade_reply(q, answer, reading, seen_size=size, source_size=items[row].size,
                                         iou_threshold=self.iou_threshold)
                    if q.type == "box":
                        ious[row].append(result.iou)
                        guessed[row] += result.coords_guessed
                    graded[field][row][index] = (q, answer, bool(result.correct))
            for row, item in enumerate(items):
                questions = self.bank[item.sample.image_id]
                right = gated_right(questions, [graded[field][row][i][2] for i in range(len(questions))])
                tally = CategoryTally()
                for q, correct in zip(questions, right):
                    tally.add(q.category, float(correct))
                rows[row].update(tally.fields(field, counts=field == "turing"))
                if any(q.parents for q in questions):
                    ungated = [graded[field][row][i][2] for i in range(len(questions))]
                    rows[row][f"{field}_ungated"] = sum(ungated) / len(ungated)
                    if field == "turing":
                        rows[row]["turing_gated"] = sum(u and not r for u, r in zip(ungated, right))
                if ious[row]:
                    rows[row][f"{field}_iou"] = sum(ious[row]) / len(ious[row])
                if guessed[row]:
                    # the judge's convention is unknown: these answers' conventions were read off their values
                    rows[row][f"{field}_box_coords_guessed"] = guessed[row]
        if self.upper:
            for row, on_recon, on_source in zip(rows, graded["turing"], graded["turing_upper"]):
                row["turing_gap"] = row["turing_upper"] - row["turing"]
                row["turing_flipped"] = [_flip(q, on_source[i][1], recon_answer)
                                         for i, (q, recon_answer, right_on_recon) in sorted(on_recon.items())
                                         if on_source[i][2] and not right_on_recon]
        return rows


def gated_right(questions: Sequence[QAItem], right: Sequence[bool]) -> list[bool]:
    """Each question's grade after DSG's gate: wrong when any of its parents (by id, among
    `questions`) was answered wrong by its own answer; else its own grade."""
    by_id = {q.id: ok for q, ok in zip(questions, right)}
    return [ok and all(by_id.get(p, False) for p in q.parents) for q, ok in zip(questions, right)]


def _flip(q: QAItem, on_original: str, on_reconstruction: str) -> dict[str, Any]:
    flip = {"question": q.question, "category": q.category, "answer": q.answer, "on_original": on_original,
            "on_reconstruction": on_reconstruction}
    if q.choices:
        flip["choices"] = list(q.choices)
    return flip
