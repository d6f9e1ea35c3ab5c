"""Stage 4: for each image and category, a VLM writes m candidate question-answer pairs.

The reply must be JSON (see `replies`): read strictly, else repaired locally, else the
model is asked once more with its reply and the error, else the reply is dropped, counted
and kept in `rejects.jsonl`. Pairs come in the bank's types (mc, yesno, short, box);
common key and type spellings are mapped to the bank's ("options" -> "choices",
"multiple choice" -> "mc"). Whether a pair is complete and well-formed is curation's
business (stage 5), so nothing is silently lost here.

Dependencies (DSG's): a pair may name, by their positions in the same reply, the earlier pairs
it presupposes (`depends_on`: "What colour is the dog?" presupposes "Is there a dog?"); they
become the record's `parents` (the ids of those pairs). A position that is not an earlier
pair's is left out and counted ("dependency on no earlier pair").
"""

from __future__ import annotations

import re
from typing import Any

from tqdm.auto import tqdm

from caprecon.metrics.judging import LazyImages
from caprecon.core.replies import ParseTally, ReplyShapeError, read_replies
from caprecon.apps.cttd.stage import Job, entry_image, fill, vlm_replies, write_jsonl

FOLDER = "04-generate"
OUTPUT = "candidates.jsonl"

PROMPT = (
    "You are writing test questions about this image, in the category \"{category}\": {description}\n\n"
    "Write {m} different question-answer pairs in this category. Each answer must be checkable by looking at "
    "the image, and each question must make sense on its own. Use these answer types:\n{types}\n\n"
    "When a question presupposes an earlier one of your pairs (a question about the colour of the dog presupposes "
    "the one asking whether there is a dog), list the earlier pairs' positions (from 0) in \"depends_on\".\n\n"
    "Reply with JSON only, in this shape:\n"
    "{\"qas\": [{\"question\": \"...\", \"type\": \"mc\", \"choices\": [\"...\", \"...\", \"...\", \"...\"], "
    "\"answer\": \"...\", \"depends_on\": []}]}"
)
SHAPE = ('{"qas": [{"question": "...", "type": "mc|yesno|short|box", "choices": ["..."], "answer": "...", '
         '"depends_on": []}]}')

TYPE_HELP = {
    "mc": "- \"mc\": multiple choice; \"choices\" is a list of 3 to 5 options, \"answer\" is the correct option's "
          "text.",
    "yesno": "- \"yesno\": \"answer\" is \"yes\" or \"no\".",
    "short": "- \"short\": \"answer\" is a single word or a short phrase.",
    "box": "- \"box\": the question asks where one object is; \"answer\" is its bounding box [x1, y1, x2, y2]{units}.",
}
BOX_UNITS = {"normalized": " as fractions of the image width and height (0 to 1)",
             "1000": " on a 0-1000 scale over the image width and height", "pixel": " in pixels"}

_KEYS = {"question": ("question", "q", "query", "prompt"),
         "type": ("type", "question_type", "answer_type", "kind", "format"),
         "choices": ("choices", "options", "candidates", "alternatives"),
         "answer": ("answer", "a", "ans", "correct_answer", "solution", "bbox", "box"),
         "depends_on": ("depends_on", "dependencies", "parents", "depends")}
_TYPES = {"mc": "mc", "multiple choice": "mc", "multiple-choice": "mc", "multiple_choice": "mc", "mcq": "mc",
          "choice": "mc", "yesno": "yesno", "yes/no": "yesno", "yes_no": "yesno", "yes-no": "yesno",
          "boolean": "yesno", "short": "short", "short answer": "short", "short_answer": "short", "open": "short",
          "free-form": "short", "box": "box", "bbox": "box", "bounding box": "box", "grounding": "box"}


def types_help(types: list[str], box_coords: str) -> str:
    return "\n".join(TYPE_HELP[t].replace("{units}", BOX_UNITS[box_coords]) for t in types)


def normalise_type(value: Any) -> Any:
    return _TYPES.get(re.sub(r"\s+", " ", str(value).strip().lower()), value)


def shape_qas(value: Any) -> tuple[list[dict[str, Any]], bool]:
    """(pair dicts with the bank's key names, whether any name had to be mapped)."""
    adjusted = not (isinstance(value, dict) and set(value) == {"qas"})
    if isinstance(value, dict):
        if any(k in value for k in _KEYS["question"]):
            value = [value]  # one pair given bare
        else:
            lists = [v for v in value.values() if isinstance(v, list)]
            if len(lists) != 1:
                raise ReplyShapeError("expected an object holding one list of question-answer pairs")
            value = lists[0]
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ReplyShapeError("expected a list of question-answer objects")
    pairs = []
    for raw in value:
        pair = {}
        for field, names in _KEYS.items():
            name = next((n for n in names if n in raw), None)
            if name is not None:
                pair[field] = raw[name]
                adjusted |= name != field
        if "question" not in pair:
            continue
        kind = pair.get("type", "short" if "choices" not in pair else "mc")
        pair["type"] = normalise_type(kind)
        adjusted |= pair["type"] != kind
        pairs.append(pair)
    if not pairs:
        raise ReplyShapeError("no object in the reply has a question")
    return pairs, adjusted


def run(job: Job, images: list[dict[str, Any]], taxonomy) -> None:
    cfg = job.config
    types = list(cfg.types)
    template = cfg.generate_prompt or PROMPT
    help_text = types_help(types, cfg.box_coords)
    job.manifest["prompt"] = template
    job.manifest["type_help"] = help_text
    prompts = {c.name: fill(template, category=c.name, description=c.description, m=cfg.qas_per_category,
                            types=help_text) for c in taxonomy}
    tally, rejects, records = ParseTally(), [], []
    vlm = job.models.vlm
    for entry in tqdm(images, desc="generate: QA pairs", unit="image", disable=not job.progress):
        lazy = LazyImages()
        key = lazy.add(entry["key"], lambda e=entry: entry_image(e))
        asks = [(key, prompts[c.name]) for c in taxonomy]
        replies = vlm_replies(job.ctx, vlm, asks, lazy, cfg.max_new_tokens)
        parsed = read_replies(
            replies, shape_qas, SHAPE,
            lambda again: vlm_replies(job.ctx, vlm, [(key, p) for p in again], lazy, cfg.max_new_tokens),
            tally, rejects, [{"image_id": entry["image_id"], "category": c.name} for c in taxonomy])
        for category, pairs in zip(taxonomy, parsed):
            if pairs and len(pairs) > cfg.qas_per_category:
                job.drop("more than m pairs in a reply", len(pairs) - cfg.qas_per_category)
            for k, pair in enumerate((pairs or [])[: cfg.qas_per_category]):
                pair = dict(pair)
                positions = pair.pop("depends_on", [])
                positions = positions if isinstance(positions, list) else [positions]
                earlier = sorted({p for p in positions if isinstance(p, int) and not isinstance(p, bool) and 0 <= p < k})
                if len(earlier) < len(positions):
                    job.drop("dependency on no earlier pair", len(positions) - len(earlier))
                record = {"id": f"{entry['image_id']}#{category.name}#{k}", "image_id": entry["image_id"],
                          "category": category.name, **pair, "source": entry["source"], "image": entry["path"]}
                if earlier:
                    record["parents"] = [f"{entry['image_id']}#{category.name}#{p}" for p in earlier]
                if pair["type"] == "box":
                    record["coords"] = cfg.box_coords
                records.append(record)
    write_jsonl(job.folder / OUTPUT, records)
    write_jsonl(job.folder / "rejects.jsonl", rejects)
    if tally.dropped:
        job.drop("reply unreadable after retry", tally.dropped)
    job.manifest["replies"] = tally.to_dict()
    job.manifest["counts"] = {"images": len(images), "asks": len(images) * len(taxonomy), "pairs": len(records)}
