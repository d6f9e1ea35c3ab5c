"""CaptionQA: a text-only LLM answers the image's QA bank from the caption alone.

S = (1/k) Σ 1[a_i = J(C, q_i)] over the image's k questions. The LLM may answer that the
caption does not say ("cannot answer"; an extra option for multiple choice), which
counts as wrong: a caption is rewarded only for what it states.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

from caprecon.models.llm import TextLLM
from caprecon.core.describe import describe_model
from caprecon.data.qa import QAItem, build_prompt, load_qa_bank
from caprecon.data.images import LoadedSample
from caprecon.store.index import content_key
from caprecon.metrics.categories import CategoryTally
from caprecon.metrics.base import Column, Context, Metric
from caprecon.metrics.grading import score_answer
from caprecon.models.build import model_of

CANNOT = "Cannot answer from the description"
PREAMBLE = (
    "You cannot see the image. Here is a description of it:\n\"{caption}\"\n\n"
    "Answer the question using only what the description states. If it does not give the answer, "
)


def captionqa_prompt(caption: str, item: QAItem) -> str:
    if item.type == "mc":
        item = replace(item, choices=[*item.choices, CANNOT])
        tail = f"choose the option \"{CANNOT}\".\n\n"
    else:
        tail = "reply exactly: cannot answer.\n\n"
    return PREAMBLE.replace("{caption}", caption.strip()) + tail + build_prompt(item)


class CaptionQA(Metric):
    columns = (Column("captionqa", low=0.0, high=1.0),)

    def __init__(self, llm: TextLLM, bank: str | Path | dict[str, list[QAItem]], *, max_new_tokens: int = 32,
                 iou_threshold: float = 0.5):
        self.llm = model_of("llm", llm)
        self.bank = load_qa_bank(bank) if isinstance(bank, (str, Path)) else bank
        self.max_new_tokens = max_new_tokens
        self.iou_threshold = iou_threshold

    @classmethod
    def from_roles(cls, roles: Any, config: Any) -> CaptionQA:
        bank = roles.qa_bank  # a bad bank is found before any model loads
        return cls(roles.llm, bank, iou_threshold=config.iou_threshold)

    def describe(self) -> dict[str, Any]:
        return {"metric": self.name, "llm": describe_model(self.llm), "questions": sum(len(v) for v in self.bank.values())}

    def score(self, items: Sequence[LoadedSample], ctx: Context) -> list[dict[str, Any]]:
        prompts, owners = [], []
        for row, item in enumerate(items):
            questions = self.bank.get(item.sample.image_id)
            if not questions:
                raise ValueError(f"no questions in the QA bank for image_id {item.sample.image_id!r}")
            for q in questions:
                prompts.append(captionqa_prompt(item.caption, q))
                owners.append((row, q))
        keys = [content_key("llm-answer", model=self.llm.fingerprint, prompt=p, max_new_tokens=self.max_new_tokens)
                for p in prompts]

        def compute(order: list[int]) -> list[str]:
            with ctx.model_call():
                return self.llm.generate([prompts[i] for i in order], max_new_tokens=self.max_new_tokens)

        answers = ctx.cached("llm-answer", keys, compute, model=self.llm)
        tallies = [CategoryTally() for _ in items]
        for (row, q), answer in zip(owners, answers):
            size = items[row].size
            tallies[row].add(q.category, score_answer(q, answer, image_size=size, source_size=size,
                                                      iou_threshold=self.iou_threshold))
        return [tally.fields("captionqa") for tally in tallies]
