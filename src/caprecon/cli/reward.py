"""`caprecon reward-audit` (how a reward responds to padding and repetition, before training with it)
and `caprecon distill` (a reward model trained on earlier runs' scores)."""

from __future__ import annotations

import argparse
import json

from caprecon.cli.common import (Writes, add_image_root_options, add_run_options,
                                 real_number, run_settings, whole_number)
from caprecon.core.checks import MAX_EPOCHS, MAX_WIDTH, number_problem
from caprecon.core.errors import ConfigError
from caprecon.core.tables import format_table, number


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "reward-audit", help="how a reward responds to caption length, padding and repetition",
        description="Scores each caption as given, padded with generic words, and said twice, with the reward "
                    "caprecon.Reward builds from these options, and prints the Spearman correlation of the reward "
                    "with length and with repetition and its mean change when padded or repeated: from the "
                    "metrics alone and with the guards.")
    p.add_argument("--input", "-i", required=True, help="captions: JSONL/CSV with id, image, caption")
    add_image_root_options(p)
    p.add_argument("--metric", "-m", action="append", dest="metrics", metavar="NAME",
                   help="a metric of the reward (repeatable; default recon); distilled:FOLDER for a distilled one")
    p.add_argument("--weight", action="append", metavar="METRIC=W", help="a metric's weight (default 1)")
    p.add_argument("--seed", type=whole_number(0, 2**63 - 1), help="base seed of the reconstructions (default 0)")
    p.add_argument("--length-target", type=whole_number(1), default=60, help="words before the length term "
                   "starts (default 60)")
    p.add_argument("--length-weight", type=real_number(0), default=0.5,
                   help="length term: -W * max(0, words / target - 1) (default 0.5; 0: off)")
    p.add_argument("--repetition-n", type=whole_number(1), default=3, help="n of the repeated n-grams (default 3)")
    p.add_argument("--repetition-weight", type=real_number(0), default=1.0,
                   help="repetition term: -W * share of repeated n-grams (default 1; 0: off)")
    p.add_argument("--hallucination-weight", type=real_number(0), default=1.0,
                   help="with --judge and --llm: -W * (1 - halluc) (default 1; 0: off)")
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    add_run_options(p, for_meta=True)
    p.set_defaults(func=cmd_audit, writes=Writes(folder=None, inputs=("input",), files=("json",)))

    d = subparsers.add_parser(
        "distill", help="train a small reward model on earlier runs' scores (no text-to-image model needed)",
        description="Reads the (image, caption, METRIC) rows of run folders, embeds them with a frozen image and "
                    "text encoder (cached in the store), trains a small head, and reports on held-out images "
                    "(split by image) the Spearman and Kendall correlation with the metric, the accuracy on pairs "
                    "of captions of one image and the speed-up. Writes config.json, model.safetensors and "
                    "manifest.json into --out; use it as -m distilled:OUT.")
    d.add_argument("runs", nargs="+", metavar="RUN", help="run folders whose scores.jsonl has the metric")
    d.add_argument("--metric", "-m", required=True, help="the metric to learn (a column of scores.jsonl)")
    d.add_argument("--out", "-o", required=True, help="new folder for the distilled reward")
    d.add_argument("--image-encoder", help="frozen image encoder: embedder name, folder or module:Class (default: "
                                           "for the reconstruction objective the runs' embedder, else "
                                           "efficientnet-lite0)")
    d.add_argument("--text-encoder", help="frozen text encoder: a matcher (imagenet-labels: MiniLM, the default; "
                                          "clip) or module:Class with embed_texts")
    d.add_argument("--objective", choices=["auto", "reconstruction", "value", "pairs"], default="auto",
                   help="reconstruction: learn each caption's reconstruction embedding and score the image's "
                        "cosine with it (runs of reconstruction metrics); value: regress the metric; pairs: learn "
                        "which of two captions of one image scores higher; auto (default): reconstruction for a "
                        "metric comparing embeddings (recon, clip-image) whose rows name their reconstructions, "
                        "else value")
    d.add_argument("--holdout", type=real_number(0, 1, low_open=True, high_open=True), default=0.2,
                   help="share of images held out for the report (default 0.2)")
    d.add_argument("--epochs", type=whole_number(1, MAX_EPOCHS), default=200, help="training epochs (default 200)")
    d.add_argument("--hidden", type=whole_number(1, MAX_WIDTH), default=256, help="width of the head (default 256)")
    d.add_argument("--seed", type=whole_number(0), default=0, help="seed of the split and the head (default 0)")
    d.add_argument("--cache-dir", help="store for the features (default $CAPRECON_CACHE or ~/.cache/caprecon)")
    d.add_argument("--quiet", "-q", action="store_true", help="no progress bars")
    # the prologue checks the runs and takes --out's lock; distill wants it new or holding nothing but the lock
    d.set_defaults(func=cmd_distill, writes=Writes(folder="out", inputs=("runs",), once=("runs",)))


def cmd_audit(args: argparse.Namespace) -> int:
    from caprecon.apps.reward import Guards
    from caprecon.apps.reward.audit import reward_audit

    settings = run_settings(args)
    guards = Guards(length_target=args.length_target, length_weight=args.length_weight,
                    repetition_n=args.repetition_n, repetition_weight=args.repetition_weight,
                    hallucination_weight=args.hallucination_weight)
    result = reward_audit(args.input, args.metrics, parse_weights(args.weight) if args.weight else None,
                          guards=guards, preset=settings.pop("preset", None),
                          config=settings.pop("config", None) or args.config, images_root=args.image_root,
                          max_image_bytes=args.max_image_bytes, progress=not args.quiet, **settings)
    table = [["", "metrics only", "with guards"]]
    for key, label in (("mean", "mean reward"), ("spearman_length", "Spearman with length"),
                       ("spearman_repetition", "Spearman with repetition"),
                       ("rise_padded", "rise when padded"), ("rise_repeated", "rise when repeated")):
        table.append([label, number(result.metrics[key]), number(result.reward[key])])
    print(format_table(table))
    print(f"{result.reward['scored']} of {result.captions} caption(s) scored; parts: {', '.join(result.parts)}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(result.figures(), fh, indent=2, allow_nan=False)  # figures are finite or None
    return 0 if result.reward["scored"] == result.captions else 1


def parse_weights(pairs: list[str]) -> dict[str, float]:
    """`--weight METRIC=W`: the metric as written (bleu-4 stays bleu-4), W a finite number, each metric once."""
    weights: dict[str, float] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ConfigError(f"--weight {pair!r} must look like METRIC=W")
        if name in weights:
            raise ConfigError(f"--weight {pair!r}: {name} is given a weight twice")
        try:
            value = float(text)
        except ValueError:
            raise ConfigError(f"--weight {pair!r}: W must be a number, not {text!r}") from None
        problem = number_problem(value)
        if problem:
            raise ConfigError(f"--weight {pair!r}: W {problem}")
        weights[name] = value
    return weights


def cmd_distill(args: argparse.Namespace) -> int:
    from caprecon.apps.distill import distill

    result = distill(args.runs, args.metric, args.out, image_encoder=args.image_encoder,
                     text_encoder=args.text_encoder, objective=args.objective, holdout=args.holdout,
                     epochs=args.epochs, hidden=args.hidden, seed=args.seed, cache_dir=args.cache_dir,
                     progress=not args.quiet)
    r, held = result.report, result.report["held_out"]
    print(f"objective {r['objective']}: trained on {r['train_rows']} rows of {r['train_images']} images "
          f"({r['train_seconds']:.1f} s); "
          f"held out: {held['rows']} rows of {held['images']} images")
    shown = {k: "undefined" if held[k] is None else number(held[k]) for k in ("spearman", "kendall",
                                                                               "pairwise_accuracy")}
    print(f"Spearman {shown['spearman']}  Kendall {shown['kendall']}  "
          f"pairwise accuracy {shown['pairwise_accuracy']} ({held['pairs']} pairs)")
    if held["spearman"] is None:
        print("(a correlation is undefined where the held-out values, or the predictions, are all equal)")
    speedup = f"{r['speedup']:.0f}x" if r["speedup"] else "unknown (the runs recorded no model time)"
    print(f"{r['distilled_seconds_per_row'] * 1000:.1f} ms per row; speed-up over {args.metric}: {speedup}")
    print(f"use it as -m distilled:{result.out}")
    return 0
