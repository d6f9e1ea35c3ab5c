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

Box questions score by IoU >= threshold (the raw IoUs are averaged into `turing_iou`).
Across rows, `caprecon.report` weights categories by their question counts.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

from ..models.generator import TextToImage
from ..models.vlm import VisionLanguageModel
from ..qa import QAItem, build_prompt, grade, infer_coords, load_qa_bank, to_normalized
from ..reconstruct import ReconstructionSpec
from ..models.common import describe_model
from ..samples import LoadedSample
from .base import Context, Metric
from .judging import LazyImages, answers


def in_source_terms(item: QAItem, source_size: tuple[int, int]) -> QAItem:
    """A box answer in fractions of the source image, so that it can be compared with a box
    the judge gives on an image of another size (the reconstruction keeps the aspect ratio)."""
    if item.type != "box":
        return item
    coords = item.coords or infer_coords(item.answer, source_size)
    return replace(item, answer=to_normalized(item.answer, coords, source_size), coords="normalized")


class CaptionTuringTest(Metric):
    name = "turing"

    def __init__(self, generator: TextToImage, judge: VisionLanguageModel, bank: str | Path | dict[str, list[QAItem]],
                 spec: ReconstructionSpec | None = None, *, upper: bool = True, max_new_tokens: int = 32,
                 iou_threshold: float = 0.5, judge_box_coords: str | None = None, **spec_options: Any):
        self.generator = generator
        self.judge = judge
        self.bank = load_qa_bank(bank) if isinstance(bank, (str, Path)) else bank
        self.spec = spec or ReconstructionSpec(**spec_options)
        self.upper = upper
        self.max_new_tokens = max_new_tokens
        self.iou_threshold = iou_threshold
        self.judge_box_coords = judge_box_coords  # the judge's box convention (Qwen2-VL: "1000"), else inferred

    def describe(self) -> dict[str, Any]:
        return {"metric": self.name, "judge": describe_model(self.judge), "generator": describe_model(self.generator),
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
            views["turing_upper"] = [(images.add(it.image_key, lambda it=it: it.image), it.image.size) for it in items]

        rows: list[dict[str, Any]] = [r.record() for r in recons]
        graded: dict[str, list[list[tuple[QAItem, str, bool]]]] = {}
        for field, seen in views.items():
            asks, owners = [], []
            for row, (item, (key, size)) in enumerate(zip(items, seen)):
                for q in self.bank[item.sample.image_id]:
                    asks.append((key, build_prompt(q, box_coords=self.judge_box_coords)))
                    owners.append((row, q, size))
            replies = answers(ctx, self.judge, asks, images, self.max_new_tokens)
            correct: list[dict[str, list[float]]] = [defaultdict(list) for _ in items]
            ious: list[list[float]] = [[] for _ in items]
            graded[field] = [[] for _ in items]
            for (row, q, size), answer in zip(owners, replies):
                result = grade(in_source_terms(q, items[row].image.size), answer, image_size=size,
                               pred_coords=self.judge_box_coords, iou_threshold=self.iou_threshold)
                if q.type == "box":
                    ious[row].append(result.iou)
                correct[row][q.category].append(float(result.correct))
                graded[field][row].append((q, answer, bool(result.correct)))
            for row, per_cat in enumerate(correct):
                everything = [v for values in per_cat.values() for v in values]
                rows[row][field] = sum(everything) / len(everything)
                if field == "turing":
                    rows[row]["turing_n"] = len(everything)
                    if ious[row]:
                        rows[row]["turing_iou"] = sum(ious[row]) / len(ious[row])
                for cat, values in per_cat.items():
                    rows[row][f"{field}/{cat}"] = sum(values) / len(values)
                    if field == "turing":
                        rows[row][f"turing_n/{cat}"] = len(values)
        if self.upper:
            for row, on_recon, on_source in zip(rows, graded["turing"], graded["turing_upper"]):
                row["turing_gap"] = row["turing_upper"] - row["turing"]
                # both lists follow the bank's order for the row's image, so they pair up question by question
                row["turing_flipped"] = [_flip(q, source_answer, recon_answer)
                                         for (q, recon_answer, right_on_recon), (_, source_answer, right_on_source)
                                         in zip(on_recon, on_source) if right_on_source and not right_on_recon]
        return rows


def _flip(q: QAItem, on_original: str, on_reconstruction: str) -> dict[str, Any]:
    flip = {"question": q.question, "category": q.category, "answer": q.answer, "on_original": on_original,
            "on_reconstruction": on_reconstruction}
    if q.choices:
        flip["choices"] = list(q.choices)
    return flip
