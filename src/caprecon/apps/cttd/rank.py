"""Stage 6: rank each image's pairs by relevance minus redundancy and keep the top k.

The Caption Turing Test paper's Eq. 7, in a joint image-text space (the build's matcher,
CLIP by default):

    s(q_i, e) = cos(q_i, e) - alpha * (1/n) * sum_{j=1..n} cos(q_i, q_j)

with q_i the embedding of the i-th pair's text (question and answer), e the image's, n the
image's number of candidates (the sum includes j = i, as written; that adds the same
alpha/n to every pair, so it changes no ranking). alpha = 0 ranks by relevance alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tqdm.auto import tqdm

from caprecon.models.embedder import l2_normalise
from caprecon.data.qa import LETTERS, parse_item
from caprecon.store.index import content_key
from caprecon.apps.cttd.categorise import text_embeddings
from caprecon.apps.cttd.stage import Job, entry_image, write_jsonl

FOLDER = "06-rank"
OUTPUT = "bank.jsonl"


def relevance_diversity(qa: np.ndarray, image: np.ndarray, alpha: float) -> np.ndarray:
    """Eq. 7 for every row of `qa` (n, d) against one image embedding (d,)."""
    q = l2_normalise(np.atleast_2d(qa)).astype(np.float64)
    e = l2_normalise(np.asarray(image)).astype(np.float64).reshape(-1)
    return q @ e - alpha * (q @ q.T).mean(axis=1)


def top_k(scores: np.ndarray, k: int) -> list[int]:
    """Indices of the k highest scores, best first; ties keep candidate order."""
    return [int(i) for i in np.argsort(-np.asarray(scores), kind="stable")[:k]]


def qa_text(record: dict[str, Any]) -> str:
    """What is embedded for a pair: the question and its answer in words (a box's answer
    has no words, so its question stands alone)."""
    if record["type"] == "mc":
        answer = record["choices"][LETTERS.index(record["answer"])]
    elif record["type"] == "box":
        return record["question"]
    else:
        answer = record["answer"]
    return f"{record['question']} {answer}"


def image_embeddings(job: Job, entries: list[dict[str, Any]]) -> np.ndarray:
    matcher = job.models.matcher
    keys = [content_key("matcher-image-embedding", model=matcher.fingerprint, image=e["key"]) for e in entries]

    def compute(order: list[int]) -> list[np.ndarray]:
        images = [entry_image(entries[i]) for i in order]
        with job.ctx.model_call():
            return list(matcher.embed_images(images))

    return job.ctx.cached_arrays("matcher-image-embedding", keys, compute)


def run(job: Job, images: list[dict[str, Any]], kept: list[dict[str, Any]]) -> None:
    cfg = job.config
    by_image: dict[str, list[dict[str, Any]]] = {}
    for record in kept:
        by_image.setdefault(record["image_id"], []).append(record)
    bank, scored = [], []
    for entry in tqdm(images, desc="rank: relevance-diversity", unit="image", disable=not job.progress):
        records = by_image.get(entry["image_id"], [])
        if not records:
            continue
        [e] = image_embeddings(job, [entry])
        scores = relevance_diversity(text_embeddings(job, [qa_text(r) for r in records]), e, cfg.alpha)
        best = top_k(scores, cfg.top_k)
        for i, record in enumerate(records):
            scored.append({"id": record["id"], "image_id": record["image_id"], "score": round(float(scores[i]), 6),
                           "kept": i in best})
        for i in best:
            bank.append({**records[i], "rank_score": round(float(scores[i]), 6)})
        beyond = len(records) - len(best)
        if beyond:
            job.drop("beyond the top k", beyond)
    # a parent beyond the top k no longer gates its child: it was checked on the image, but is not asked
    kept_ids = {record["id"] for record in bank}
    for record in bank:
        if "parents" in record:
            parents = [p for p in record["parents"] if p in kept_ids]
            if parents:
                record["parents"] = parents
            else:
                del record["parents"]
    for record in bank:  # what is written is what `turing` reads
        parse_item(record, record["id"])
    write_jsonl(job.folder / OUTPUT, bank)
    write_jsonl(job.folder / "scores.jsonl", scored)
    job.manifest["counts"] = {"in": len(kept), "out": len(bank)}
