"""`caprecon caption`: sample N captions per image, score them all, keep the best (RemoteDescriber)."""

from __future__ import annotations

import argparse

from caprecon.core.checks import MAX_CANDIDATES, MAX_ROUNDS
from caprecon.cli.common import Writes, add_run_options, failed_records, real_number, row_failures, run_settings, whole_number
from caprecon.cli.refine import add_refine_options
from caprecon.run.config import parse_options


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "caption", help="best-of-N captioning: sample N captions per image, keep the best-scoring one",
        description="Sample N candidate captions per image, score every candidate with the selection metric(s) "
                    "and keep the best. All candidates of one image are reconstructed from the same noise, so "
                    "they differ only by their text. Writes candidates.jsonl, selected.jsonl/.parquet, "
                    "curve.csv/.md/.png and manifest.json into --out.")
    p.add_argument("--images", required=True, help="folder of images to caption")
    p.add_argument("--out", "-o", required=True, help="folder for the candidates, the selected captions and the curve")
    p.add_argument("--captioner", "-c", help="registry name, hub id, local folder or module:Class")
    p.add_argument("--captioner-opt", action="append", metavar="KEY=VALUE",
                   help="captioner option, e.g. dtype=bfloat16, batch_size=20, "
                        "base_url=http://127.0.0.1:8000/v1 for an OpenAI-compatible server (repeatable)")
    p.add_argument("--prompt",
                   help="detailed (default), limited (with --max-words), remote-sensing, or the prompt text")
    p.add_argument("--max-words", type=whole_number(1), help="length limit of the 'limited' prompt")
    p.add_argument("--n", type=whole_number(1, MAX_CANDIDATES), help="candidates per image (default 10)")
    p.add_argument("--temperature", type=real_number(0),
                   help="sampling temperature (default: the captioner's generation config, else 0.8)")
    p.add_argument("--top-p", type=real_number(0, 1, low_open=True),
                   help="nucleus sampling mass (default: the captioner's generation config, else 1: off)")
    p.add_argument("--top-k", type=whole_number(0),
                   help="sample from the k likeliest tokens (default: the captioner's generation config, else 0: off)")
    p.add_argument("--max-new-tokens", type=whole_number(1), help="longest caption in tokens (default 512)")
    p.add_argument("--select", help="metric that selects (recon, turing, vqascore, clipscore, ...) or a weighted "
                                    "sum such as recon=0.7,clipscore=0.3 (default recon)")
    p.add_argument("--seed", type=whole_number(0, 2**63 - 1), help="seeds the candidates' sampling and the reconstructions' noise")
    p.add_argument("--refine", type=whole_number(1, MAX_ROUNDS), metavar="R",
                   help="then refine each selected caption for up to R rounds with the captioner, as `caprecon "
                        "refine` does (written to OUT/refine)")
    add_refine_options(p)
    add_run_options(p, for_meta=True)
    for action in p._actions:  # the shared --preset also takes captioning presets here
        if action.dest == "preset":
            action.help = "captioning preset (remote-describer) or run preset (paper-recon, fast, offline)"
        if action.dest == "seed_policy":  # what one_noise_per_image enforces, not score's default
            action.help = ("per-image (the default here): every candidate of an image is rebuilt from the same "
                           "noise, so their scores differ by the caption alone; fixed: --seed for every caption; "
                           "per-sample is refused (it would add the noise's difference to the caption's)")
    p.add_argument("--allow-row-errors", action="store_true",
                   help="exit 0 even when some images could not be captioned or candidates not scored")
    p.set_defaults(func=cmd_caption, writes=Writes(inputs=("images",), outputs="selected.jsonl"))
    return p


def cmd_caption(args: argparse.Namespace) -> int:
    from caprecon.api import caption
    from caprecon.apps.selection import curve_markdown
    from caprecon.core.tables import terminal_safe

    settings = run_settings(args)
    run = caption(args.images, captioner=args.captioner, captioner_options=parse_options(args.captioner_opt),
                  select=args.select, n=args.n, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                  max_new_tokens=args.max_new_tokens, prompt=args.prompt, max_words=args.max_words,
                  refine=args.refine, margin=args.margin, feedback=args.feedback, holdout=args.holdout,
                  preset=settings.pop("preset", None), config=args.config,
                  out=args.out, progress=not args.quiet, **settings)
    problems = failed_records(run.candidates, "candidate")
    if args.quiet:
        return row_failures(problems, allow=args.allow_row_errors)
    for row in run.selected:
        caption_text = row["caption"] if len(row["caption"]) <= 70 else row["caption"][:69] + "…"
        print(terminal_safe(f"{row['image_id']}  #{row['candidate']}  {row['score']:.4f}  {caption_text}"))
    unselected = run.manifest["selection"]["unselected"]
    if unselected:
        print(f"no caption selected for {len(unselected)} image(s) (see candidates.jsonl): {', '.join(unselected)}")
    if run.curve:
        print()
        print(f"selection curve ({run.selection.describe()}): expected score of the selected caption")
        print(curve_markdown(run.curve), end="")
    if run.refined:
        from caprecon.cli.refine import print_refined

        print()
        print_refined(run.refined)
    return row_failures(problems, allow=args.allow_row_errors)
