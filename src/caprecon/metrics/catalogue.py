"""caprecon's own metrics by name: the one place each name is written.

Each entry says where its metric's class lives (`module:Class`) and what it measures (`caprecon
models` lists it). The class is imported only when the metric is built, so reading this table
imports no metric module: a ReconScore run never imports the judge code.

A class named here takes its `name` from here (`Metric.__init_subclass__`) and writes none of its
own. A class several names share (halluc's three reports, the reference metrics) is told which one
it is built as by its entry's `options`, which the registry passes to its `from_roles`.

Why a table in the source and not `caprecon.metrics` entry points in pyproject.toml: an entry point
exists only once the package is installed, so a source checkout run through PYTHONPATH (a worktree,
a benchmark) would see the installed copy's metrics, not its own; and every `entry_points()` call
reads the metadata of every installed distribution (8 to 16 ms for 174 of them, on each call).
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

#: what a metric's name may be: a `-m` word and a column name (a `:` would read as `module:Class`)
NAME_PATTERN = re.compile(r"[a-z][a-z0-9-]*")

RECON = "caprecon.metrics.recon"
CLIPSCORE = "caprecon.metrics.clipscore"
HALLUCINATION = "caprecon.metrics.halluc:Hallucination"
REFERENCE = "caprecon.metrics.reference:ReferenceMetric"


@dataclass(frozen=True)
class Builtin:
    """One of caprecon's metrics: its `name`, the `module:Class` that computes it, one line on what it
    measures, and the keyword arguments that tell this name apart among those its class serves."""

    name: str
    target: str
    about: str
    options: Mapping[str, Any] = field(default_factory=dict)

    def load(self) -> type:
        """The metric's class (its module is imported now)."""
        module, _, attribute = self.target.partition(":")
        return getattr(importlib.import_module(module), attribute)


def by_name(entries: Iterable[Builtin]) -> dict[str, Builtin]:
    """The entries by name; a name given twice, or one that is not a plain lowercase word, is refused
    (a dict literal would keep the second of two equal keys without a word)."""
    table: dict[str, Builtin] = {}
    for entry in entries:
        if not NAME_PATTERN.fullmatch(entry.name):
            raise ValueError(f"metric name {entry.name!r} ({entry.target}): use lowercase letters, digits and '-'")
        if entry.name in table:
            raise ValueError(f"metric name {entry.name!r} is given twice: {table[entry.name].target} and "
                             f"{entry.target}")
        table[entry.name] = entry
    return table


def _references(*named: tuple[str, str]) -> list[Builtin]:
    # one class computes every reference metric: each (name, about) is built as `ReferenceMetric(name)`
    return [Builtin(name, REFERENCE, about, {"name": name}) for name, about in named]


METRICS: dict[str, Builtin] = by_name([
    Builtin("recon", f"{RECON}:ReconScore", "ReconScore (1 + cos(F(I), F(Î)))/2, F = --embedder"),
    Builtin("clip-image", f"{RECON}:ClipImageScore", "cos(E(I), E(Î)) in CLIP image space, E = --clip"),
    Builtin("turing", "caprecon.metrics.turing:CaptionTuringTest",
            "Caption Turing Test: --judge accuracy on --qa-bank questions seen through Î; upper bound on I"),
    Builtin("vqascore", "caprecon.metrics.vqascore:VQAScore",
            "P('Yes') of --judge for 'Is the figure showing: {caption}?' on I (and/or Î: --vqa-on)"),
    Builtin("captionqa", "caprecon.metrics.captionqa:CaptionQA",
            "--llm answers the --qa-bank questions from the caption alone"),
    Builtin("fleur", "caprecon.metrics.fleur:Fleur",
            "--judge rates the caption 0-1 (FLEUR's instruction), smoothed over the digit probabilities where it "
            "wrote the rating"),
    Builtin("clipscore", f"{CLIPSCORE}:ClipScore",
            "2.5 max(cos(E(I), E('A photo depicts ' + C)), 0), E = --clip (Hessel et al.; --clipscore-weight, "
            "--clipscore-prefix)"),
    Builtin("clip-s", f"{CLIPSCORE}:ClipS",
            "100 max(cos(E(I), E(C)), 0), E = --clip: the Caption Turing Test paper's CLIP-S"),
    Builtin("refclipscore", f"{CLIPSCORE}:RefClipScore", "harmonic mean of CLIPScore and the best reference similarity"),
    Builtin("halluc", HALLUCINATION, "soft precision of the caption's claims (--llm splits it) checked by --judge on "
            "I; coverage on Î and F (--beta) beside it", {"report": "precision"}),
    Builtin("halluc-coverage", HALLUCINATION, "halluc's coverage: turing with --qa-bank, else the references' claims "
            "checked on Î", {"report": "coverage"}),
    Builtin("halluc-f", HALLUCINATION, "F_beta (--beta) of halluc's precision and coverage", {"report": "f"}),
    Builtin("claims", "caprecon.metrics.claim_check:ClaimCheck",
            "the caption's claims (--llm splits them, DSG-style, gated) checked by --judge on I and on Î: conveyed, "
            "precision, lost, per claim type, with each claim's evidence"),
    *_references(
        *[(f"bleu-{n}", f"BLEU-{n} against the row's references (pycocoevalcap); summary: corpus BLEU")
          for n in range(1, 5)],
        ("meteor", "METEOR 1.5 against the references (pycocoevalcap, Java); summary: corpus METEOR"),
        ("rouge", "ROUGE-L against the references (pycocoevalcap)"),
        ("cider", "CIDEr-D against the references, IDF from the whole input (pycocoevalcap)"),
        ("spice", "SPICE F-score against the references (pycocoevalcap; Java and CoreNLP's jars)"),
    ),
])


def target_of(cls: type) -> str:
    """How an entry names the class `cls`: `module:Class`."""
    return f"{cls.__module__}:{cls.__qualname__}"


def names_of(target: str) -> tuple[str, ...]:
    """The names whose entry builds the class `target` (`module:Class`), in the table's order."""
    return tuple(name for name, entry in METRICS.items() if entry.target == target)


def name_of(target: str, **options: Any) -> str:
    """The name of the class `target` built with `options` (`Hallucination` with report="f": halluc-f)."""
    for name, entry in METRICS.items():
        if entry.target == target and dict(entry.options) == options:
            return name
    raise LookupError(f"no metric of {target} is built with {options}")
