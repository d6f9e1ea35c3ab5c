"""Suite entries: what a benchmark file holds and how its answers are scored.

An entry is data, not code: its question type picks the prompt and the grader, its
metric picks how graded questions become the dataset's number. Adding a benchmark
means adding an entry here (`SUITES`) or in a suite file:

    # suite.yaml: the datasets of one evaluation, each a registered name or a full entry
    datasets:
      - suite: mmbench
        data: MMBench_DEV_EN.tsv          # relative to this file
      - suite: mme
        data: MME.tsv
      - name: my-ocr                      # an entry of its own
        label: MyOCR
        question: ocr
        match: exact
        data: my_ocr.jsonl

Question types: `mc` (options in columns A, B, C...), `yesno`, `math` (free-form
answers compared as numbers, or an option letter when the row has options), `ocr`
(text answers, one or several accepted), `box` (a referring expression and its box).
Metrics: `accuracy`; `accuracy+` (MME: also the share of images whose questions are
all right); `grounding` (mean IoU, with the accuracy at IoU >= `iou_threshold` alongside).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Mapping

from caprecon.run.config import load_config_file
from caprecon.core.errors import ConfigError
from caprecon.core.paths import file_problem

QUESTION_TYPES = ("mc", "yesno", "math", "ocr", "box")
METRICS = ("accuracy", "accuracy+", "grounding")
FORMATS = ("tsv", "jsonl", "json", "csv")
OCR_MATCHES = ("contains", "exact")
BOX_FORMATS = ("xywh", "xyxy")


@dataclass(frozen=True)
class SuiteEntry:
    """One benchmark: its file, question type and metric.

    format: `tsv` (VLMEvalKit's layout: index, base64 image, question, option columns
        A, B, C..., answer, category, hint, l2-category), `jsonl`, `json` or `csv`
        (the same fields; `image` may also be a path, relative to the file); None: by suffix.
    match (ocr): `contains` (OCRBench: an accepted answer occurs in the reply, after
        lower-casing; spaces dropped too for handwritten formulas) or `exact` (OCRVQA:
        equal after VQA normalisation).
    rel_tol / abs_tol (math): a numeric reply is right when within either of the gold
        number; a row's `precision` column (decimals) rounds both sides first.
    box_format (box): how `bbox` is written, COCO's `xywh` or `xyxy`, in pixels of the image.
    pair_by (accuracy+): the column whose rows form one group (MME: the image).
    """

    name: str
    question: str
    label: str = ""
    metric: str = "accuracy"
    format: str | None = None
    data: Path | None = None
    match: str = "contains"
    rel_tol: float = 1e-4
    abs_tol: float = 1e-6
    box_format: str = "xywh"
    iou_threshold: float = 0.5
    pair_by: str = "image"
    about: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        where = f"suite {self.name!r}"
        if self.question not in QUESTION_TYPES:
            raise ConfigError(f"{where}: question must be one of {', '.join(QUESTION_TYPES)}, not {self.question!r}")
        if self.metric not in METRICS:
            raise ConfigError(f"{where}: metric must be one of {', '.join(METRICS)}, not {self.metric!r}")
        if (self.metric == "grounding") != (self.question == "box"):
            raise ConfigError(f"{where}: box questions go with the grounding metric and only with it")
        if self.format is not None and self.format not in FORMATS:
            raise ConfigError(f"{where}: format must be one of {', '.join(FORMATS)}, not {self.format!r}")
        if self.match not in OCR_MATCHES:
            raise ConfigError(f"{where}: match must be one of {', '.join(OCR_MATCHES)}, not {self.match!r}")
        if self.box_format not in BOX_FORMATS:
            raise ConfigError(f"{where}: box_format must be one of {', '.join(BOX_FORMATS)}, not {self.box_format!r}")
        if not self.label:
            object.__setattr__(self, "label", self.name)

    @property
    def file_format(self) -> str:
        if self.format:
            return self.format
        if self.data is None:
            raise ConfigError(f"suite {self.name!r} has no data file: give --data PATH or `data:` in the suite file")
        suffix = self.data.suffix.lower().lstrip(".")
        if suffix not in FORMATS:
            raise ConfigError(f"suite {self.name!r}: cannot tell the format of {self.data} from its suffix; "
                              f"set `format` to one of {', '.join(FORMATS)}")
        return suffix


def _entry(name: str, label: str, question: str, about: str, **options: Any) -> SuiteEntry:
    return SuiteEntry(name=name, label=label, question=question, about=about, **options)


# The Caption Turing Test paper's Table 1, in its order. Files are the user's (VLMEvalKit's TSVs
# where it ships them); the entries say how to read and score them.
SUITES: dict[str, SuiteEntry] = {e.name: e for e in (
    _entry("mmbench", "MMB.", "mc", "MMBench: multiple choice over 20 ability dimensions (VLMEvalKit TSV)"),
    _entry("mmstar", "MMS.", "mc", "MMStar: 1500 vision-indispensable multiple-choice questions (VLMEvalKit TSV)"),
    _entry("hallusionbench", "Hall.", "yesno", "HallusionBench: yes/no questions on hallucination and illusion; "
                                              "question accuracy (aAcc)"),
    _entry("mme", "MME", "yesno", "MME: two yes/no questions per image over 14 sub-tasks; accuracy, and "
                                  "accuracy+ (both questions of an image right)", metric="accuracy+"),
    _entry("mathvista", "Vista.", "math", "MathVista: free-form numbers and multiple choice"),
    _entry("mathverse", "Verse.", "math", "MathVerse: free-form numbers and option letters"),
    _entry("mathvision", "Vision.", "math", "MathVision: competition problems, numbers and option letters"),
    _entry("ocrbench", "OB.", "ocr", "OCRBench: an accepted answer contained in the reply", match="contains"),
    _entry("ocrvqa", "OQ.", "ocr", "OCRVQA: exact match after VQA normalisation", match="exact"),
    _entry("refcoco", "CO.", "box", "RefCOCO: referring expressions; mean IoU (the paper's grounding number), "
                                    "with the accuracy at IoU >= 0.5 beside it", metric="grounding"),
)}


def resolve_entry(spec: str | Mapping[str, Any], base: Path | None = None) -> SuiteEntry:
    """A registered name, or a mapping: `suite: NAME` plus overrides, or a full entry (name, question...)."""
    if not isinstance(spec, (str, Mapping)):  # `datasets: [5]` in a suite file
        raise ConfigError(f"a suite file's datasets are names or entries (mappings), not {type(spec).__name__} "
                          f"{spec!r}")
    if isinstance(spec, str):
        if spec not in SUITES:
            raise ConfigError(f"unknown suite {spec!r}; registered: {', '.join(SUITES)} (or give a suite file)")
        return SUITES[spec]
    values = {k.replace("-", "_"): v for k, v in dict(spec).items()}
    known = {f.name for f in fields(SuiteEntry)} | {"suite"}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"unknown field(s) {unknown} in suite entry {dict(spec)}; known: {sorted(known)}")
    data = values.pop("data", None)
    if data is not None:
        data = Path(data)
        if base is not None and not data.is_absolute():
            data = base / data
    registered = values.pop("suite", None)
    if registered is not None:
        entry = replace(resolve_entry(str(registered)), **values)
    else:
        if "name" not in values or "question" not in values:
            raise ConfigError(f"a suite entry needs `suite: NAME` or both `name` and `question`: {dict(spec)}")
        entry = SuiteEntry(**values)
    return replace(entry, data=data) if data is not None else entry


def load_suites(specs: list[str], data: list[str] | None = None) -> list[SuiteEntry]:
    """The datasets named by `--suite` (names or suite files) and `--data`.

    Each `--data PATH` goes, in order, to the registered names given without a file;
    `--data NAME=PATH` names its suite. Suite files carry their own paths."""
    entries: list[SuiteEntry] = []
    for spec in specs:
        path = Path(spec)
        if path.suffix.lower() in (".yaml", ".yml", ".toml") or path.is_file():
            if problem := file_problem(path):  # in the words of every command's missing input
                raise ConfigError(f"--suite: {problem}")
            values = load_config_file(path)
            listed = values.get("datasets")
            if not isinstance(listed, list) or not listed:
                raise ConfigError(f"{path}: a suite file needs `datasets`, a list of names or entries")
            entries += [resolve_entry(item, path.parent) for item in listed]
        else:
            entries.append(resolve_entry(spec))
    named, positional = {}, []
    for value in data or []:
        name, sep, file = value.partition("=")
        if sep and name in {e.name for e in entries}:
            named[name] = Path(file)
        else:
            positional.append(Path(value))
    waiting = [i for i, e in enumerate(entries) if e.data is None and e.name not in named]
    if len(positional) > len(waiting):
        raise ConfigError(f"{len(positional)} --data file(s) for {len(waiting)} suite(s) without one")
    given = set()  # the entries whose file --data names (the others' come from a suite file)
    for i, e in enumerate(entries):
        if e.name in named:
            entries[i] = replace(e, data=named[e.name])
            given.add(i)
    for i, file in zip(waiting, positional):
        entries[i] = replace(entries[i], data=file)
        given.add(i)
    for i, e in enumerate(entries):
        if e.data is None:
            raise ConfigError(f"suite {e.name!r} has no data file: give --data PATH (or NAME=PATH)")
        where = "--data" if i in given else f"suite {e.name!r}: data file"  # the option, or the suite file's entry
        if problem := file_problem(e.data):  # every format a suite reads (tsv, jsonl, json, csv) is one file
            raise ConfigError(f"{where}: {problem}")
    names = [e.name for e in entries]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ConfigError(f"suite(s) {repeated} given twice; give one a `name` of its own in a suite file")
    return entries
