"""Stage 3: question categories, found by clustering proposed questions, or the paper's 15.

The questions from stage 2 are embedded by the build's text embedder (the matcher: a joint
image-text space such as CLIP, or a sentence encoder), clustered by DBSCAN over cosine
distance, and an LLM names and describes each cluster from its most central questions.
DBSCAN's noise points (questions in no dense region) form no category.

`PAPER_TAXONOMY` is the Caption Turing Test paper's result of this stage: 15 categories,
each with the paper's description (appendix, "QA Category"). It is the default, so a
build can skip stages 2 and 3. The main text calls the grounding category "detection";
its tables and appendix call it "Grounding", the name used here.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np


@dataclass(frozen=True)
class Category:
    name: str
    description: str
    size: int = 0  # questions in its cluster (0 for a given taxonomy)
    examples: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "examples": list(self.examples)}


PAPER_TAXONOMY: tuple[Category, ...] = tuple(Category(n, d) for n, d in [
    ("perception", "Basic visual perception and object recognition: identifying quantities, colours, shapes and "
                   "objects."),
    ("scene", "Scene understanding and contextual reasoning: recognising visual relationships among multiple objects "
              "or entities."),
    ("spatial", "Spatial and geometric reasoning: position, rotation, orientation or 3D structure; relative depth, "
                "volume or spatial arrangement inferred from the image."),
    ("temporal", "Temporal and sequential reasoning: the order of events, motion, or changes over time."),
    ("comparison", "Visual comparison and matching: comparing size, distance, materials or other visual attributes."),
    ("commonsense", "Visual commonsense reasoning: plausible causes, effects or intentions inferred from visual cues."),
    ("math", "Mathematical and quantitative reasoning: arithmetic, algebraic or data-based problems derived from "
             "visual information."),
    ("chart", "Graph and chart interpretation: bar charts, pie charts, infographics or other statistical visuals."),
    ("ocr", "Optical character recognition and text localisation: detecting and reading printed or handwritten text "
            "in the image."),
    ("grounding", "Object detection and localisation: identifying specific objects and locating them with bounding "
                  "boxes."),
    ("pose", "Pose estimation and motion reasoning: human or animal keypoints, gestures or body postures."),
    ("fine-grained", "Fine-grained visual categorisation: distinguishing detailed subcategories such as species, "
                     "brands or object models."),
    ("anomaly", "Visual anomaly and outlier detection: abnormal, inconsistent or unexpected elements in the scene."),
    ("multimodal", "Multimodal reasoning and fusion: integrating visual, textual and symbolic information to answer "
                   "complex or cross-domain questions."),
    ("explanation", "Commonsense-based visual explanation: reasoning about or justifying the situation or events "
                    "shown."),
])


class TaxonomyError(ValueError):
    """A taxonomy file that cannot be used."""


def load_taxonomy(path: str | Path) -> tuple[Category, ...]:
    """A JSON list of {"name", "description"} (a stage-3 `taxonomy.json` is one)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise TaxonomyError(f"{path}: cannot read the taxonomy: {exc}") from None
    if not isinstance(data, list) or not data:
        raise TaxonomyError(f"{path}: a taxonomy is a non-empty JSON list of {{\"name\", \"description\"}}")
    out, seen = [], set()
    for i, entry in enumerate(data, 1):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry["name"].strip():
            raise TaxonomyError(f"{path} item {i}: needs a 'name' that is non-empty text")
        if not isinstance(entry.get("description", ""), (str, type(None))):
            raise TaxonomyError(f"{path} item {i}: 'description' must be text")
        name = category_slug(entry["name"])
        if name in seen:
            raise TaxonomyError(f"{path} item {i}: category {name!r} appears twice")
        seen.add(name)
        out.append(Category(name, str(entry.get("description") or "").strip(), int(entry.get("size") or 0),
                            tuple(entry.get("examples") or ())))
    return tuple(out)


def category_slug(name: str) -> str:
    """A category name as it appears in the bank: lowercase words joined by hyphens."""
    return "-".join(re.findall(r"[a-z0-9]+", str(name).lower())) or "category"


def cluster_questions(embeddings: np.ndarray, *, eps: float, min_samples: int) -> np.ndarray:
    """DBSCAN labels (-1: noise) of unit question embeddings, over cosine distance."""
    try:
        from sklearn.cluster import DBSCAN
    except ImportError:
        raise ImportError("the CTTD builder needs scikit-learn: pip install 'caprecon[cttd]'") from None

    if len(embeddings) == 0:
        return np.zeros(0, dtype=int)
    return DBSCAN(eps=eps, min_samples=min_samples, metric="cosine").fit_predict(np.asarray(embeddings, dtype=np.float64))


def central_questions(questions: Sequence[str], embeddings: np.ndarray, labels: np.ndarray, label: int,
                      k: int) -> list[str]:
    """The k questions of a cluster closest to its mean direction."""
    members = np.flatnonzero(labels == label)
    centre = embeddings[members].mean(axis=0)
    order = np.argsort(-(embeddings[members] @ centre), kind="stable")[:k]
    return [questions[members[i]] for i in order]


NAME_PROMPT = (
    "Below are questions that people asked about images. They form one group.\n\n{questions}\n\n"
    "Name the ability these questions test, as a short category name (one or two words), and describe the "
    "category in one sentence. Reply with JSON only: {\"name\": \"...\", \"description\": \"...\"}"
)
NAME_SHAPE = '{"name": "...", "description": "..."}'


def name_prompt(template: str, examples: Sequence[str]) -> str:
    return template.replace("{questions}", "\n".join(f"- {q}" for q in examples))


def shape_category(value: Any) -> tuple[tuple[str, str], bool]:
    from caprecon.core.replies import ReplyShapeError

    adjusted = not (isinstance(value, dict) and set(value) == {"name", "description"})
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if not isinstance(value, dict):
        raise ReplyShapeError(f"expected an object with name and description, got {type(value).__name__}")
    name = value.get("name") or value.get("category") or value.get("title")
    if not isinstance(name, str) or not name.strip():
        raise ReplyShapeError("no 'name' in the reply")
    description = value.get("description") or value.get("desc") or ""
    return (name.strip(), str(description).strip()), adjusted


FOLDER = "03-categorise"
OUTPUT = "taxonomy.json"


def text_embeddings(job, texts: Sequence[str]) -> np.ndarray:
    """Unit embeddings of texts in the build's matcher space, cached by (matcher, text)."""
    from caprecon.store.index import content_key

    matcher = job.models.matcher
    keys = [content_key("text-embedding", model=matcher.fingerprint, text=t) for t in texts]

    def compute(order: list[int]) -> list[np.ndarray]:
        with job.ctx.model_call():
            return list(matcher.embed_texts([texts[i] for i in order]))

    return job.ctx.cached_arrays("text-embedding", keys, compute) if texts else np.zeros((0, 0), dtype=np.float32)


def run(job, questions: list[dict[str, Any]]) -> None:
    """Cluster the proposed questions and name each cluster; or write the given taxonomy."""
    from caprecon.core.replies import ParseTally, read_replies
    from caprecon.apps.cttd.stage import llm_replies, write_json, write_jsonl

    cfg = job.config
    if cfg.taxonomy != "discover":
        taxonomy = PAPER_TAXONOMY if cfg.taxonomy == "paper" else load_taxonomy(cfg.taxonomy)
        job.manifest["taxonomy"] = "the Caption Turing Test paper's 15 categories" if cfg.taxonomy == "paper" \
            else f"given: {cfg.taxonomy}"
        write_json(job.folder / OUTPUT, [c.to_dict() for c in taxonomy])
        job.manifest["counts"] = {"categories": len(taxonomy)}
        return

    texts = [q["question"] for q in questions]
    vectors = text_embeddings(job, texts)
    labels = cluster_questions(vectors, eps=cfg.dbscan_eps, min_samples=cfg.dbscan_min_samples)
    clusters = sorted({int(x) for x in labels} - {-1}, key=lambda c: (-int((labels == c).sum()), c))
    template = cfg.name_prompt or NAME_PROMPT
    prompts = [name_prompt(template, central_questions(texts, vectors, labels, c, cfg.examples_per_cluster))
               for c in clusters]
    job.manifest["prompt"] = template
    llm = job.models.llm
    tally, rejects = ParseTally(), []
    replies = llm_replies(job.ctx, llm, prompts, cfg.max_new_tokens)
    named = read_replies(replies, shape_category, NAME_SHAPE,
                         lambda again: llm_replies(job.ctx, llm, again, cfg.max_new_tokens),
                         tally, rejects, [{"cluster": c} for c in clusters])
    taxonomy: list[Category] = []
    used: set[str] = set()
    for c, value in zip(clusters, named):
        if value is None:
            continue
        name, description = value
        slug = base = category_slug(name)
        k = 2
        while slug in used:  # two clusters named alike stay two categories
            slug, k = f"{base}-{k}", k + 1
        used.add(slug)
        taxonomy.append(Category(slug, description, int((labels == c).sum()),
                                 tuple(central_questions(texts, vectors, labels, c, 3))))
    if not taxonomy:
        raise RuntimeError(f"stage 3 found no usable category among {len(clusters)} clusters of {len(texts)} "
                           f"questions ({int((labels == -1).sum())} unclustered); loosen --dbscan-eps or "
                           f"--dbscan-min-samples, or give --taxonomy")
    write_json(job.folder / OUTPUT, [c.to_dict() for c in taxonomy])
    write_jsonl(job.folder / "rejects.jsonl", rejects)
    job.manifest["taxonomy"] = "discovered"
    job.manifest["replies"] = tally.to_dict()
    job.manifest["counts"] = {"questions": len(texts), "clusters": len(clusters),
                              "unclustered": int((labels == -1).sum()), "categories": len(taxonomy)}
    if tally.dropped:
        job.drop("cluster name unreadable after retry", tally.dropped)


def read_taxonomy(build: Path) -> tuple[Category, ...]:
    return load_taxonomy(build / FOLDER / OUTPUT)
