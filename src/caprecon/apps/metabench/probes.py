"""`meta --probes` / `--triples`: the ReconScore paper's probes on the first judgments file's images:
the Δ probe (paraphrase against perturbation), the length probe and, with a halluc metric, the
inserted-object probe. Their captions are written by an LLM (`ProbeWriter`), or given (`triples`)."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Mapping, Sequence

import numpy as np

from caprecon.apps.metabench.request import MetaError, MetaRequest, ScoreMetric
from caprecon.apps.metabench.scoring import score_judgments
from caprecon.apps.metabench.probe_captions import (LENGTHS, Perturber, ProbeWriter, as_records, inserted_object_captions,
                                                    length_samples, length_sets, overlap_problem, paraphrase_triples,
                                                    triple_samples)
from caprecon.core.records import write_jsonl_atomically
from caprecon.data.judgments import Judgments, ProbeTriple
from caprecon.data.samples import Sample
from caprecon.metrics.catalogue import HALLUCINATION, names_of
from caprecon.metrics.claims import extract_claims
from caprecon.metrics.reference import ReferenceMetrics, reference_metric_name
from caprecon.stats.probes import ProbeRow, insertion_probe, length_robustness, paraphrase_delta


def run_probes(
    req: MetaRequest,
    judgments: Judgments,
    triples: list[ProbeTriple] | None,
    writer: ProbeWriter | None,
    metrics: Sequence[str],
    reference: ReferenceMetrics,
    score_metric: ScoreMetric | None,
    notes: list[str],
    directions: Mapping[str, bool | None] | None = None,
) -> list[ProbeRow]:
    """The Δ probe (on user `triples`, else on the LLM's paraphrases of the first judgments
    file's references) and, with --probes, the length probe (captions the LLM writes).
    `directions`: each metric's declared direction (`metric_directions`); Δ reads a
    lower-is-better metric's scores negated, so a positive Δ always means it noticed."""
    rejected = []
    images_root = req.images or (judgments.path.parent if judgments.path else None)
    if triples is not None:
        triples_root = req.images or req.triples.parent
        flagged = [(row, problem) for row, t in enumerate(triples, 1) if (problem := overlap_problem(t))]
        if flagged:
            row, problem = flagged[0]
            notes.append(f"Δ probe: {len(flagged)} of {len(triples)} triples in {req.triples.name} do not contrast a "
                         f"low-overlap paraphrase with a high-overlap perturbation (e.g. row {row}: {problem})")
    else:
        assert writer is not None  # meta refuses --probes without an LLM
        triples, rejected = paraphrase_triples(judgments, writer, Perturber(seed=req.seed))
        triples_root = images_root
        notes.append(f"Δ probe: {len(triples)} triples from the references of {judgments.name} (LLM paraphrase, "
                     f"rule-based perturbation); {len(rejected)} rejected (see probe-rejected.jsonl)")
        write_jsonl_atomically(req.out / "probe-triples.jsonl", as_records(triples), allow_nan=True)
    if not triples:
        raise MetaError("the Δ probe has no triples (no reference could be perturbed, or every paraphrase was "
                        "rejected: see probe-rejected.jsonl)")
    # Probe captions are new, so --scores files cannot cover them.
    pluggable = score_metric is not None
    computable = [m for m in metrics if m in reference.names or (pluggable and reference_metric_name(m) is None)]
    if skipped := [m for m in metrics if m not in computable and m not in reference.skipped]:
        notes.append(f"probes skip {', '.join(skipped)}: only --scores were given for them")
    rows: list[ProbeRow] = []
    pair_samples = triple_samples(triples, triples_root)
    pair_scores = score_judgments(computable, pair_samples, reference, score_metric, {})
    groups = [t.image_id for t in triples]
    n = len(triples)
    # Δ > 0 means the metric prefers the paraphrase: a lower-is-better metric's scores are read negated
    lower = {name for name, higher in (directions or {}).items() if higher is False}
    for name, values in pair_scores.items():
        values = [-v for v in values] if name in lower else values
        row = paraphrase_delta(name, values[:n], values[n:], groups, n_bootstrap=req.bootstrap, seed=req.seed)
        rows.append(replace(row, detail=f"{row.detail} (lower is better: scores negated)") if name in lower else row)
    if req.probes:
        assert writer is not None
        sets, length_rejected = length_sets(judgments, writer)
        rejected += length_rejected
        notes.append(f"length probe: {len(sets)} images with {', '.join(LENGTHS)} captions written by the LLM from "
                     f"extracted triplets; {len(length_rejected)} rejected (see probe-rejected.jsonl)")
        write_jsonl_atomically(req.out / "probe-lengths.jsonl", as_records(sets), allow_nan=True)
        if not sets:
            raise MetaError("the length probe has no image: the LLM's replies gave no usable triplets or captions "
                            "(see probe-rejected.jsonl)")
        samples = length_samples(sets, images_root)
        length_scores = score_judgments(computable, samples, reference, score_metric, {})
        for name, values in length_scores.items():
            rows.append(
                length_robustness(
                    name, [s.meta["length"] for s in samples], values, [s.image_id for s in samples],
                    n_bootstrap=req.bootstrap, seed=req.seed,
                )  # fmt: skip
            )
        if score_metric is not None and set(HALLUC_METRICS) & set(metrics):
            rows += inserted_object_probe(req, judgments, writer, metrics, score_metric, notes)
    if rejected:
        write_jsonl_atomically(req.out / "probe-rejected.jsonl", as_records(rejected), allow_nan=True)
    return rows


# the halluc family, as the catalogue names it: precision, coverage (needs a generator) and their F
HALLUC_METRICS = names_of(HALLUCINATION)


def inserted_object_probe(req: MetaRequest, judgments: Judgments, writer: ProbeWriter, metrics: Sequence[str],
                     score_metric: ScoreMetric, notes: list[str]) -> list[ProbeRow]:
    """Issue 24's inserted-object probe on the first judgments file's captions: each gets an object
    that other images' claims name and its own do not; halluc's precision must drop, and its
    coverage, scored when a chosen metric reconstructs, must not move."""
    samples = judgments.samples(req.images)
    captions = [s.caption for s in samples]
    claims = [found.claims for found in extract_claims(writer.ctx, writer.llm, captions)]
    inserted = inserted_object_captions(captions, [s.image_id or str(s.image) for s in samples], claims,
                                        seed=req.seed)
    kept = [(s, text) for s, text in zip(samples, inserted) if text is not None]
    if not kept:
        notes.append(f"inserted-object probe: no caption of {judgments.name} lacks an object that another image's "
                     "claims name; not run")
        return []
    write_jsonl_atomically(req.out / "probe-inserted.jsonl",
                           [{"id": s.id, "caption": s.caption, "inserted": text} for s, text in kept])
    notes.append(f"inserted-object probe: {len(kept)} of {len(samples)} captions of {judgments.name} with an absent "
                 "object appended (see probe-inserted.jsonl)")
    before = [s for s, _ in kept]
    after = [replace(s, id=f"ins-{s.id}", caption=text) for s, text in kept]

    def scored(name: str, items: list[Sample]) -> np.ndarray:
        return np.array([math.nan if v is None else float(v) for v in score_metric(name, items)])

    with_coverage = bool({"halluc-coverage", "halluc-f"} & set(metrics))
    nothing = np.full(len(kept), math.nan)
    coverage = [scored("halluc-coverage", items) if with_coverage else nothing for items in (before, after)]
    drop, change = insertion_probe("halluc", scored("halluc", before), scored("halluc", after), *coverage,
                                   [s.image_id or str(s.image) for s in before], n_bootstrap=req.bootstrap,
                                   seed=req.seed)
    return [drop, change] if with_coverage else [drop]

