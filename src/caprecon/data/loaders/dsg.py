"""Davidsonian Scene Graph (DSG, Cho et al., ICLR 2024; github:j-min/DSG) files, as shipped.

`dsg-1k-anns.csv`, one proposition a row (a quoted field may span lines)::

    item_id,text,keywords,proposition_id,dependency,category_broad,category_detailed,tuple,question_natural_language
    whoops_5,A rubix cube with ten squares of purple,rubix cube,1,0,entity,whole,entity - whole (rubix cube),Is there a rubix cube?
    whoops_5,A rubix cube with ten squares of purple,"rubix cube, purple",2,1,attribute,color,"attribute - color (rubix cube, purple)",Is the rubix cube purple?

`dependency` lists the ids of the proposition's parents, comma-separated; `0` means none. The
published file spells a few otherwise (`1,2, 4`, and 11 rows with a word among the ids: `5, right`):
`Proposition.parents` reads the whole numbers among them and `dependency_problem` names what
else is there, so a caller decides (DSG's own script drops every dependency of such an item).
`read_propositions` and `write_propositions` read the file and write it back byte for byte (the
file's last line has no line break; the writer keeps whether it had one).

Recorded VQA answers (`pali17b_dsg.csv`): `dsg_prompt_split, qg_model, t2i_model, item_id,
question, question_id, dependency_id, answer`, one question asked of one generator's image of
one prompt; answers are kept as recorded (empty, or neither yes nor no, included).

TIFA160 human ratings (`tifa160-likert-anns.csv`): `dsg_prompt_split, t2i_model, item_id,
source_id, worker_id, question, answer`, a worker's 1-5 Likert rating of how consistent one
generator's image is with its prompt.
"""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from caprecon.data.judgments import JudgmentFormatError

PROPOSITION_FIELDS = ("item_id", "text", "keywords", "proposition_id", "dependency", "category_broad",
                      "category_detailed", "tuple", "question_natural_language")
ANSWER_FIELDS = ("dsg_prompt_split", "qg_model", "t2i_model", "item_id", "question", "question_id",
                 "dependency_id", "answer")
LIKERT_FIELDS = ("t2i_model", "item_id", "answer")  # the columns read; the file has more
NO_PARENT = 0

#: DSG's (broad, detailed) categories as caprecon's claim types: DSG files count and text
#: rendering under "other" and spatial relations under "relation"
_DSG_TYPES = {("other", "count"): "count", ("attribute", "count"): "count", ("other", "text rendering"): "text",
              ("attribute", "text rendering"): "text", ("relation", "spatial"): "spatial"}
_BROAD_TYPES = {"entity": "entity", "attribute": "attribute", "relation": "relation", "global": "global"}


def claim_type(broad: str, detailed: str) -> str:
    """A DSG category as one of caprecon's claim types (entity, attribute, relation, count,
    text, spatial, global); a kind DSG files under "other" that is neither count nor text
    rendering (an id, an aspect ratio) is an attribute."""
    return _DSG_TYPES.get((broad, detailed)) or _BROAD_TYPES.get(broad, "attribute")


@dataclass(frozen=True)
class Proposition:
    """One DSG proposition: its tuple, its parents' ids (empty: none, written `0`), its question."""

    item_id: str
    text: str  # the prompt (or caption) it comes from
    keywords: str
    proposition_id: int
    dependency: str  # as written: parent ids, comma-separated, "0" for none
    category_broad: str
    category_detailed: str
    tuple: str
    question: str

    @property
    def claim_type(self) -> str:
        return claim_type(self.category_broad, self.category_detailed)

    @property
    def parents(self) -> tuple[int, ...]:
        """The parents' ids: the whole numbers of `dependency` other than 0."""
        return tuple(int(part) for part in _id_parts(self.dependency) if part.isdigit() and int(part) != NO_PARENT)

    @property
    def dependency_problem(self) -> str:
        """What in `dependency` is not a parent id ("" when nothing is)."""
        others = [part for part in _id_parts(self.dependency) if not part.isdigit()]
        return f"dependency {self.dependency!r} holds {', '.join(map(repr, others))}, not ids" if others else ""

    def fields(self) -> list[str]:
        return [self.item_id, self.text, self.keywords, str(self.proposition_id), self.dependency, self.category_broad,
                self.category_detailed, self.tuple, self.question]


def _id_parts(value: str) -> list[str]:
    return [part.strip() for part in value.split(",")]


@dataclass(frozen=True)
class PropositionFile:
    """A DSG proposition file: its rows in file order, and whether its last line ends with a line break."""

    propositions: tuple[Proposition, ...]
    final_newline: bool = True

    def by_item(self) -> dict[str, list[Proposition]]:
        items: dict[str, list[Proposition]] = defaultdict(list)
        for p in self.propositions:
            items[p.item_id].append(p)
        return dict(items)


def _positive_id(value: str, where: str, what: str) -> int:
    if not value.strip().isdigit() or int(value) <= 0:
        raise JudgmentFormatError(f"{where}: {what} must be a positive whole number, not {value!r}")
    return int(value)


def _read_csv(path: str | Path, needed: Sequence[str]) -> tuple[list[dict[str, str]], str]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise JudgmentFormatError(f"file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise JudgmentFormatError(f"{path}: not readable as UTF-8 text ({exc})") from None
    reader = csv.DictReader(io.StringIO(text, newline=""))
    missing = [f for f in needed if f not in (reader.fieldnames or ())]
    if missing:
        raise JudgmentFormatError(f"{path}: not a DSG file: no column {', '.join(missing)}")
    rows = []
    for row in reader:
        if None in row or any(v is None for v in row.values()):
            raise JudgmentFormatError(f"{path} line {reader.line_num}: {len(reader.fieldnames)} fields expected")
        rows.append(row)
    return rows, text


def read_propositions(path: str | Path) -> PropositionFile:
    """DSG's proposition file (`dsg-1k-anns.csv`); an id that is not a whole number, or a parent id
    that is not one of the item's propositions, is refused naming the line."""
    rows, text = _read_csv(path, PROPOSITION_FIELDS)
    if len(rows) and list(rows[0]) != list(PROPOSITION_FIELDS):
        raise JudgmentFormatError(f"{path}: DSG's columns are {', '.join(PROPOSITION_FIELDS)}, in that order")
    out = []
    for n, row in enumerate(rows, start=1):
        where = f"{path} row {n} ({row['item_id']})"
        pid = _positive_id(row["proposition_id"], where, "proposition_id")
        out.append(Proposition(row["item_id"], row["text"], row["keywords"], pid, row["dependency"], row["category_broad"],
                               row["category_detailed"], row["tuple"], row["question_natural_language"]))
    return PropositionFile(tuple(out), final_newline=text.endswith("\r\n"))


def _serialise(file: PropositionFile) -> str:
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer, lineterminator="\r\n")
    writer.writerow(PROPOSITION_FIELDS)
    for p in file.propositions:
        writer.writerow(p.fields())
    text = buffer.getvalue()
    return text if file.final_newline else text.removesuffix("\r\n")


def write_propositions(path: str | Path, file: PropositionFile) -> None:
    """`file` in DSG's own layout: what `read_propositions` read comes back byte for byte."""
    Path(path).write_text(_serialise(file), encoding="utf-8", newline="")


@dataclass(frozen=True)
class RecordedAnswer:
    """One recorded VQA answer: to question `question_id` of prompt `item_id`, on the image that
    generator `t2i_model` made of it (`answer` as recorded: possibly empty, or neither yes nor no)."""

    split: str
    qg_model: str
    t2i_model: str
    item_id: str
    question: str
    question_id: int
    dependency_id: str  # as recorded; scoring takes the parents from the proposition file
    answer: str


def read_recorded_answers(path: str | Path) -> list[RecordedAnswer]:
    """DSG's recorded answers (`pali17b_dsg.csv` and the files of the same layout)."""
    rows, _ = _read_csv(path, ANSWER_FIELDS)
    out = []
    for n, row in enumerate(rows, start=1):
        where = f"{path} row {n} ({row['t2i_model']}, {row['item_id']})"
        qid = _positive_id(row["question_id"], where, "question_id")
        out.append(RecordedAnswer(row["dsg_prompt_split"], row["qg_model"], row["t2i_model"], row["item_id"],
                                  row["question"], qid, row["dependency_id"],
                                  row["answer"]))
    return out


@dataclass(frozen=True)
class LikertRatings:
    """People's 1-5 ratings per (generator, item), in file order."""

    ratings: dict[tuple[str, str], list[float]] = field(default_factory=dict)

    def mean(self, key: tuple[str, str]) -> float:
        values = self.ratings[key]
        return sum(values) / len(values)


def read_likert(path: str | Path) -> LikertRatings:
    """TIFA160's Likert file; a rating that is not a number from 1 to 5 is refused naming its row."""
    rows, _ = _read_csv(path, LIKERT_FIELDS)
    ratings: dict[tuple[str, str], list[float]] = defaultdict(list)
    for n, row in enumerate(rows, start=1):
        try:
            value = float(row["answer"])
        except ValueError:
            value = float("nan")
        if not 1 <= value <= 5:
            raise JudgmentFormatError(f"{path} row {n} ({row['t2i_model']}, {row['item_id']}): a Likert rating is "
                                      f"a number from 1 to 5, not {row['answer']!r}")
        ratings[(row["t2i_model"], row["item_id"])].append(value)
    if not ratings:
        raise JudgmentFormatError(f"{path}: no ratings")
    return LikertRatings(dict(ratings))
