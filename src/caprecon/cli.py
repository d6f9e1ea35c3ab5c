"""The `caprecon` command."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from .config import ConfigError, parse_options
from .models.common import ModelNotFoundError
from .samples import SampleFormatError


def _add_run_options(p: argparse.ArgumentParser, *, for_meta: bool = False) -> None:
    if not for_meta:  # `meta` has its own --metric, --seed and --out
        p.add_argument("--metric", "-m", action="append", dest="metrics", metavar="NAME",
                       help="metric to compute (repeatable); see `caprecon models`")
        p.add_argument("--seed", type=int)
        p.add_argument("--out", "-o", help="run folder for scores.jsonl, summary.json/csv and manifest.json")
    p.add_argument("--preset", help="run preset: paper-recon, fast, offline")
    p.add_argument("--config", help="YAML or TOML file of settings (same names as the options)")
    p.add_argument("--generator", "-g", help="registry name, hub id, local folder or module:Class")
    p.add_argument("--generator-opt", action="append", metavar="KEY=VALUE",
                   help="generator option, e.g. steps=8, guidance=0, dtype=bfloat16 (repeatable)")
    p.add_argument("--embedder", "-e", help="registry name, hub id, local folder or module:Class")
    p.add_argument("--embedder-opt", action="append", metavar="KEY=VALUE")
    p.add_argument("--clip", help="CLIP model for clip-image (name, hub id or folder)")
    p.add_argument("--judge", help="VLM judge of turing/vqascore/fleur: name, hub id or folder")
    p.add_argument("--judge-opt", action="append", metavar="KEY=VALUE",
                   help="judge option, e.g. base_url=http://127.0.0.1:8000/v1 for an OpenAI-compatible server")
    p.add_argument("--llm", help="text LLM of captionqa: name, hub id or folder")
    p.add_argument("--llm-opt", action="append", metavar="KEY=VALUE")
    p.add_argument("--qa-bank", help="QA bank JSONL (image_id, question, category, type, choices, answer)")
    p.add_argument("--vqa-on", choices=["image", "reconstruction", "both"], help="what VQAScore looks at")
    p.add_argument("--vqa-template", help="VQAScore question with {caption}")
    p.add_argument("--vqa-normalise", action="store_const", const=True,
                   help="VQAScore as P(yes)/(P(yes)+P(no)) instead of the raw P('Yes')")
    p.add_argument("--template", help="prompt template with {caption}, or a preset: plain, photo, remote-sensing")
    p.add_argument("--seed-policy", choices=["per-sample", "per-image", "fixed"])
    p.add_argument("--max-side", type=int, help="long side of reconstructions (default 1024)")
    p.add_argument("--no-upscale", dest="upscale", action="store_const", const=False,
                   help="keep sources smaller than --max-side at their own size")
    p.add_argument("--size", metavar="WxH", help="size of every reconstruction (default: the source's aspect ratio "
                   "at --max-side; caption-only rows: the generator's native resolution)")
    p.add_argument("--normalise-captions", action="store_const", const=True,
                   help="strip markdown, list markers and line breaks from captions first (raw text kept as "
                        "caption_raw); off by default so existing scores do not change")
    p.add_argument("--batch-size", type=int)
    p.add_argument("--cache-dir", help="content-addressed cache (default $CAPRECON_CACHE or ~/.cache/caprecon)")
    p.add_argument("--no-cache", action="store_const", const=True,
                   help="reuse nothing from earlier runs; keep this run's results in OUT/store")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar or table")


def _settings(args: argparse.Namespace) -> dict:
    keys = ("preset", "generator", "embedder", "clip", "judge", "llm", "qa_bank", "vqa_on", "vqa_template",
            "vqa_normalise", "template", "seed", "seed_policy", "max_side", "upscale", "size", "normalise_captions",
            "batch_size", "cache_dir", "no_cache")
    settings = {k: getattr(args, k) for k in keys if getattr(args, k, None) is not None}
    for role in ("generator", "embedder", "judge", "llm"):
        pairs = getattr(args, f"{role}_opt")
        if pairs:
            settings[f"{role}_options"] = parse_options(pairs)
    return settings


def cmd_score(args: argparse.Namespace) -> int:
    from .api import score

    results = score(args.input, metrics=args.metrics, config=args.config, out=args.out,
                    progress=not args.quiet, images_root=args.images_root, annotations=args.annotations,
                    **_settings(args))
    if not args.quiet:
        _report(results)
    return 0


def _report(results) -> None:
    print(results.table())
    print()
    print(results.summary_table())
    clip_cut = sum(1 for r in results.records if r.get("clip_tokens_cut"))
    if clip_cut:
        print(f"note: {clip_cut} caption(s) exceed CLIP's 77 text tokens and were cut (clip_tokens_cut); "
              "CLIP-based scores of long captions judge only their start")
    used = results.manifest["models"]
    for role, info in used.items():
        print(f"{role}: {info.get('model') or info.get('backend') or info}")
    if "turing" in results.metric_names and results.summary["metrics"]["turing"]["n"]:
        from .report import category_table

        print()
        print(category_table(results.records).to_text())
    if results.out:
        print(f"run folder: {results.out}")


def cmd_meta(args: argparse.Namespace) -> int:
    from .api import score
    from .meta import scores_from_records
    from .meta_cli import run_meta_command

    settings = _settings(args)
    settings.pop("seed", None)  # meta's --seed seeds the bootstrap, not the reconstructions

    def score_metric(name, samples):
        results = score(samples, metrics=[name], config=args.config, progress=not args.quiet, **settings)
        return scores_from_records(results.records, results.metric_names[0], [s.id for s in samples])

    return run_meta_command(args, score_metric=score_metric)


def cmd_report(args: argparse.Namespace) -> int:
    from .report import category_table, write_report

    table = category_table(args.run, metric=args.metric)
    paths = write_report(table, args.out or args.run)
    print(table.to_text())
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from .metrics import METRICS
    from .models.registry import describe_registry

    table = describe_registry()
    table["metric"] = {name: about for name, (_, about) in METRICS.items()}
    if args.json:
        print(json.dumps(table, indent=2))
        return 0
    for role in ("preset", "caption-preset", "metric", "generator", "embedder", "matcher", "judge", "llm", "captioner"):
        print(f"{role}s:")
        for name, about in table[role].items():
            print(f"  {name:20s} {about}")
        print()
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    run_demo(out=args.out, quiet=args.quiet)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="caprecon", description="Caption evaluation by reconstruction.")
    parser.add_argument("--verbose", "-v", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("score", help="score captions")
    p.add_argument("--input", "-i", required=True,
                   help="JSONL/CSV/COCO results JSON/parquet file, a datasets folder, or an image folder")
    p.add_argument("--images-root", help="folder that relative image paths resolve against")
    p.add_argument("--annotations", help="COCO captions annotations (for a COCO results JSON)")
    _add_run_options(p)
    p.set_defaults(func=cmd_score)

    p = sub.add_parser("meta", help="agreement of metrics with human judgments (Kendall tau, CIs) and probes")
    from .meta_cli import add_meta_arguments

    add_meta_arguments(p)
    _add_run_options(p, for_meta=True)
    p.set_defaults(func=cmd_meta)

    from .caption_cli import add_parser as add_caption_parser

    add_caption_parser(sub)
    from .t2i_cli import add_parser as add_t2i_parser

    add_t2i_parser(sub)
    from .suite_cli import add_parser as add_suite_parsers

    add_suite_parsers(sub)

    p = sub.add_parser("report", help="per-category table and radar chart of a run's question-bank metric")
    p.add_argument("run", help="run folder (or its scores.jsonl)")
    p.add_argument("--metric", default="turing", help="turing or captionqa")
    p.add_argument("--out", help="where to write categories.md/.csv and radar.png (default: the run folder)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("models", help="list metrics, presets and registered models")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("demo", help="score the bundled examples offline (no text-to-image model needed)")
    p.add_argument("--out", default="runs/demo")
    p.add_argument("--quiet", "-q", action="store_true")
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    if not args.verbose:
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()  # one bar for the run, not one per weight file
    try:
        return args.func(args)
    except (ConfigError, ModelNotFoundError, SampleFormatError, FileNotFoundError) as exc:
        print(f"caprecon: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
