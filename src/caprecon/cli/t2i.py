"""`caprecon t2i`: prompt adherence of text-to-image models on a caption set.

    caprecon t2i --input captions.parquet --generator sd35=sd3.5-medium --generator flux.1-dev \\
        --judge llava-1.5-13b --judge instructblip-flan-t5-xl --size 1024x1024 --out runs/t2i

Writes to --out: `scores.jsonl` (one record per caption x generator), `table.md` and
`table.csv` (the table it prints), `summary.json` and `manifest.json`.
"""

from __future__ import annotations

import argparse
from typing import Any

from caprecon.core.checks import MAX_LIMIT, MAX_RESAMPLES
from caprecon.cli.common import Writes, failed_records, plugin_option, row_failures, whole_number
from caprecon.run.config import load_config_file, parse_options
from caprecon.core.errors import ConfigError
from caprecon.metrics.vqascore import DEFAULT_TEMPLATE
from caprecon.apps.t2i import DEFAULT_JUDGES

# keys of a --config file that only t2i reads; everything else is a run setting
_LISTS = ("generators", "judges")


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "t2i", aliases=["text-to-image"], help="prompt adherence of text-to-image models on a caption set (VQAScore on the generated image)",
        description="Generate each caption with every --generator, ask every --judge whether the image shows "
                    "the caption, and print each generator's mean with a bootstrap CI and the paired "
                    "differences between generators.")
    p.add_argument("--input", "-i", required=True,
                   help="caption set: JSONL/JSON/CSV/TSV/parquet with a caption column "
                        "(the Re-LAION-Caption 19M layout too)")
    p.add_argument("--caption-column", help="the column holding the captions (default: the first of re_caption, "
                                            "recaption, structured_caption, llava_caption, ..., caption, text)")
    p.add_argument("--limit", type=whole_number(1, MAX_LIMIT), help="evaluate the first N captions only")
    p.add_argument("--generator", "-g", action="append", dest="generators", metavar="[LABEL=]SPEC",
                   help="generator under test (repeatable): registry name, hub id, folder or module:Class")
    p.add_argument("--generator-opt", action="append", metavar="KEY=VALUE",
                   help="option for every generator, e.g. steps=28, dtype=bfloat16 (repeatable)")
    p.add_argument("--judge", action="append", dest="judges", metavar="[LABEL=]SPEC",
                   help=f"VQA judge (repeatable; default: {' and '.join(DEFAULT_JUDGES)}); its column is vqa/LABEL")
    p.add_argument("--judge-opt", action="append", metavar="KEY=VALUE",
                   help="option for every judge, e.g. base_url=http://127.0.0.1:8000/v1")
    p.add_argument("--questions", metavar="FILE",
                   help="DSG question file (dsg-1k-anns.csv's layout): each judge also answers every question of the "
                        "caption's item (matched by id, else by text) on each image; columns dsg/LABEL (DSG's gated "
                        "item score) and dsg/LABEL_ungated")
    p.add_argument("--vqa-template", help=f"the question, with {{caption}} (default: {DEFAULT_TEMPLATE!r})")
    p.add_argument("--vqa-normalise", action="store_const", const=True,
                   help="score P(yes)/(P(yes)+P(no)) instead of the raw P('Yes')")
    p.add_argument("--no-normalise", dest="normalise", action="store_false",
                   help="give captions to the models as written (default: markdown, list markers and line breaks "
                        "stripped; the raw text is kept as caption_raw)")
    p.add_argument("--size", metavar="WxH", help="image size (default: each generator's native resolution)")
    p.add_argument("--template", help="prompt template with {caption}, or a preset (default: plain)")
    p.add_argument("--seed", type=whole_number(0, 2**63 - 1), help="base seed; each caption's seed derives from it and the caption's id")
    p.add_argument("--seed-policy", choices=["per-sample", "fixed"],
                   help="per-sample: a seed per caption, the same for every generator (default); fixed: --seed "
                        "for every caption")
    p.add_argument("--bootstrap", type=whole_number(1, MAX_RESAMPLES), default=1000, metavar="N", help="bootstrap resamples (default 1000)")
    p.add_argument("--preset", help="run preset (its generator is used when no --generator is given)")
    p.add_argument("--config", help="YAML or TOML file: run settings, plus `generators` and `judges` lists of "
                                    "names or {label, model, options}")
    plugin_option(p)
    p.add_argument("--batch-size", type=whole_number(1), help="images per generator or judge batch (default 16)")
    p.add_argument("--cache-dir", help="content-addressed cache (default $CAPRECON_CACHE or ~/.cache/caprecon)")
    p.add_argument("--no-cache", action="store_const", const=True,
                   help="reuse nothing from earlier runs; keep this run's results in OUT/store")
    p.add_argument("--out", "-o", help="run folder for scores.jsonl, table.md/csv, summary.json and manifest.json")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar or table")
    p.add_argument("--allow-row-errors", action="store_true",
                   help="exit 0 even when some caption x generator rows failed (their `error` says why)")
    p.set_defaults(func=cmd_t2i, writes=Writes(inputs=("input", "questions"), outputs="scores.jsonl"))
    return p


def _settings(args: argparse.Namespace, file_values: dict[str, Any]) -> dict[str, Any]:
    """File settings under the command line's, option dicts merged key by key."""
    keys = ("preset", "vqa_template", "vqa_normalise", "size", "template", "seed", "seed_policy", "batch_size",
            "cache_dir", "no_cache")
    settings = {**file_values, **{k: getattr(args, k) for k in keys if getattr(args, k) is not None}}
    for role in ("generator", "judge"):
        given = parse_options(getattr(args, f"{role}_opt"))
        if given:
            settings[f"{role}_options"] = {**(file_values.get(f"{role}_options") or {}), **given}
    return settings


def cmd_t2i(args: argparse.Namespace) -> int:
    from caprecon.run.config import RunConfig
    from caprecon.apps.t2i import t2i

    file_values = load_config_file(args.config, allow_plugins=args.allow_plugins) if args.config else {}
    lists = {key: file_values.pop(key) for key in _LISTS if key in file_values}
    for key, value in lists.items():
        if not isinstance(value, list):
            raise ConfigError(f"{args.config}: `{key}` must be a list")
    cfg = RunConfig.build(**_settings(args, file_values))
    generators = args.generators or lists.get("generators") or ([cfg.generator] if cfg.generator else [])
    judges = args.judges or lists.get("judges") or ([cfg.judge] if cfg.judge else list(DEFAULT_JUDGES))
    results = t2i(args.input, generators, judges, config=cfg, out=args.out,
                                  caption_column=args.caption_column, limit=args.limit, normalise=args.normalise,
                                  n_bootstrap=args.bootstrap, progress=not args.quiet, questions=args.questions)
    if not args.quiet:
        print(results.table.to_text())
    return row_failures(failed_records(results.records), allow=args.allow_row_errors)
