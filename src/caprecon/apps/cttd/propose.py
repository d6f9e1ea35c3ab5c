"""Stage 2: a VLM proposes candidate questions for each selected image.

Run only when the categories are discovered (`taxonomy="discover"`); with a given
taxonomy (the paper's 15 by default) stages 2 and 3 are skipped. The prompt asks for a
JSON list; `--propose-prompt` replaces it (it must keep `{n}`).
"""

from __future__ import annotations

from typing import Any

from tqdm.auto import tqdm

from caprecon.metrics.judging import LazyImages
from caprecon.core.replies import ParseTally, ReplyShapeError, read_replies
from caprecon.apps.cttd.stage import Job, entry_image, fill, vlm_replies, write_jsonl

FOLDER = "02-propose"
OUTPUT = "questions.jsonl"

PROMPT = (
    "Look at the image and write {n} different questions about it that a person could answer by looking at the "
    "image carefully. Cover different abilities: recognising objects and attributes, counting, reading text, "
    "spatial relations, actions and poses, the scene and its context, reasoning about what is happening. "
    "Reply with JSON only: {\"questions\": [\"...\", \"...\"]}"
)
SHAPE = '{"questions": ["...", "..."]}'


def shape_questions(value: Any) -> tuple[list[str], bool]:
    adjusted = not (isinstance(value, dict) and set(value) == {"questions"})
    if isinstance(value, dict):
        lists = [v for v in value.values() if isinstance(v, list)]
        if len(lists) != 1:
            raise ReplyShapeError("expected an object holding one list of questions")
        value = lists[0]
    if not isinstance(value, list):
        raise ReplyShapeError(f"expected a list of questions, got {type(value).__name__}")
    out = []
    for q in value:
        if isinstance(q, dict):
            q, adjusted = q.get("question") or q.get("q"), True
        if isinstance(q, str) and q.strip():
            out.append(q.strip())
    if not out:
        raise ReplyShapeError("no questions in the reply")
    return out, adjusted


def run(job: Job, images: list[dict[str, Any]]) -> None:
    cfg = job.config
    prompt = fill(cfg.propose_prompt or PROMPT, n=cfg.questions_per_image)
    job.manifest["prompt"] = prompt
    tally, rejects, records = ParseTally(), [], []
    vlm = job.models.vlm
    for entry in tqdm(images, desc="propose: questions", unit="image", disable=not job.progress):
        lazy = LazyImages()
        key = lazy.add(entry["key"], lambda e=entry: entry_image(e))
        replies = vlm_replies(job.ctx, vlm, [(key, prompt)], lazy, cfg.max_new_tokens)
        [questions] = read_replies(
            replies, shape_questions, SHAPE,
            lambda prompts: vlm_replies(job.ctx, vlm, [(key, p) for p in prompts], lazy, cfg.max_new_tokens),
            tally, rejects, [{"image_id": entry["image_id"]}])
        seen = set()
        for q in questions or []:
            if q.lower() not in seen:
                seen.add(q.lower())
                records.append({"image_id": entry["image_id"], "question": q})
    write_jsonl(job.folder / OUTPUT, records)
    write_jsonl(job.folder / "rejects.jsonl", rejects)
    if tally.dropped:
        job.drop("reply unreadable after retry", tally.dropped)
    job.manifest["replies"] = tally.to_dict()
    job.manifest["counts"] = {"images": len(images), "questions": len(records)}
