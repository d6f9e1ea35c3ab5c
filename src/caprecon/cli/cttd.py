"""`caprecon cttd build` and `caprecon cttd import`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from caprecon.cli.common import ROWS_FAILED, Writes, global_options, plugin_option, row_failures


# the drops `cttd import` names one per line before it says "and N more"
SHOWN_DROPS = 20


def add_parser(subparsers) -> None:
    cttd = subparsers.add_parser("cttd", help="build a Caption Turing Test QA bank from images, or import one")
    sub = cttd.add_subparsers(dest="cttd_command", required=True)

    p = sub.add_parser("build", help="run (or resume) the CTTD pipeline on an image folder",
                       description="select images, (propose questions and find categories,) generate, curate and "
                                   "rank QA pairs; a rerun resumes where the last one stopped")
    p.add_argument("--images", required=True, help="folder of images (searched recursively; sub-folders = sources)")
    p.add_argument("--out", "-o", required=True, help="build folder: stage outputs, bank.jsonl, datasheet.md/.json")
    p.add_argument("--config", help="YAML or TOML file of build settings (same names as the options)")
    global_options(p, default=argparse.SUPPRESS)
    plugin_option(p)
    for role, about in (("vlm", "questioner VLM (stages 2, 4); default qwen3-vl-32b"),
                        ("judge", "VLM that checks answers on the original image (stage 5); default: the --vlm"),
                        ("llm", "text LLM naming clusters and running --blind-filter; default qwen3-8b"),
                        ("embedder", "image embedder of stage 1; default clip"),
                        ("matcher", "joint text-image space of stages 3, 5, 6; default clip")):
        p.add_argument(f"--{role}", help=f"{about} (registry name, hub id, folder or module:Class)")
        p.add_argument(f"--{role}-opt", action="append", metavar="KEY=VALUE", help=f"{role} option (repeatable)")
    p.add_argument("--taxonomy", help="paper (the 15 categories, default), discover (stages 2-3), or a JSON file")
    p.add_argument("--min-side", type=int, help="drop images whose shorter side is under this (default 64)")
    p.add_argument("--uniform-std", type=float, help="drop near-uniform images: grey std under this (default 4)")
    p.add_argument("--duplicate-cos", type=float, help="near-duplicate images above this cosine (default 0.95)")
    p.add_argument("--density-band", type=float, nargs=2, metavar=("LOW", "HIGH"),
                   help="keep images whose GMM log-density lies between these quantiles (default 0.1 0.9)")
    p.add_argument("--gmm-components", type=int, help="Gaussian mixture components (default 8)")
    p.add_argument("--pca-dims", type=int, help="embedding dimensions kept before the mixture (default 64)")
    p.add_argument("--questions-per-image", type=int, help="stage 2: questions proposed per image (default 10)")
    p.add_argument("--dbscan-eps", type=float, help="stage 3: DBSCAN radius in cosine distance (default 0.15)")
    p.add_argument("--dbscan-min-samples", type=int, help="stage 3: DBSCAN core size (default 3)")
    p.add_argument("--propose-prompt", help="stage 2 prompt (file or text, with {n})")
    p.add_argument("--name-prompt", help="stage 3 prompt (file or text, with {questions})")
    p.add_argument("--generate-prompt", help="stage 4 prompt (file or text, with {category} {description} {m} "
                                             "{types})")
    p.add_argument("--qas-per-category", type=int, help="stage 4: m, pairs per image and category (default 5)")
    p.add_argument("--types", help="answer types to ask for, comma-separated (default mc,yesno,short,box)")
    p.add_argument("--box-coords", choices=["normalized", "1000", "pixel"],
                   help="box convention asked of the questioner (default normalized)")
    p.add_argument("--max-new-tokens", type=int, help="reply length limit of stages 2-4 (default 1024)")
    p.add_argument("--no-judge-check", dest="judge_check", action="store_const", const=False,
                   help="skip stage 5's answer check on the original image")
    p.add_argument("--judge-box-coords", choices=["normalized", "1000", "pixel"],
                   help="read the judge's boxes in this convention instead of its own (Qwen3-VL: 1000, "
                        "Qwen2.5-VL: pixel); inferred per answer when neither is known")
    p.add_argument("--qa-duplicate-cos", type=float, help="stage 5: near-duplicate questions above this (default 0.9)")
    p.add_argument("--blind-filter", action="store_const", const=True,
                   help="stage 5: leave out questions the --llm answers right without the image or a caption "
                        "(the default)")
    p.add_argument("--no-blind-filter", dest="blind_filter", action="store_const", const=False,
                   help="stage 5: no blind control (no --llm needed for it)")
    p.add_argument("--blind-keep", action="store_const", const=True,
                   help="stage 5: keep the questions the blind --llm answers right, flagged \"blind\": true in the bank")
    p.add_argument("--blind-permutations", type=int, help="choice rotations the blind LLM must all pass (default 3)")
    p.add_argument("--alpha", type=float, help="stage 6: redundancy weight of the ranking (default 0.5)")
    p.add_argument("--top-k", type=int, help="stage 6: pairs kept per image (default 15)")
    p.add_argument("--seed", type=int, help="seed of the image selection's PCA and Gaussian mixture (default 0)")
    p.add_argument("--cache-dir", help="model-result store (default: OUT/store)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bars or summary")
    p.add_argument("--allow-row-errors", action="store_true",
                   help="exit 0 even when images could not be read or model replies not parsed (the datasheet "
                        "counts them)")
    p.set_defaults(func=cmd_build, writes=Writes(trees=("images",), outputs="bank.jsonl"))

    p = sub.add_parser("import", help="turn an existing question set into a QA bank",
                       description="generic JSONL/JSON/CSV/TSV question files, or VLMEvalKit benchmark TSVs")
    p.add_argument("file", help="the question file")
    p.add_argument("--out", "-o", required=True, help="folder for bank.jsonl, images/ and datasheet.md/.json")
    p.add_argument("--format", choices=["auto", "generic", "vlmevalkit"], default="auto",
                   help="auto: vlmevalkit for a .tsv with index, question, answer and option columns")
    p.add_argument("--column", action="append", metavar="FIELD=COLUMN",
                   help="read a bank field (image_id, question, answer, type, category, choices, coords, id, image, "
                        "source) from another column (repeatable)")
    p.add_argument("--option-columns", help="columns holding one option each, comma-separated (e.g. A,B,C,D)")
    p.add_argument("--type", choices=["mc", "yesno", "short", "box"], help="type of rows without one")
    p.add_argument("--category", default="", help="category of rows without one")
    p.add_argument("--source", help="source name for the datasheet (default: the file's name)")
    p.add_argument("--id-prefix", default="", help="vlmevalkit: prefix of image ids (default: none, the index)")
    p.add_argument("--no-images", action="store_true", help="do not write the images to OUT/images (inline ones are still decoded: a broken one drops its questions)")
    p.add_argument("--image-root", metavar="DIR",
                   help="relative image paths resolve against DIR (default: the question file's folder), and every "
                        "image must lie inside it: a question whose image escapes it is dropped")
    p.set_defaults(func=cmd_import, writes=Writes(inputs=("file",), outputs="bank.jsonl"))


def _text_or_file(value: str | None) -> str | None:
    if value is None:
        return None
    path = Path(value)
    return path.read_text(encoding="utf-8") if path.is_file() else value


def build_settings(args: argparse.Namespace) -> dict:
    """The build settings the options give (`cttd_build` lays them over the --config file's)."""
    from caprecon.run.config import parse_options

    values: dict = {}
    for role in ("vlm", "judge", "llm", "embedder", "matcher"):
        if getattr(args, role) is not None:
            values[role] = getattr(args, role)
        options = parse_options(getattr(args, f"{role}_opt"))
        if options:
            values[f"{role}_options"] = options
    for name in ("taxonomy", "min_side", "uniform_std", "duplicate_cos", "density_band", "gmm_components", "pca_dims",
                 "questions_per_image", "dbscan_eps", "dbscan_min_samples", "qas_per_category", "box_coords",
                 "max_new_tokens", "judge_check", "judge_box_coords", "qa_duplicate_cos", "blind_filter",
                 "blind_keep", "blind_permutations", "alpha", "top_k", "seed"):
        if getattr(args, name) is not None:
            values[name] = getattr(args, name)
    for name in ("propose_prompt", "name_prompt", "generate_prompt"):
        if getattr(args, name) is not None:
            values[name] = _text_or_file(getattr(args, name))
    if args.types:
        values["types"] = [t.strip() for t in args.types.split(",") if t.strip()]
    return values


def cmd_build(args: argparse.Namespace) -> int:
    from caprecon.apps.cttd.pipeline import cttd_build

    result = cttd_build(args.images, args.out, config=args.config, allow_plugins=args.allow_plugins,
                        cache_dir=args.cache_dir, progress=not args.quiet, **build_settings(args))
    if not args.quiet:
        sheet = result.datasheet
        print(f"bank: {result.bank} — {sheet['questions']} questions about {sheet['images']} images")
        for stage in sheet["stages"]:
            dropped = ", ".join(f"{k} {v}" for k, v in stage["dropped"].items())
            state = "skipped" if stage.get("skipped") else "ran" if stage["stage"] in result.ran else "done before"
            print(f"  {stage['stage']:11s} {state:16s} {dropped}")
        print(f"datasheet: {result.folder / 'datasheet.md'}")
        print(f"report: {result.report}")
    if not result.datasheet["questions"]:
        print(f"caprecon: error: the bank holds no questions; {result.folder / 'datasheet.md'} says what each "
              "stage dropped", file=sys.stderr)
        return ROWS_FAILED
    # what a model or a file failed on, as against what curation chose to drop
    problems = [f"{stage['stage']}: {reason}: {n}" for stage in result.datasheet["stages"]
                for reason, n in stage["dropped"].items() if "unreadable" in reason]
    return row_failures(problems, allow=args.allow_row_errors)


def cmd_import(args: argparse.Namespace) -> int:
    from caprecon.apps.cttd.importers import cttd_import
    from caprecon.core.tables import terminal_safe
    from caprecon.run.config import parse_options

    result = cttd_import(args.file, args.out, format=args.format,
                         columns={k: str(v) for k, v in parse_options(args.column).items()},
                         option_columns=[c.strip() for c in (args.option_columns or "").split(",") if c.strip()],
                         default_type=args.type, default_category=args.category, source=args.source,
                         id_prefix=args.id_prefix, write_images=not args.no_images, image_root=args.image_root)
    print(f"bank: {result.bank} — {len(result.records)} questions about {result.datasheet['images']} images "
          f"({result.format})")
    if result.images:
        print(f"images: {Path(args.out) / 'images'} ({len(result.images)} written)")
    dropped = result.dropped
    if dropped:
        reasons = result.datasheet["stages"][0]["dropped"]
        counts = ", ".join(f"{reason}: {n}" for reason, n in reasons.items())
        print(f"dropped: {len(dropped)} question(s) whose image could not be used ({counts}); datasheet.json "
              f"lists them", file=sys.stderr)
        for d in dropped[:SHOWN_DROPS]:
            print(terminal_safe(f"  {d.where} (image {d.image_id}): {d.error}"), file=sys.stderr)
        if len(dropped) > SHOWN_DROPS:
            print(f"  ... and {len(dropped) - SHOWN_DROPS} more", file=sys.stderr)
        # the last word, as `score` ends when rows failed: what went wrong, not the last question's detail
        print(f"caprecon: {len(dropped)} question(s) dropped ({counts}); the bank holds the others", file=sys.stderr)
        return ROWS_FAILED  # questions were dropped, as `score` exits when rows failed
    return 0
