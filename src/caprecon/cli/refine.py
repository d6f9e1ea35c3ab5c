"""`caprecon refine`: captions revised from their own reconstructions, a revision kept only if it scores higher."""

from __future__ import annotations

import argparse
import sys

from caprecon.core.checks import MAX_ROUNDS
from caprecon.cli.common import (Writes, add_image_root_options, add_run_options, real_number, row_failures, run_settings,
                                 whole_number)
from caprecon.core.tables import format_table, number, terminal_safe
from caprecon.run.config import parse_options


def share(text: str) -> float:
    """A number strictly between 0 and 1 (--holdout)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, not {text!r}") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be strictly between 0 and 1, not {text}")
    return value


def add_refine_options(p: argparse.ArgumentParser) -> None:
    """The options `refine` and `caption --refine` share (the reviser and --select are each command's own)."""
    p.add_argument("--margin", type=real_number(0), default=0.0,
                   help="keep a revision only if it beats the caption it revises by more than this (default 0); "
                        "with --seeds K, only if the 95%% interval of its per-seed gain lies above it")
    p.add_argument("--feedback", metavar="SOURCES",
                   help="what the reviser is told, comma-separated: flipped (the Caption Turing Test questions "
                        "answered right on the image and wrong on its reconstruction; needs --qa-bank), "
                        "unsupported (the hallucination metric's unsupported claims; needs halluc in --select), "
                        "differences (the judge describes both images, the --llm lists the differences). "
                        "Default: every source the settings allow")
    p.add_argument("--holdout", type=share, default=0.5, metavar="SHARE",
                   help="with flipped feedback, the share of each image's QA-bank questions held out from the "
                        "reviser (default 0.5, at least one question and at most all but one per image, chosen "
                        "by a hash of the image id and the question): the reviser is told only the other, "
                        "guiding questions, and the guard and the reported gain read only the held-out ones")


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "refine", help="improve captions from their own reconstructions: revise, rescore, keep only gains",
        description="Each round, every caption is reconstructed and its feedback collected (the questions that "
                    "flip, unsupported claims, differences between the image and the reconstruction); the "
                    "captioner (seeing the image) or the LLM (seeing the caption and the feedback) revises it "
                    "within the generator's token budget, and the revision is kept only if it scores higher by "
                    "--select. A caption stops when a round brings no gain. Writes refined.jsonl/.parquet, "
                    "rounds.jsonl (resumable), rounds.csv, report.html and manifest.json into --out.")
    p.add_argument("--input", "-i", required=True, help="captions to refine: JSONL/CSV with id, image, caption")
    add_image_root_options(p)
    p.add_argument("--out", "-o", required=True, help="run folder (a killed run resumes from it)")
    p.add_argument("--captioner", "-c", help="reviser that sees the image: registry name, hub id, folder or "
                                             "module:Class (default: the --llm, which sees only the text)")
    p.add_argument("--captioner-opt", action="append", metavar="KEY=VALUE", help="captioner option (repeatable)")
    p.add_argument("--rounds", type=whole_number(1, MAX_ROUNDS), default=2, help="most revisions per caption (default 2)")
    p.add_argument("--select", help="metric that decides (recon, turing, ...) or a weighted sum such as "
                                    "recon=0.7,turing=0.3 (default recon)")
    p.add_argument("--seed", type=whole_number(0, 2**63 - 1), help="seeds the reconstructions' noise")
    p.add_argument("--allow-row-errors", action="store_true",
                   help="exit 0 even when some captions could not be refined (their rows keep an `error`)")
    add_refine_options(p)
    add_run_options(p, for_meta=True)
    p.set_defaults(func=cmd_refine, writes=Writes(inputs=("input",), outputs="refined.jsonl"))
    return p


def cmd_refine(args: argparse.Namespace) -> int:
    from caprecon.apps.refine import refine

    from caprecon.cli.commands import INTERRUPTED

    settings = run_settings(args)
    try:
        run = refine(args.input, captioner=args.captioner, captioner_options=parse_options(args.captioner_opt),
                     select=args.select, rounds=args.rounds, margin=args.margin, feedback=args.feedback,
                     holdout=args.holdout,
                     image_root=args.image_root, max_image_bytes=args.max_image_bytes, out=args.out,
                     preset=settings.pop("preset", None), config=args.config, progress=not args.quiet, **settings)
    except KeyboardInterrupt:  # Ctrl-C, also inside a round's scoring (RunInterrupted)
        print(f"caprecon: interrupted: the finished rounds are in {args.out}/rounds.jsonl and every model result "
              "computed is in the cache; run the same command again to resume", file=sys.stderr)
        return INTERRUPTED
    failed = [row for row in run.captions if row["error"]]
    for row in failed:  # a row that could not be refined (its image escapes --image-root, ...): one line each
        print(terminal_safe(f"caprecon: row {row['id']}: {row['error']}"), file=sys.stderr)
    if not args.quiet:
        print_refined(run)
    return row_failures([f"{len(failed)} caption(s) could not be refined"] if failed else [],
                        allow=args.allow_row_errors)


def print_refined(run) -> None:
    from caprecon.apps.refine import HALVES

    halves = [h for h in HALVES if h in run.rounds[0]]  # with a split bank: its two halves side by side
    table = [["round", "captions", "mean score", *(h.replace("_", "-") for h in halves), "improved", "revised",
              "accepted"]]
    for row in run.rounds:
        improved = "" if row["improved"] is None else f"{row['improved']:.0%}"
        table.append([str(row["round"]), str(row["captions"]), number(row["mean_score"]),
                      *(number(row[h]) for h in halves), improved, str(row["revised"]), str(row["accepted"])])
    for line in format_table(table).splitlines():
        print(terminal_safe(line))
    print(f"improved {run.manifest['improved']} of {run.manifest['captions']} caption(s) "
          f"(selection {run.selection.describe()})")
