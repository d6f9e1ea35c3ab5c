"""TIFA160: does a question bank's item score agree with people on prompt adherence?

Protocol (DSG, Cho et al., ICLR 2024, Table 3; its `tifa160_correlation.py`): 160 prompts × five
generators (mini-dalle, sd1dot1, sd1dot5, sd2dot1, vq-diffusion), 800 images, each rated 1-5 for
consistency with its prompt by several people (`tifa160-likert-anns.csv`). Each image's questions
(DSG-1k's propositions of the prompt, `dsg-1k-anns.csv`) were answered by a VQA model; the answers
are replayed from their file (`caprecon.models.recorded`). A question scores 1 when answered yes,
else 0 (an empty answer, or one neither yes nor no, is 0); gated, a question whose parent scored 0
scores 0; the item's score is the mean over all its answered questions
(`caprecon.metrics.claims.item_score`); an image with no recorded answer scores 0 (DSG's script
does the same). Spearman ρ and Kendall τ_b of the item score against the mean Likert rating of
the image, over every rated image, gated and ungated.

One detail of DSG's script is kept to reproduce it: its proposition file spells a few dependencies
with a word among the ids (`1, outside`), which its reader cannot parse, and it then drops every
dependency of that prompt (its items are scored ungated). `run_tifa160` does the same and says
how many prompts it concerned.

Bootstrap intervals resample prompts (the five images of a prompt share its questions, so they are
not independent), with `caprecon.stats.bootstrap`.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from caprecon.apps.metabench.request import MetaError
from caprecon.data.judgments import JudgmentFormatError
from caprecon.data.loaders.dsg import LikertRatings, Proposition, read_likert, read_propositions
from caprecon.metrics.claims import answer_score, item_score
from caprecon.models.recorded import RecordedJudge, image_key
from caprecon.stats.agreement import MetaRow
from caprecon.stats.bootstrap import bootstrap_ci, bootstrap_tau
from caprecon.stats.correlation import kendall_tau, spearman

TIFA160 = "tifa160"
GATES = ("gated", "ungated")


@dataclass(frozen=True)
class ImageScore:
    generator: str
    item_id: str
    gated: float
    ungated: float
    human: float  # mean Likert rating
    n_questions: int


def score_images(propositions: dict[str, list[Proposition]], judge: RecordedJudge,
                 ratings: LikertRatings) -> tuple[list[ImageScore], list[str]]:
    """Each rated image's item score, gated and ungated, beside its mean rating; and notes."""
    unparsed = {item for item, props in propositions.items() if any(p.dependency_problem for p in props)}
    out, unanswered = [], 0
    for generator, item in ratings.ratings:
        answers = judge.answers(image_key(generator, item))
        unanswered += not answers
        scores = {qid: answer_score(row.answer) for qid, row in answers.items()}
        parents = {} if item in unparsed else {p.proposition_id: p.parents for p in propositions.get(item, [])}
        score = item_score(scores, parents)
        out.append(ImageScore(generator, item, score.gated, score.ungated, ratings.mean((generator, item)), score.n))
    rated_items = {item for _, item in ratings.ratings}
    notes = []
    if unanswered:
        notes.append(f"{unanswered} rated image(s) have no recorded answer: scored 0, as DSG's script does")
    if hit := sorted(unparsed & rated_items):
        notes.append(f"{len(hit)} prompt(s) ({', '.join(hit)}) have a dependency that is not a list of ids in "
                     "the proposition file: scored without their dependencies, as DSG's script does")
    if missing := sorted(rated_items - set(propositions)):
        notes.append(f"{len(missing)} rated prompt(s) have no propositions: gated as ungated")
    return out, notes


def agreement_rows(images: list[ImageScore], name: str, *, n_bootstrap: int, seed: int) -> list[MetaRow]:
    """Spearman ρ and Kendall τ_b of the item score against the mean rating, gated and ungated;
    intervals from resampling prompts."""
    human = np.array([i.human for i in images])
    groups = [i.item_id for i in images]
    rows = []
    for gate in GATES:
        score = np.array([getattr(i, gate) for i in images])
        tau = kendall_tau(score, human, "b")
        low, high = bootstrap_tau(score, human, groups, variant="b", n_resamples=n_bootstrap, seed=seed)
        rho_low, rho_high = bootstrap_ci(lambda idx: spearman(score[idx], human[idx]), groups,
                                         n_resamples=n_bootstrap, seed=seed)
        rows.append(MetaRow(TIFA160, f"{name}/{gate}", "tau_b", tau, low, high, len(images), len(images), 0, spearman=spearman(score, human), tau_b=tau,
                            extra={"spearman_ci_low": rho_low, "spearman_ci_high": rho_high}))
    return rows


def run_tifa160(judgments: list[Path] | None, questions: Path | None, answers: Path | None, *,
                n_bootstrap: int, seed: int, out: Path | None) -> tuple[list[MetaRow], list[str], list[ImageScore]]:
    """`caprecon meta --benchmark tifa160 --judgments LIKERT --questions DSG --answers ANSWERS`."""
    if not judgments or len(judgments) != 1 or questions is None or answers is None:
        raise MetaError("--benchmark tifa160 takes --judgments tifa160-likert-anns.csv, --questions dsg-1k-anns.csv "
                        "and --answers FILE (recorded answers, e.g. pali17b_dsg.csv)")
    try:
        ratings = read_likert(judgments[0])
        propositions = read_propositions(questions).by_item()
        judge = RecordedJudge(answers)
    except JudgmentFormatError as exc:
        raise MetaError(str(exc)) from None
    images, notes = score_images(propositions, judge, ratings)
    rows = agreement_rows(images, Path(answers).stem, n_bootstrap=n_bootstrap, seed=seed)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        with (out / "scores-tifa160.csv").open("w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh)
            writer.writerow(["t2i_model", "item_id", "gated", "ungated", "human", "n_questions"])
            for i in images:
                writer.writerow([i.generator, i.item_id, i.gated, i.ungated, i.human, i.n_questions])
    return rows, notes, images


def rows_json(rows: list[MetaRow], notes: list[str]) -> str:
    """The rows as strict JSON (NaN as null), for `--json`."""
    def clean(value: Any) -> Any:
        return None if isinstance(value, float) and not math.isfinite(value) else value

    return json.dumps({"rows": [{k: clean(v) for k, v in r.as_dict().items()} for r in rows], "notes": notes},
                      ensure_ascii=False, indent=1)
