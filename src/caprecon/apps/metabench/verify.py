"""`caprecon meta verify`: our numbers beside the published ones, benchmark by benchmark.

For every published value of the chosen benchmark (`published.csv` beside this module,
or an `--expected` file, which replaces it: a CSV with `benchmark, metric, key,
value[, refs, ties, sampling][, source]`, values ×100, `key` being `tau_b` or `tau_c` (either Kendall variant,
whichever the benchmark's protocol reports), `accuracy`, a Pascal-50S category, `mean`,
`pearson`, `system` for THumB's system level, or `value` for the protocol's own statistic)
the table shows ours, the published value, the difference and pass/fail within
`--tolerance` points.

`refs`, `ties` and `sampling` are the protocol the number was published under, in the
words of `Benchmark.protocol`. A value published with another number of references per
item is not compared (skipped, with both protocols named); one whose tie rule or sampling
differs is compared and its `protocol` cell names the difference, since such a gap is the
protocol's and not the code's. Reference metrics are computed here; other metrics need their
per-caption scores in a `--scores` file. A metric that cannot run is listed as skipped
with the reason (SPICE without its CoreNLP jars, say) rather than silently missing.
"""

from __future__ import annotations

import csv
import math
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Mapping, Sequence

from caprecon.core.checks import number_problem
from caprecon.core.tables import format_table
from caprecon.data.judgments import JudgmentFormatError
from caprecon.data.loaders.pascal50s import PASCAL_CATEGORIES
from caprecon.stats.agreement import MetaRow
from caprecon.apps.metabench import PROTOCOL_FIELDS, Benchmark
from caprecon.core.paths import file_problem


@dataclass(frozen=True)
class Published:
    value: float  # ×100
    source: str
    protocol: dict[str, str] | None  # refs, ties, sampling; None where the file does not say


Expected = dict[str, dict[str, Published]]  # metric -> key -> published value


@dataclass
class VerifyRow:
    benchmark: str
    metric: str
    key: str
    ours: float  # ×100
    published: float  # ×100
    difference: float
    tolerance: float
    status: str  # pass, fail or skipped
    source: str
    reason: str = ""  # why a row was skipped
    protocol: str = ""  # "as published", or how the published protocol differs from the one run

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def table_columns(cls, rows: Sequence[VerifyRow]) -> list[tuple[str, str]]:
        return [(k, k) for k in cls.__dataclass_fields__]


PUBLISHED = resources.files("caprecon.apps.metabench") / "published.csv"


def published_values(benchmark: Benchmark) -> Expected:
    """The values published for `benchmark` (empty when none are recorded)."""
    with resources.as_file(PUBLISHED) as path:
        return read_expected(path, benchmark.name, required=False)


def read_expected(path: str | Path, benchmark: str, *, required: bool = True) -> Expected:
    """The rows of an expected-values CSV that belong to `benchmark`. Protocol columns are
    optional, but a file that has them must fill them on every row."""
    path = Path(path)
    if problem := file_problem(path):  # named by its option, as every command names a missing input
        raise JudgmentFormatError(f"--expected: {problem}")
    out: Expected = {}
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        columns = set(reader.fieldnames or ())
        missing = {"benchmark", "metric", "key", "value"} - columns
        if missing:
            raise JudgmentFormatError(f"{path}: missing columns {', '.join(sorted(missing))}")
        stated = [f for f in PROTOCOL_FIELDS if f in columns]
        if stated and len(stated) < len(PROTOCOL_FIELDS):
            absent = ", ".join(f for f in PROTOCOL_FIELDS if f not in columns)
            raise JudgmentFormatError(f"{path}: protocol columns go together; missing {absent}")
        for row in reader:
            if row["benchmark"] != benchmark:
                continue
            where = f"{path}:{reader.line_num}"
            try:
                value = float(row["value"])
            except ValueError:
                raise JudgmentFormatError(f"{where}: value {row['value']!r} is not a number") from None
            if problem := number_problem(value):  # a NaN compares unequal to everything: never a pass, nor a clear fail
                raise JudgmentFormatError(f"{where}: value {problem}")
            protocol = _protocol(row, where) if stated else None
            out.setdefault(row["metric"], {})[row["key"]] = Published(value, row.get("source") or str(path), protocol)
    if not out and required:
        raise JudgmentFormatError(f"{path}: no expected values for benchmark {benchmark!r}")
    return out


def _protocol(row: dict, where: str) -> dict[str, str]:
    protocol = {f: (row[f] or "").strip() for f in PROTOCOL_FIELDS}
    if empty := [f for f, v in protocol.items() if not v]:
        raise JudgmentFormatError(f"{where}: {row['metric']} {row['key']}: protocol field(s) {', '.join(empty)} empty")
    if row["key"] in ("tau_b", "tau_c") and protocol["ties"] != row["key"]:
        raise JudgmentFormatError(f"{where}: {row['metric']} {row['key']}: ties {protocol['ties']!r} must be the "
                                  "τ variant the key names")
    return protocol


def protocol_difference(benchmark: Benchmark, key: str, published: dict[str, str] | None,
                        human_ranking: str = "published") -> dict[str, tuple[str, str]]:
    """field -> (published, this benchmark's) for each protocol field where they differ
    (`human_ranking`: the one CapArena's model-level values were computed against)."""
    if published is None:
        return {}
    ours = benchmark.protocol(key, human_ranking)
    return {f: (published[f], ours[f]) for f in PROTOCOL_FIELDS if published[f] != ours[f]}


def our_value(rows: Sequence[MetaRow], metric: str, key: str) -> float:
    """The fraction in `rows` that a published `key` refers to (NaN when absent)."""
    for row in rows:
        if row.metric != metric:
            continue
        if key == "system" and row.statistic == "pearson_system":
            return row.value
        if key in ("value", row.statistic) and row.statistic != "pearson_system":
            return row.value
        if key in ("tau_b", "tau_c", "spearman"):  # rating judgments carry both τ variants and ρ
            return getattr(row, key)
        if key in row.extra:
            return row.extra[key]
        if f"accuracy_{key}" in row.extra:
            return row.extra[f"accuracy_{key}"]
    return math.nan


def compare(
    benchmark: Benchmark,
    rows: Sequence[MetaRow],
    expected: Expected,
    *,
    tolerance: float,
    skipped: Mapping[str, str],
    human_ranking: str = "published",
) -> list[VerifyRow]:
    out = []
    for metric, keys in expected.items():
        for key, published in keys.items():
            ours = 100.0 * our_value(rows, metric, key)
            differs = protocol_difference(benchmark, key, published.protocol, human_ranking)
            reason = ""
            if "refs" in differs:
                status = "skipped"
                reason = (f"{benchmark.name} {metric} {key}: published with {differs['refs'][0]} reference(s) per item, "
                          f"this benchmark uses {differs['refs'][1]}")
            elif metric in skipped:
                status, reason = "skipped", skipped[metric]
            elif math.isnan(ours):
                status, reason = "skipped", _why_missing(benchmark, rows, metric, key)
            else:
                status = "pass" if abs(ours - published.value) <= tolerance else "fail"
            out.append(VerifyRow(benchmark.name, metric, key, ours, published.value, ours - published.value, tolerance,
                                 status, published.source, reason, describe_protocol(published.protocol, differs)))
    return out


# published keys that name one part of a benchmark (Pascal-50S's categories, CapArena's difficulty
# levels): a file may hold none of that part, and then has no such value to check
PART_KEYS = frozenset({*PASCAL_CATEGORIES, *(f"agreement_level {n}" for n in range(1, 5))})


def _why_missing(benchmark: Benchmark, rows: Sequence[MetaRow], metric: str, key: str) -> str:
    """Why `rows` give no value for a published (metric, key)."""
    mine = [r for r in rows if r.metric == metric]
    if not mine:
        return f"{metric}: not scored (give its per-caption scores with --scores)"
    if key in PART_KEYS and not any(key in r.extra or f"accuracy_{key}" in r.extra for r in mine):
        return f"{metric} {key}: the {benchmark.name} file holds no {key} items, so there is no {key} value to check"
    return f"{metric} {key}: undefined on this file (no caption scored, or no variation to correlate)"


def describe_protocol(published: dict[str, str] | None, differs: Mapping[str, tuple[str, str]]) -> str:
    if published is None:
        return "not stated"
    if not differs:
        return "as published"
    return "differs: " + "; ".join(f"{f} published {p!r}, here {o!r}" for f, (p, o) in differs.items())


def format_verify(rows: Sequence[VerifyRow]) -> str:
    header = ("benchmark", "metric", "key", "ours", "published", "diff", "tol", "status", "protocol", "source")
    cells = [
        (r.benchmark, r.metric, r.key, _num(r.ours), _num(r.published), _num(r.difference, signed=True),
         f"{r.tolerance:g}", r.status, r.protocol, r.source)
        for r in rows
    ]  # fmt: skip
    lines = [format_table([header, *cells], rule=True)]
    lines += [f"skipped: {reason}" for reason in dict.fromkeys(r.reason for r in rows if r.reason)]
    return "\n".join(lines)


def write_verify_csv(rows: Sequence[VerifyRow], path: str | Path) -> None:
    with Path(path).open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(VerifyRow.__dataclass_fields__))
        writer.writeheader()
        for r in rows:
            writer.writerow({k: "" if isinstance(v, float) and math.isnan(v) else v for k, v in r.as_dict().items()})


def _num(value: float, signed: bool = False) -> str:
    if math.isnan(value):
        return ""
    return f"{value:+.2f}" if signed else f"{value:.2f}"
