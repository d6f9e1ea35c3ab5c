"""What BLEU, METEOR and CIDEr pool over a corpus, kept row by row so that parts of a corpus (the
batches of a run, the shards of a job array) merge into the whole's corpus value without the input,
as torchmetrics keeps a metric's states and sums them across processes (its BLEUScore: `numerator`
and `denominator`, the matched and total n-grams per order, and `preds_len`, `target_len`). Rows
are kept one by one rather than summed, so the value over any subset of them (the rows a column
scored) and METEOR's order of summation are the unsharded run's.

A `CorpusPart` is one column's statistics over some rows, in the order they were scored:

- BLEU-n (pycocoevalcap's `BleuScorer`, option "closest"): per row, the candidate's length, the
  length of the reference closest to it (a tie goes to the shorter), and for each order k = 1..4
  the candidate's k-gram count ("guess") and how many of them a reference holds, each k-gram
  clipped at the most any one reference has ("correct"). All whole numbers; the corpus BLEU-n sums
  them over the rows and is (prod_k<=n (correct_k + 1e-15) / (guess_k + 1e-9))^(1/n), times the
  brevity penalty exp(1 - 1/ratio) when ratio = (c + 1e-15) / (r + 1e-9) < 1 (c, r: the summed
  candidate and reference lengths), with pycocoevalcap's epsilons and order of operations, so
  the value is the one it computes, to the last bit.
- METEOR 1.5: per row, the line of statistics the jar answers to `SCORE` (lengths, matches by
  stage, chunks, function words). The corpus score is the jar's answer to `EVAL` over every row's
  line, which is exactly how pycocoevalcap's `Meteor.compute_score` gets it: merging needs Java
  and the same jar, but not the input.
- CIDEr-D: per row, the caption's value under the corpus's IDF; the corpus value is their mean.
  The IDF (document frequencies of the references, and their number) is fixed before scoring
  (`ReferenceMetrics.fix_corpus`; a run fixes it to its whole input in every shard), so each row's
  value is already final and no n-gram vector needs keeping; the part records which references
  the frequencies were counted from (their number and a digest of the tokenised references), and
  parts counted from other references do not merge.

Parts merge only when the same implementation made them (pycocoevalcap's version, its tokenizer
and METEOR jar, the CIDEr corpus) and no row is in two of them. On disk a run keeps them in
`corpus-statistics.json` (strict JSON; `statistics_document`, `parts_from_document`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

STATISTICS_FORMAT = "caprecon-corpus-statistics"
STATISTICS_VERSION = 1
BLEU_ORDERS = 4
# pycocoevalcap's BleuScorer: `tiny` keeps a precision with no match at (nearly) 0 through the root,
# `small` keeps a caption with no k-grams from dividing by 0
BLEU_TINY, BLEU_SMALL = 1e-15, 1e-9
# METEOR as pycocoevalcap starts it (meteor/meteor.py): English, normalised text
METEOR_OPTIONS = "-l en -norm"
POOLED_COLUMNS = (*(f"bleu-{n}" for n in range(1, BLEU_ORDERS + 1)), "meteor", "cider")


class CorpusStatisticsError(ValueError):
    """Statistics that cannot be read or merged: damaged, made by another implementation or from
    another corpus, a row in two parts, or rows missing."""


@dataclass
class CorpusPart:
    """One corpus column's statistics (`bleu-1`..`bleu-4`, `meteor`, `cider`) over some rows:
    `rows` pairs each row's id with its statistics, in the order scored; `implementation` says
    what made them, and only parts with equal ones merge."""

    column: str
    implementation: dict[str, Any]
    rows: list[tuple[Any, Any]] = field(default_factory=list)


def pooled_column(name: str) -> bool:
    """Whether a reference column keeps corpus statistics (ROUGE-L and SPICE are means of their rows)."""
    return name in POOLED_COLUMNS


def implementation(column: str, cider_corpus: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the statistics of `column` depend on, as installed now (`cider_corpus`: for CIDEr,
    `references_identity` of the references its document frequencies come from)."""
    made = dict(_installed())
    if column == "meteor":
        from pycocoevalcap.meteor import meteor

        made["meteor"] = f"{meteor.METEOR_JAR} {METEOR_OPTIONS}"
    if column == "cider":
        made["cider_corpus"] = dict(cider_corpus or {})
    return made


@functools.lru_cache(maxsize=1)
def _installed() -> tuple[tuple[str, str], ...]:
    """pycocoevalcap's version and its tokenizer's jar (read once: every batch's statistics name them)."""
    from importlib.metadata import version

    from pycocoevalcap.tokenizer import ptbtokenizer

    return (("pycocoevalcap", version("pycocoevalcap")), ("tokenizer", ptbtokenizer.STANFORD_CORENLP_3_4_1_JAR))


def references_identity(references: Iterable[list[str]]) -> dict[str, Any]:
    """Which tokenised references (one list per row, in order) CIDEr's document frequencies were
    counted from: their number of rows and a digest of them. The frequencies are a function of
    these, so equal identities mean equal IDF."""
    digest = hashlib.sha256()
    documents = 0
    for refs in references:
        digest.update(json.dumps(list(refs), ensure_ascii=False).encode("utf-8") + b"\n")
        documents += 1
    return {"documents": documents, "references_sha256": digest.hexdigest()}


# ------------------------------------------------------------------ BLEU


def bleu_counts(cooked: dict[str, Any]) -> dict[str, Any]:
    """One row's BLEU statistics from pycocoevalcap's cooked test (`BleuScorer.ctest[i]`, whose
    `reflen` lists every reference's length): the closest reference length, ties to the shorter."""
    testlen = cooked["testlen"]
    closest = min((abs(length - testlen), length) for length in cooked["reflen"])[1]
    return {"testlen": testlen, "reflen": closest, "guess": list(cooked["guess"]),
            "correct": list(cooked["correct"])}


def corpus_bleu(rows: Iterable[dict[str, Any]]) -> list[float]:
    """Corpus BLEU-1..4 of rows' `bleu_counts`, summed: pycocoevalcap's `BleuScorer.compute_score`
    ("closest") over those rows."""
    testlen = reflen = 0
    guess, correct = [0] * BLEU_ORDERS, [0] * BLEU_ORDERS
    for row in rows:
        testlen += row["testlen"]
        reflen += row["reflen"]
        for k in range(BLEU_ORDERS):
            guess[k] += row["guess"][k]
            correct[k] += row["correct"][k]
    scores = []
    product = 1.0
    for k in range(BLEU_ORDERS):
        product *= float(correct[k] + BLEU_TINY) / (guess[k] + BLEU_SMALL)
        scores.append(product ** (1.0 / (k + 1)))
    ratio = (testlen + BLEU_TINY) / (reflen + BLEU_SMALL)
    if ratio < 1:  # the brevity penalty: shorter candidates than references overall
        scores = [score * math.exp(1 - 1 / ratio) for score in scores]
    return scores


# ------------------------------------------------------------------ METEOR


def meteor_statistics(meteor: Any, candidate: str, references: Sequence[str]) -> str:
    """The jar's statistics line for one row (pycocoevalcap's `Meteor._stat`): `meteor` is a running
    `pycocoevalcap.meteor.meteor.Meteor`, whose lock the caller holds."""
    candidate = candidate.replace("|||", "").replace("  ", " ")
    line = " ||| ".join(("SCORE", " ||| ".join(references), candidate))
    meteor.meteor_p.stdin.write(f"{line}\n".encode())
    meteor.meteor_p.stdin.flush()
    return meteor.meteor_p.stdout.readline().decode().strip()


def meteor_evaluate(meteor: Any, lines: Sequence[str]) -> tuple[float, list[float]]:
    """The jar's corpus score and per-row scores for rows' statistics lines (as the end of
    pycocoevalcap's `Meteor.compute_score`); the caller holds `meteor.lock`."""
    meteor.meteor_p.stdin.write(("EVAL" + "".join(f" ||| {line}" for line in lines) + "\n").encode())
    meteor.meteor_p.stdin.flush()
    scores = [float(meteor.meteor_p.stdout.readline().strip()) for _ in lines]
    return float(meteor.meteor_p.stdout.readline().strip()), scores


# ------------------------------------------------------------------ merging and values


def merge_parts(parts: Sequence[CorpusPart], names: Sequence[str] | None = None) -> CorpusPart:
    """One part holding every row of `parts`, in their order; refused when they are of different
    columns or implementations, or share a row. `names` label the parts in errors (a shard's file)."""
    if not parts:
        raise CorpusStatisticsError("no statistics to merge")
    names = list(names) if names is not None else [f"part {number}" for number in range(len(parts))]
    first = parts[0]
    holder: dict[Any, str] = {}
    rows: list[tuple[Any, Any]] = []
    for name, part in zip(names, parts):
        if part.column != first.column:
            raise CorpusStatisticsError(f"{name} holds {part.column} statistics, {names[0]} {first.column}")
        if part.implementation != first.implementation:
            differ = sorted(k for k in {*part.implementation, *first.implementation}
                            if part.implementation.get(k) != first.implementation.get(k))
            shown = "; ".join(f"{k}: {first.implementation.get(k)!r} against {part.implementation.get(k)!r}"
                              for k in differ)
            raise CorpusStatisticsError(f"the {first.column} statistics of {name} were made otherwise than those of "
                                        f"{names[0]} ({shown}); only statistics of one implementation and corpus "
                                        "merge")
        for row_id, stats in part.rows:
            if row_id in holder:
                raise CorpusStatisticsError(f"row {row_id!r} is in the {first.column} statistics of both "
                                            f"{holder[row_id]} and {name}")
            holder[row_id] = name
            rows.append((row_id, stats))
    return CorpusPart(first.column, dict(first.implementation), rows)


def ordered_rows(part: CorpusPart, order: Sequence[Any] | None = None) -> list[Any]:
    """The statistics of the rows `order` names, in that order (all of the part's when None): they
    must be exactly the part's rows."""
    if order is None:
        return [stats for _, stats in part.rows]
    by_id = dict(part.rows)
    missing = [row_id for row_id in order if row_id not in by_id]
    extra = set(by_id) - set(order)
    if missing or extra:
        problem = (f"lack row(s) {', '.join(map(repr, missing[:5]))}" if missing else
                   f"hold row(s) {', '.join(map(repr, sorted(extra, key=str)[:5]))} that have no {part.column} score")
        raise CorpusStatisticsError(f"the {part.column} statistics {problem}")
    return [by_id[row_id] for row_id in order]


def corpus_value(part: CorpusPart, order: Sequence[Any] | None = None, *, meteor: Any = None) -> float:
    """The corpus value of `part`'s column over its rows (in `order`, by id, when given), as
    `ReferenceMetrics.evaluate` gives it for those rows scored together. METEOR's needs `meteor`,
    a running pycocoevalcap `Meteor` of the implementation that wrote the part."""
    rows = ordered_rows(part, order)
    if not rows:
        raise CorpusStatisticsError(f"no row has {part.column} statistics")
    if part.column.startswith("bleu-"):
        return corpus_bleu(rows)[int(part.column.removeprefix("bleu-")) - 1]
    if part.column == "cider":
        return float(np.mean(np.array(rows, dtype=float)))
    if part.column == "meteor":
        installed = implementation("meteor")
        if part.implementation != installed:
            raise CorpusStatisticsError(f"the METEOR statistics were written by {part.implementation}, and the jar "
                                        f"installed here is {installed}: only that jar gives their corpus score")
        with meteor.lock:
            return meteor_evaluate(meteor, rows)[0]
    raise CorpusStatisticsError(f"{part.column} keeps no corpus statistics")


# ------------------------------------------------------------------ on disk


def statistics_document(parts: dict[str, CorpusPart]) -> dict[str, Any]:
    """The strict-JSON document of a run's parts, by column."""
    return {"format": STATISTICS_FORMAT, "version": STATISTICS_VERSION,
            "columns": {name: {"implementation": part.implementation, "rows": [[row_id, stats] for row_id, stats
                                                                                in part.rows]}
                        for name, part in parts.items()}}


def parts_from_document(document: Any, where: str) -> dict[str, CorpusPart]:
    """The parts a `statistics_document` holds, each row checked; `where` names the file in errors."""
    if not isinstance(document, dict) or document.get("format") != STATISTICS_FORMAT:
        raise CorpusStatisticsError(f"{where} is not a caprecon corpus statistics file (no \"format\": "
                                    f"\"{STATISTICS_FORMAT}\")")
    if document.get("version") != STATISTICS_VERSION:
        raise CorpusStatisticsError(f"{where} is version {document.get('version')!r} of the corpus statistics; this "
                                    f"caprecon reads version {STATISTICS_VERSION}: score that run again")
    columns = document.get("columns")
    if not isinstance(columns, dict):
        raise CorpusStatisticsError(f"{where}: \"columns\" must be an object (column -> statistics)")
    parts = {}
    for name, entry in columns.items():
        if not pooled_column(name):
            raise CorpusStatisticsError(f"{where}: {name!r} is no column that keeps corpus statistics")
        if not isinstance(entry, dict) or not isinstance(entry.get("implementation"), dict) \
                or not isinstance(entry.get("rows"), list):
            raise CorpusStatisticsError(f"{where}: {name} needs \"implementation\" (an object) and \"rows\" (a list)")
        rows = []
        for number, row in enumerate(entry["rows"]):
            if not (isinstance(row, list) and len(row) == 2):
                raise CorpusStatisticsError(f"{where}: {name} row {number} is not [id, statistics]")
            problem = _row_problem(name, row[1])
            if problem:
                raise CorpusStatisticsError(f"{where}: {name} row {number} (id {row[0]!r}): {problem}")
            rows.append((row[0], row[1]))
        parts[name] = CorpusPart(name, entry["implementation"], rows)
    return parts


def _row_problem(column: str, stats: Any) -> str | None:
    """What is wrong with one row's statistics of `column`, or None."""
    def count(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    if column == "cider":
        ok = isinstance(stats, (int, float)) and not isinstance(stats, bool) and math.isfinite(stats) and stats >= 0
        return None if ok else f"needs a finite CIDEr value >= 0, not {stats!r}"
    if column == "meteor":
        try:
            ok = isinstance(stats, str) and all(math.isfinite(float(v)) for v in stats.split()) and stats.strip() != ""
        except ValueError:
            ok = False
        return None if ok else f"needs the METEOR jar's line of numbers, not {stats!r}"
    if not isinstance(stats, dict) or not count(stats.get("testlen")) or not count(stats.get("reflen")):
        return "needs whole numbers testlen and reflen"
    for key in ("guess", "correct"):
        values = stats.get(key)
        if not (isinstance(values, list) and len(values) == BLEU_ORDERS and all(map(count, values))):
            return f"needs {key}, {BLEU_ORDERS} whole numbers"
    if any(c > g for c, g in zip(stats["correct"], stats["guess"])):
        return "has more matched n-grams than n-grams (correct > guess)"
    return None
