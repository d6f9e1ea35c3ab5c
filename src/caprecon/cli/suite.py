"""`caprecon suite` and `caprecon suite-agree`: the task suite on reconstructions, and its
agreement with the CTTD surrogate.

    caprecon suite --suite suites.yaml --captioner qwen3-vl-2b --captions blip=blip_captions.jsonl \\
        --generator qwen-image --judge qwen3-vl-8b --judge-for refcoco=qwen2.5-vl-72b --out runs/suite
    caprecon suite-agree --suite-run runs/suite --turing qwen3-vl-2b=runs/turing-qwen --turing blip=0.52

`suite` writes to --out: `table.md`/`table.csv` (Table 1), `summary.json`, `records.jsonl`
(one per question and row), `captions.jsonl` (normalised and raw), `images.jsonl` (the
benchmark images by id, for captioners run elsewhere) and `manifest.json`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from caprecon.core.checks import MAX_LIMIT
from caprecon.cli.common import Writes, failed_records, plugin_option, real_number, row_failures, whole_number
from caprecon.run.config import load_config_file, parse_options, parse_pairs
from caprecon.core.errors import ConfigError
from caprecon.data.qa import COORDS


def add_parser(subparsers) -> None:
    from caprecon.apps.suites.entries import SUITES
    from caprecon.apps.suites.table import DEFAULT_SIGMA

    p = subparsers.add_parser(
        "suite", help="downstream task suites on reconstructions: Table 1 of the Caption Turing Test paper",
        description="Caption every benchmark image (or read captions from a file), reconstruct it, answer the "
                    "benchmark on the reconstruction and on the original (the upper bound, computed once per "
                    "question), and print per-dataset scores, their average, the gap to the upper bound and "
                    "Eq. 4's semantic-equivalence check, one row per captioner.")
    p.add_argument("--suite", "-s", action="append", required=True, metavar="NAME_OR_FILE",
                   help=f"registered benchmark ({', '.join(SUITES)}) or a YAML/TOML suite file listing "
                        f"`datasets` (repeatable)")
    p.add_argument("--data", "-d", action="append", metavar="[NAME=]PATH",
                   help="benchmark file of a registered --suite, in order of the names (repeatable)")
    p.add_argument("--captioner", "-c", action="append", dest="captioners", metavar="[LABEL=]SPEC",
                   help="captioner to run (repeatable): registry name, hub id, folder or module:Class")
    p.add_argument("--captioner-opt", action="append", metavar="KEY=VALUE",
                   help="option for every captioner, e.g. base_url=http://127.0.0.1:8000/v1 (repeatable)")
    p.add_argument("--captions", action="append", metavar="[LABEL=]FILE",
                   help="captions written elsewhere (repeatable): JSONL/JSON/CSV/TSV rows with `caption` and "
                        "`image_id` (see OUT/images.jsonl) or `dataset` and `index`")
    p.add_argument("--prompt", help="caption prompt: detailed (default), limited (with --max-words), "
                                    "remote-sensing, or the text")
    p.add_argument("--max-words", type=whole_number(1), help="length limit of the 'limited' prompt")
    p.add_argument("--caption-max-new-tokens", type=whole_number(1), default=256, help="longest caption (default 256)")
    p.add_argument("--generator", "-g", help="text-to-image model: registry name, hub id, folder or module:Class")
    p.add_argument("--generator-opt", action="append", metavar="KEY=VALUE",
                   help="generator option, e.g. steps=28, dtype=bfloat16 (repeatable)")
    p.add_argument("--judge", help="VLM that answers the benchmarks: registry name, hub id or folder")
    p.add_argument("--judge-opt", action="append", metavar="KEY=VALUE",
                   help="judge option, e.g. base_url=http://127.0.0.1:8000/v1 (repeatable)")
    p.add_argument("--judge-for", action="append", metavar="DATASET=MODEL",
                   help="a judge of one dataset's questions, on the originals and the reconstructions, e.g. "
                        "refcoco=qwen2.5-vl-72b (repeatable; its options: `judge_for_options: {refcoco: {...}}` "
                        "in --config)")
    p.add_argument("--judge-box-coords", choices=COORDS,
                   help="read the --judge's grounding boxes in this convention instead of its own (Qwen3-VL: "
                        "1000, Qwen2.5-VL: pixel; a --judge-for judge keeps its own); inferred per answer when "
                        "neither is known")
    p.add_argument("--judge-max-new-tokens", type=whole_number(1), default=32, help="longest answer (default 32)")
    p.add_argument("--sigma", type=real_number(0, low_open=True), default=DEFAULT_SIGMA,
                   help=f"Eq. 4 tolerance in percentage points (default {DEFAULT_SIGMA:g})")
    p.add_argument("--limit", type=whole_number(1, MAX_LIMIT), help="the first N questions of each dataset only")
    p.add_argument("--no-normalise", dest="normalise", action="store_false",
                   help="give captions to the generator as written (default: markdown, list markers and line "
                        "breaks stripped; the raw text is kept in captions.jsonl)")
    p.add_argument("--size", metavar="WxH", help="size of every reconstruction (default: the source's aspect ratio "
                                                 "at --max-side)")
    p.add_argument("--max-side", type=whole_number(16), help="long side of reconstructions (default 1024)")
    p.add_argument("--template", help="prompt template with {caption}, or a preset (default: plain)")
    p.add_argument("--seed", type=whole_number(0, 2**63 - 1), help="base seed of the reconstructions (each image's derives from it)")
    p.add_argument("--config", help="YAML or TOML file of run settings (generator, judge, their options, size...)")
    plugin_option(p)
    p.add_argument("--batch-size", type=whole_number(1), help="images per captioner, generator or judge batch "
                   "(default 16)")
    p.add_argument("--cache-dir", help="content-addressed cache (default $CAPRECON_CACHE or ~/.cache/caprecon)")
    p.add_argument("--no-cache", action="store_const", const=True,
                   help="reuse nothing from earlier runs; keep this run's results in OUT/store")
    p.add_argument("--out", "-o", help="run folder for table.md/csv, summary.json, records.jsonl, captions.jsonl, "
                                       "images.jsonl and manifest.json")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar or table")
    p.add_argument("--allow-row-errors", action="store_true",
                   help="exit 0 even when some questions got no answer (their record's `error` says why)")
    p.set_defaults(func=cmd_suite, writes=Writes(outputs="table.md"))

    p = subparsers.add_parser(
        "suite-agree", help="Kendall tau between the task suite's ranking of captioners and CTTD's (turing)",
        description="Rank the captioners of a `caprecon suite` run by their average, and by their Caption "
                    "Turing Test score on CTTD, and print both rankings side by side with Kendall's tau_b.")
    p.add_argument("--suite-run", required=True, help="a `caprecon suite --out` folder or its summary.json")
    p.add_argument("--turing", action="append", required=True, metavar="LABEL=RUN_OR_NUMBER",
                   help="a captioner's turing score: a `caprecon score --metric turing --out` folder, its "
                        "summary.json, or the number (repeatable; LABEL as in the suite's table)")
    p.add_argument("--metric", default="turing", help="the run's metric to read (default turing)")
    p.add_argument("--out", "-o", help="write agreement.json here")
    p.set_defaults(func=cmd_suite_agree, writes=Writes(inputs=("suite_run",), outputs="agreement.json"))


def cmd_suite(args: argparse.Namespace) -> int:
    from caprecon.run.config import RunConfig
    from caprecon.apps.suites import caption_sources, load_suites, suite

    file_values = load_config_file(args.config, allow_plugins=args.allow_plugins) if args.config else {}
    keys = ("generator", "judge", "size", "max_side", "template", "seed", "batch_size", "cache_dir", "no_cache")
    settings = {**file_values, **{k: getattr(args, k) for k in keys if getattr(args, k) is not None}}
    for role in ("generator", "judge"):
        given = parse_options(getattr(args, f"{role}_opt"))
        if given:
            settings[f"{role}_options"] = {**(file_values.get(f"{role}_options") or {}), **given}
    if args.judge_for:
        settings["judge_for"] = {**(file_values.get("judge_for") or {}), **parse_pairs(args.judge_for, "--judge-for", "DATASET")}
    cfg = RunConfig.build(**settings)
    suites = load_suites(args.suite, args.data)
    sources = caption_sources(args.captioners or [], args.captions or [])
    results = suite(suites, sources, config=cfg, out=args.out,
                              captioner_options=parse_options(args.captioner_opt), prompt=args.prompt,
                              max_words=args.max_words, caption_max_new_tokens=args.caption_max_new_tokens,
                              judge_max_new_tokens=args.judge_max_new_tokens, judge_box_coords=args.judge_box_coords,
                              normalise=args.normalise, sigma=args.sigma, limit=args.limit, progress=not args.quiet)
    if not args.quiet:
        print(results.table.to_text())
    return row_failures(failed_records(results.records, "question"), allow=args.allow_row_errors)


def cmd_suite_agree(args: argparse.Namespace) -> int:
    from caprecon.apps.suites.agreement import suite_averages, surrogate_agreement, turing_score

    surrogate = {}
    for entry in args.turing:
        label, sep, value = entry.partition("=")
        if not sep or not label.strip() or not value.strip():
            raise ConfigError(f"--turing {entry!r} must look like LABEL=RUN_OR_NUMBER")
        surrogate[label.strip()] = turing_score(value.strip(), args.metric)
    agreement = surrogate_agreement(suite_averages(args.suite_run), surrogate)
    print(agreement.to_text())
    if args.out:
        (Path(args.out) / "agreement.json").write_text(json.dumps(agreement.to_dict(), indent=2))
    return 0
