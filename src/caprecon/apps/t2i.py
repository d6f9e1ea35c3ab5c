"""Prompt adherence of text-to-image models (the Re-LAION-Caption 19M evaluation).

For each caption c of a test set, every generator under test makes an image Î, and
every judge (a VLM) gives its probability that Î shows c, asked "Is the figure
showing: c?" (VQAScore on the generated image). The paper reports the mean over the
test set for two judges, LLaVA (primary) and InstructBLIP.

    results = t2i("captions.parquet", {"sd35": "sd3.5-medium", "flux": "flux.1-dev"},
                                  out="runs/t2i")
    print(results.table.to_text())

Each generator is run with the same seeds (they derive from the caption's id, never
from the generator) and the same prompt text, so two generators' scores on one caption
form a pair: the table gives each generator's mean with a percentile-bootstrap CI
(resampling captions), and for each pair of generators the mean paired difference with
its own CI, which is far tighter than comparing two overlapping intervals.

Captions go through `caprecon.normalise` first (on by default; the raw text is kept as
`caption_raw`). Each image is generated once per generator and judged by every judge:
the judges read the one reconstruction from the run's store. Models are loaded one
generator at a time (the judges stay loaded), and everything a model computed is
cached, so a rerun makes no model call.
"""

from __future__ import annotations

import csv
import itertools
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from caprecon.run.config import RunConfig
from caprecon.run.folder import holds_run_folder, open_store, write_manifest, write_summary
from caprecon.core.checks import MAX_LIMIT, MAX_RESAMPLES, check_count
from caprecon.core.digests import keep_memo_in, memo_scoped
from caprecon.core.errors import ConfigError
from caprecon.core.scaling import binary_exponent, rescale
from caprecon.core.tables import format_table, number
from caprecon.run.entrants import entrants
from caprecon.metrics.base import Context
from caprecon.metrics.claim_check import PropositionCheck
from caprecon.metrics.vqascore import VQAScore
from caprecon.models.build import build_model
from caprecon.models.common import release_memory
from caprecon.core.describe import describe_model
from caprecon.data.normalise import normalised_samples
from caprecon.run.local import run_local
from caprecon.data.samples import Sample

# the paper's judges: LLaVA (its primary score) and InstructBLIP
DEFAULT_JUDGES = ("llava-1.5-13b", "instructblip-flan-t5-xl")
COLUMN_PREFIX = "vqa/"
DSG_PREFIX = "dsg/"  # with --questions: DSG's gated item score per judge (and dsg/<judge>_ungated)


# ----------------------------------------------------------------------------- statistics


@dataclass(frozen=True)
class Estimate:
    """A mean over captions with its percentile-bootstrap interval."""

    mean: float
    ci_low: float
    ci_high: float
    n: int


def mean_ci(values: Sequence[float], ids: Sequence[str], *, n_bootstrap: int = 1000, seed: int = 0,
            level: float = 0.95) -> Estimate:
    """Mean of `values` and its bootstrap CI, resampling the captions (`ids`)."""
    from caprecon.stats.bootstrap import bootstrap_ci

    x = np.asarray(values, dtype=float)
    if not len(x):
        return Estimate(math.nan, math.nan, math.nan, 0)
    low, high = bootstrap_ci(lambda idx: float(x[idx].mean()), list(ids), n_resamples=n_bootstrap, seed=seed,
                             level=level)
    return Estimate(float(x.mean()), low, high, len(x))


@dataclass
class AdherenceTable:
    """Per generator and judge column: the mean score; per pair of generators: the paired difference."""

    generators: list[str]
    columns: list[str]
    means: dict[tuple[str, str], Estimate]
    differences: dict[tuple[str, str, str], Estimate]  # (first, second, column) -> first - second
    captions: int
    level: float = 0.95
    notes: list[str] = field(default_factory=list)

    @property
    def pairs(self) -> list[tuple[str, str]]:
        return list(itertools.combinations(self.generators, 2))

    def _cell(self, e: Estimate, signed: bool = False) -> str:
        if math.isnan(e.mean):
            return "n/a"
        def f(v: float) -> str:
            v = round(v, 4) or 0.0  # no "-0.0000"
            return f"+{number(v)}" if signed and v >= 0 else number(v)

        text = f(e.mean) if math.isnan(e.ci_low) else f"{f(e.mean)} [{f(e.ci_low)}, {f(e.ci_high)}]"
        return text if e.n == self.captions else f"{text} n={e.n}"

    def grids(self) -> list[tuple[str, list[list[str]]]]:
        """(title, rows with a header row) for the means and the paired differences."""
        ci = f"{round(self.level * 100)}% CI"
        means = [["generator", *self.columns]]
        means += [[g, *(self._cell(self.means[g, c]) for c in self.columns)] for g in self.generators]
        grids = [(f"mean P(yes) [{ci}] over {self.captions} captions", means)]
        if self.pairs:
            diffs = [["difference", *self.columns]]
            diffs += [[f"{a} - {b}", *(self._cell(self.differences[a, b, c], signed=True) for c in self.columns)]
                      for a, b in self.pairs]
            grids.append((f"paired difference [{ci}], same captions and seeds", diffs))
        return grids

    def to_text(self) -> str:
        out = []
        for title, rows in self.grids():
            out.append(f"{title}\n" + format_table(rows, rule=True))  # labels come from the user: escaped there
        if self.notes:
            out.append("\n".join(f"note: {n}" for n in self.notes))
        return "\n\n".join(out)

    def to_markdown(self) -> str:
        out = []
        for title, rows in self.grids():
            out += [f"**{title}**", "", "| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
            out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows[1:]]
            out.append("")
        out += [f"- {n}" for n in self.notes]
        return "\n".join(out).rstrip() + "\n"

    def rows(self) -> list[dict[str, Any]]:
        """Long form, full precision: one row per mean and per paired difference."""
        out = [{"kind": "mean", "generator": g, "versus": "", "judge": c, **_fields(self.means[g, c])}
               for g in self.generators for c in self.columns]
        out += [{"kind": "difference", "generator": a, "versus": b, "judge": c, **_fields(self.differences[a, b, c])}
                for a, b in self.pairs for c in self.columns]
        return out

    def write(self, out_dir: Path) -> dict[str, Path]:
        paths = {"markdown": out_dir / "table.md", "csv": out_dir / "table.csv"}
        paths["markdown"].write_text(self.to_markdown(), encoding="utf-8")
        rows = self.rows()
        with paths["csv"].open("w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]) if rows else ["kind"])
            writer.writeheader()
            writer.writerows(_without_nan(r, "") for r in rows)
        return paths


def _without_nan(row: Mapping[str, Any], missing: Any) -> dict[str, Any]:
    return {k: missing if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()}


def _fields(e: Estimate) -> dict[str, Any]:
    return {"mean": e.mean, "ci_low": e.ci_low, "ci_high": e.ci_high, "n": e.n}


def adherence_table(records: Sequence[Mapping[str, Any]], generators: Sequence[str], columns: Sequence[str], *,
                    n_bootstrap: int = 1000, seed: int = 0, level: float = 0.95) -> AdherenceTable:
    """The table from per-caption records (`id`, `generator`, one field per column).

    A caption enters a mean when the generator's record has a number in that column, and
    a paired difference when both generators' records do."""
    scores: dict[tuple[str, str], dict[str, float]] = {(g, c): {} for g in generators for c in columns}
    captions: dict[str, None] = {}
    for r in records:
        captions.setdefault(str(r["id"]))
        for c in columns:
            value = r.get(c)
            if r.get("generator") in generators and isinstance(value, (int, float)) and math.isfinite(value):
                scores[r["generator"], c][str(r["id"])] = float(value)
    # at unit scale (`caprecon.core.scaling`), so scores near 1e308 give their means, not inf and NaN
    exponent = binary_exponent(v for by_id in scores.values() for v in by_id.values())
    scores = {key: {i: rescale(v, -exponent) for i, v in by_id.items()} for key, by_id in scores.items()}
    options = {"n_bootstrap": n_bootstrap, "seed": seed, "level": level}

    def estimate(values: list[float], ids: list[str]) -> Estimate:
        e = mean_ci(values, ids, **options)
        return Estimate(*(rescale(v, exponent) for v in (e.mean, e.ci_low, e.ci_high)), e.n)

    means = {key: estimate(list(by_id.values()), list(by_id)) for key, by_id in scores.items()}
    differences = {}
    for a, b in itertools.combinations(generators, 2):
        for c in columns:
            first, second = scores[a, c], scores[b, c]
            shared = [i for i in first if i in second]
            differences[a, b, c] = estimate([first[i] - second[i] for i in shared], shared)
    return AdherenceTable(list(generators), list(columns), means, differences, len(captions), level)


def truncation_notes(records: Sequence[Mapping[str, Any]], generators: Sequence[str]) -> list[str]:
    """Which generators read cut prompts, and through which text encoders."""
    notes = []
    for g in generators:
        rows = [r for r in records if r.get("generator") == g]
        cut = [r for r in rows if r.get("tokens_cut")]
        if not cut:
            continue
        encoders = sorted({e for r in cut for e, n in (r.get("tokens_cut_by_encoder") or {}).items() if n})
        via = f" by {', '.join(encoders)}" if encoders else ""
        notes.append(f"{g}: {len(cut)} of {len(rows)} prompts were cut{via} (tokens_cut per row); CLIP text "
                     f"encoders read 77 tokens, the rest of a long caption does not reach the generator through them")
    return notes


# ----------------------------------------------------------------------------- the run


@dataclass
class T2IResults:
    records: list[dict[str, Any]]  # one per caption x generator
    table: AdherenceTable
    manifest: dict[str, Any]
    out: Path | None = None


@holds_run_folder("out", inputs=("samples",))
@memo_scoped
def t2i(
    samples: str | Path | Iterable[Sample | dict],
    generators: Iterable[Any] | Mapping[str, Any],
    judges: Iterable[Any] | Mapping[str, Any] = DEFAULT_JUDGES,
    *,
    config: RunConfig | None = None,
    out: str | Path | None = None,
    caption_column: str | None = None,
    limit: int | None = None,
    normalise: bool = True,
    n_bootstrap: int = 1000,
    ci_seed: int = 0,
    level: float = 0.95,
    progress: bool = False,
    questions: str | Path | None = None,
    **settings: Any,
) -> T2IResults:
    """Generate every caption with every generator and judge every image with every judge.

    `questions`: a DSG proposition file (`dsg-1k-anns.csv`'s layout): each judge also answers
    every question of the caption's item on each image, scored as DSG scores them, gated
    (`dsg/<judge>`) and ungated (`dsg/<judge>_ungated`; `caprecon.metrics.claim_check.PropositionCheck`).
    A caption is matched to its item by its id, else by its text.

    `generators` / `judges`: see `entrants`. `settings` are `RunConfig` fields (seed,
    seed_policy, size, template, vqa_template, vqa_normalise, generator_options and
    judge_options shared by all, batch_size, cache_dir, no_cache ...), or pass `config`.
    A caption set file is read by `load_caption_set` (`caption_column`, `limit`).
    """
    started = time.time()
    if config is not None and settings:
        raise TypeError(f"give either `config` or settings, not both (got {sorted(settings)})")
    cfg = config or RunConfig.build(**settings)
    keep_memo_in(cfg.memo_folder)  # this run's memo of file digests, for this call alone (`memo_scoped`)
    if limit is not None:
        check_count("--limit", limit, 1, MAX_LIMIT)
    check_count("--bootstrap", n_bootstrap, 1, MAX_RESAMPLES)
    rows, column = _caption_rows(samples, caption_column, limit)
    if normalise:
        rows = normalised_samples(rows)
    gens, jurors = entrants(generators, "generator"), entrants(judges, "judge")
    if not gens:
        raise ConfigError("no generator to evaluate: give at least one --generator")
    if not jurors:
        raise ConfigError("no judge: give at least one --judge")
    if "{caption}" not in cfg.vqa_template:
        raise ConfigError(f"the judge's question must contain {{caption}}: {cfg.vqa_template!r}")

    propositions = _propositions(questions)
    # every model is resolved (not loaded) before any work, so a wrong name stops the run here
    spec = cfg.spec
    built_judges = {j.label: build_model("judge", j.spec, {**cfg.judge_options, **j.options}) for j in jurors}
    built_generators = {g.label: build_model("generator", g.spec, {**cfg.generator_options, **g.options})
                        for g in gens}
    out_dir = Path(out) if out else None
    store = open_store(cfg, out_dir)
    columns = [COLUMN_PREFIX + label for label in built_judges]
    if propositions is not None:
        columns += [f"{DSG_PREFIX}{label}{suffix}" for label in built_judges for suffix in ("", "_ungated")]
    described = {"generators": {}, "judges": {label: describe_model(j) for label, j in built_judges.items()}}
    records: list[dict[str, Any]] = []
    cache: dict[str, Any] = {}
    for i, label in enumerate(list(built_generators)):
        generator = built_generators.pop(label)  # dropped after its run: one generator in memory at a time
        metrics = [VQAScore(judge, template=cfg.vqa_template, on="reconstruction", generator=generator, spec=spec,
                            normalise=cfg.vqa_normalise, column=COLUMN_PREFIX + jl)
                   for jl, judge in built_judges.items()]
        if propositions is not None:
            metrics += [PropositionCheck(judge, generator, propositions, spec=spec, normalise=cfg.vqa_normalise,
                                         column=DSG_PREFIX + jl) for jl, judge in built_judges.items()]
        ctx = Context(store)
        records += run_local(rows, metrics, ctx, batch_size=cfg.batch_size,
                             scores_path=out_dir / "scores.jsonl" if out_dir else None, progress=progress,
                             fields={"generator": label}, append=i > 0, desc=label)
        described["generators"][label] = describe_model(generator)
        cache[label] = ctx.stats()
        del generator, metrics, ctx
        release_memory()

    table = adherence_table(records, [g.label for g in gens], columns, n_bootstrap=n_bootstrap, seed=ci_seed,
                            level=level)
    table.notes += truncation_notes(records, table.generators)
    errors = sum(1 for r in records if r.get("error"))
    if errors:
        table.notes.append(f"{errors} caption x generator row(s) have an error (see scores.jsonl); a score such a "
                           f"row lacks leaves its caption out of that mean and of the pairs it belongs to")
    manifest = {
        "command": "t2i",
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
        "seconds": round(time.time() - started, 3),
        "captions": len(rows),
        "caption_column": column,
        "captions_normalised": normalise,
        "query": cfg.vqa_template,
        "probability": "P(yes)/(P(yes)+P(no))" if cfg.vqa_normalise else "P(first answer token = 'Yes')",
        "reconstruction": {"template": spec.template, "seed": spec.seed, "seed_policy": spec.seed_policy,
                           "size": list(spec.size) if spec.size else "native"},
        "bootstrap": {"resamples": n_bootstrap, "seed": ci_seed, "level": level, "unit": "caption"},
        "models": described,
        "cache": cache,
        "store": str(store.root),
        "config": cfg.to_dict(),
    }
    if out_dir:
        table.write(out_dir)
        summary = {"table": table.rows(), "notes": table.notes}
        write_summary(out_dir, summary)
        write_manifest(out_dir, manifest)
    return T2IResults(records, table, manifest, out_dir)


def _propositions(questions: str | Path | None) -> dict[str, list] | None:
    """The DSG question file's propositions by item, read before any model loads (None: no file)."""
    if questions is None:
        return None
    from caprecon.data.judgments import JudgmentFormatError
    from caprecon.data.loaders.dsg import read_propositions

    try:
        return read_propositions(questions).by_item()
    except JudgmentFormatError as exc:
        raise ConfigError(f"--questions: {exc}") from None


def _caption_rows(samples: str | Path | Iterable[Sample | dict], caption_column: str | None,
                  limit: int | None) -> tuple[list[Sample], str | None]:
    """Caption-only samples with unique ids (any image a row names is set aside)."""
    from caprecon.data.caption_sets import load_caption_set
    from caprecon.data.loaders import load_samples
    from caprecon.data.samples import check_unique_ids

    if isinstance(samples, (str, Path)):
        rows, column = load_caption_set(samples, caption_column=caption_column, limit=limit)
    else:
        rows, column = load_samples(samples)[:limit], None
    rows = [replace(s, image=None) for s in rows]
    check_unique_ids(rows)
    return rows, column
