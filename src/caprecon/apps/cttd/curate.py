"""Stage 5: keep the pairs that are complete, correct and not redundant.

Per image, in this order (each pair dropped by the first check it fails, with that reason);
the judge comes before the near-duplicates as in the paper ("discard pairs with missing
answers or answers flagged as inconsistent with the image, remove near-duplicates with
identical answers"), so a pair the judge accepts survives although an earlier twin of it
was refuted:

1. **missing answer**: no answer, or an empty one;
2. **type not asked for**: a type outside the build's `types`;
3. **malformed**: not a valid bank item (e.g. an mc answer that is none of the choices, a
   box that is not four ordered numbers) — the bank's own reader decides;
4. **judge disagrees**: the judge, looking at the original image, answers otherwise
   (graded by the one grader, `caprecon.metrics.grading`, as the Caption Turing Test
   grades: boxes by IoU >= 0.5, read in the judge's own convention unless
   `judge_box_coords` says otherwise). Asked for the pairs that survived 1-3, and cached:
   the same judge's upper-bound answers in a later `turing` run are these;
5. **near-duplicate**: question embedding cosine above `qa_duplicate_cos` with an earlier
   kept pair of the same image *and* the same answer;
6. **answerable without the image** (`blind_filter`, on by default): a text-only LLM, shown
   neither the image nor any caption, answers an mc question correctly under each of
   `blind_permutations` rotations of its choices (leaked options, common sense), or a
   short-answer question correctly. Yes/no questions are exempt: a coin flip passes half.
   With `blind_keep` such a pair stays in the bank, flagged (`"blind": true`), instead;
   the stage's counts say how many were found either way (`blind`), and the datasheet too;
7. **parent dropped**: a pair that presupposes (`parents`) a pair dropped above goes too:
   a question about the colour of a dog that is not there has no right answer.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from caprecon.data.qa import LETTERS, QABankError, QAItem, build_prompt, normalize_short, parse_item
from caprecon.metrics.grading import BoxReading, grade, grade_reply
from caprecon.metrics.judging import LazyImages, answers
from caprecon.apps.cttd.categorise import text_embeddings
from caprecon.apps.cttd.stage import Job, entry_image, llm_replies, write_jsonl

FOLDER = "05-curate"
OUTPUT = "kept.jsonl"

BLIND_PREAMBLE = ("This question is about an image you cannot see. Give your best guess anyway, in the form "
                  "asked for.\n\n")


def bank_record(item: QAItem) -> dict[str, Any]:
    """A `QAItem` as a bank line that `load_qa_bank` reads back to the same item."""
    record: dict[str, Any] = {"id": item.id, "image_id": item.image_id, "category": item.category,
                              "question": item.question, "type": item.type}
    if item.type == "mc":
        record["choices"] = list(item.choices)
    record["answer"] = list(item.answer) if item.type == "box" else item.answer
    if item.type == "box" and item.coords:
        record["coords"] = item.coords
    if item.parents:
        record["parents"] = list(item.parents)
    return {**record, **item.meta}


def answer_key(item: QAItem) -> Any:
    """What 'the same answer' means across two pairs."""
    if item.type == "mc":
        return ("text", normalize_short(item.choices[LETTERS.index(item.answer)]))
    if item.type == "box":
        return ("box", tuple(round(v, 3) for v in item.answer))
    return ("text", normalize_short(str(item.answer)))


def _missing(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, str):
        return not value.strip()
    if isinstance(value, (list, tuple, dict)):
        return len(value) == 0
    return False


def rotations(item: QAItem, count: int) -> list[QAItem]:
    """The mc item with its choices rotated 0..count-1 places (answer letter following)."""
    n = len(item.choices)
    correct = LETTERS.index(item.answer)
    out = []
    for shift in range(min(count, n)):
        choices = item.choices[shift:] + item.choices[:shift]
        out.append(replace(item, choices=choices, answer=LETTERS[(correct - shift) % n]))
    return out


def run(job: Job, images: list[dict[str, Any]], candidates: list[dict[str, Any]]) -> None:
    cfg = job.config
    by_image: dict[str, list[dict[str, Any]]] = {}
    for record in candidates:
        by_image.setdefault(record["image_id"], []).append(record)
    kept_all, dropped_all = [], []

    blind = [0]  # pairs the blind LLM answered right, dropped or (blind_keep) flagged

    def drop(record: dict[str, Any], reason: str, detail: str = "") -> None:
        job.drop(reason)
        dropped_all.append({**record, "dropped": reason, **({"detail": detail} if detail else {})})

    for entry in tqdm(images, desc="curate: checking pairs", unit="image", disable=not job.progress):
        items: list[tuple[QAItem, dict[str, Any]]] = []
        for record in by_image.get(entry["image_id"], []):
            if _missing(record.get("answer")):
                drop(record, "missing answer")
            elif record.get("type") not in cfg.types:
                drop(record, "type not asked for", str(record.get("type")))
            else:
                try:
                    items.append((parse_item(record, record["id"]), record))
                except QABankError as exc:
                    drop(record, "malformed", str(exc))
        items = _judge_agrees(job, entry, items, drop)
        items = _without_duplicates(job, items, drop)
        if cfg.blind_filter:
            items = _needs_image(job, items, drop, blind)
        items = _with_parents(items, drop)
        kept_all += [bank_record(item) for item, _ in items]
    write_jsonl(job.folder / OUTPUT, kept_all)
    write_jsonl(job.folder / "dropped.jsonl", dropped_all)
    job.manifest["counts"] = {"in": len(candidates), "out": len(kept_all),
                              **({"blind": blind[0]} if cfg.blind_filter else {})}
    job.manifest["blind_prompt"] = BLIND_PREAMBLE if cfg.blind_filter else None


def _without_duplicates(job: Job, items, drop):
    if len(items) < 2:
        return items
    vectors = text_embeddings(job, [item.question for item, _ in items])
    kept: list[int] = []
    for i, (item, record) in enumerate(items):
        twin = next((j for j in kept if float(vectors[i] @ vectors[j]) > job.config.qa_duplicate_cos
                     and answer_key(items[j][0]) == answer_key(item)), None)
        if twin is None:
            kept.append(i)
        else:
            drop(record, "near-duplicate", f"of {items[twin][0].id}")
    return [items[i] for i in kept]


def _judge_agrees(job: Job, entry: dict[str, Any], items, drop):
    cfg = job.config
    if not cfg.judge_check or not items:
        return items
    lazy = LazyImages()
    key = lazy.add(entry["key"], lambda: entry_image(entry))
    reading = BoxReading.of(job.models.judge, cfg.judge_box_coords)
    asks = [(key, build_prompt(item, box_coords=reading.coords)) for item, _ in items]
    replies = answers(job.ctx, job.models.judge, asks, lazy, cfg.judge_max_new_tokens)  # turing's cache entries
    size = (entry["width"], entry["height"])
    kept = []
    for (item, record), reply in zip(items, replies):
        result = grade_reply(item, reply, reading, seen_size=size)
        if result.correct:
            kept.append((item, record))
        else:
            drop(record, "judge disagrees", f"judge said {reply!r}")
    return kept


def _with_parents(items, drop):
    """The pairs whose parents are all still kept (parents come first: a reply names earlier pairs)."""
    kept, ids = [], set()
    for item, record in items:
        missing = [p for p in item.parents if p not in ids]
        if missing:
            drop(record, "parent dropped", f"{', '.join(missing)}")
        else:
            kept.append((item, record))
            ids.add(item.id)
    return kept


def _needs_image(job: Job, items, drop, blind: list[int]):
    cfg = job.config
    asks: list[tuple[int, QAItem]] = []
    for i, (item, _) in enumerate(items):
        if item.type == "mc":
            asks += [(i, rotated) for rotated in rotations(item, cfg.blind_permutations)]
        elif item.type == "short":
            asks.append((i, item))
    if not asks:
        return items
    replies = llm_replies(job.ctx, job.models.llm, [BLIND_PREAMBLE + build_prompt(q) for _, q in asks],
                          cfg.judge_max_new_tokens)
    right = np.ones(len(items), dtype=bool)
    asked = np.zeros(len(items), dtype=bool)
    for (i, q), reply in zip(asks, replies):
        asked[i] = True
        right[i] &= grade(q, reply).correct
    kept = []
    for i, (item, record) in enumerate(items):
        if not (asked[i] and right[i]):
            kept.append((item, record))
            continue
        blind[0] += 1
        if cfg.blind_keep:
            kept.append((replace(item, meta={**item.meta, "blind": True}), record))
        else:
            drop(record, "answerable without the image")
    return kept
