"""Scale-out commands and options: stages run apart, Ray, shards, merges.

    caprecon reconstruct -i captions.jsonl -m recon -g sd3.5-medium --cache-dir /shared/cache
    caprecon embed       -i captions.jsonl -m recon -g sd3.5-medium -e dreamsim --cache-dir /shared/cache
    caprecon judge       -i captions.jsonl -m turing -g sd3.5-medium --judge qwen2.5-vl-7b --qa-bank bank.jsonl ...
    caprecon score ... --executor ray [--ray-address auto] [--ray-workers 2] [--stage reconstruct:gpus=1]
    caprecon score ... --shard 3/8 --out runs/a-3      (then)  caprecon merge runs/a-* --out runs/a
    caprecon store merge shard-caches/* --into cache
"""

from __future__ import annotations

import argparse
import json

from caprecon.cli.common import (Writes, add_image_root_options, add_run_options, add_shard_option, row_failures,
                                 run_settings)


def add_parser(plugins) -> None:

    for name, about in (("reconstruct", "fill the store with the reconstructions the metrics need (generator only)"),
                        ("embed", "fill the store with embeddings of sources and stored reconstructions "
                                  "(embedder only; never calls the generator)"),
                        ("judge", "fill the store with the judge's answers about sources and stored "
                                  "reconstructions (turing, vqascore, fleur, captionqa; never calls the generator)")):
        p = plugins.add_parser(name, help=about)
        p.add_argument("--input", "-i", required=True, help="the captions, as for `caprecon score`")
        add_image_root_options(p)  # as `score` reads them: a stage never opens what the scoring would refuse
        p.add_argument("--annotations", help="COCO captions annotations (for a COCO results JSON)")
        p.add_argument("--captions", metavar="FILE", help="for an image-folder --input: the captions file")
        p.add_argument("--allow-row-errors", action="store_true",
                       help="exit 0 even when some rows failed or lack their reconstruction")
        add_run_options(p)
        add_shard_option(p)
        p.set_defaults(func=_cmd_fill, stage=name, writes=Writes(inputs=("input",), ends=False))

    p = plugins.add_parser("merge", help="combine the run folders of `score --shard I/N` into one run folder")
    p.add_argument("shards", nargs="+", help="the shards' run folders (all N of them, each once)")
    p.add_argument("--out", "-o", required=True, help="run folder for the merged scores.jsonl, summary and manifest")
    p.add_argument("--input", "-i", metavar="FILE",
                   help="the input the shards were scored from (checked against the shards' fingerprint: another "
                        "file is refused). Not needed for the corpus-level values (BLEU's, METEOR's, CIDEr's, which "
                        "pool every row): they come from the statistics each shard keeps (corpus-statistics.json); "
                        "only for shards that keep none does the input give them, and without it the merged "
                        "summary leaves them out")
    p.add_argument("--allow-row-errors", action="store_true",
                   help="exit 0 even when some of the shards' rows failed (they keep their `error` field)")
    p.set_defaults(func=_cmd_merge, writes=Writes(inputs=("shards", "input"), outputs="scores.jsonl"))

    p = plugins.add_parser("store", help="operations across stores (see also `caprecon cache`)")
    sub = p.add_subparsers(dest="store_command", required=True)
    q = sub.add_parser("merge", help="copy the verified results of per-shard stores into one store")
    q.add_argument("sources", nargs="+", help="the stores (cache folders) to copy from")
    q.add_argument("--into", required=True, help="the store to copy into (created if absent)")
    q.set_defaults(func=_cmd_store_merge)


def _cmd_fill(args: argparse.Namespace) -> int:
    from caprecon.run.stages import stage

    settings = run_settings(args)
    result = stage(args.stage, args.input, args.metrics, preset=settings.pop("preset", None), config=args.config,
                   out=args.out, progress=not args.quiet, images_root=args.image_root,
                   max_image_bytes=args.max_image_bytes, annotations=args.annotations, captions=args.captions,
                   shard=args.shard, **settings)
    print(json.dumps(result.row()))
    return row_failures(result.problems, allow=args.allow_row_errors)


def _cmd_merge(args: argparse.Namespace) -> int:
    from caprecon.run.shards import merge

    summary = merge(args.shards, args.out, samples=args.input).summary
    print(f"merged {len(args.shards)} shards: {summary['samples']} rows, {summary['errors']} with errors")
    for name, s in summary["metrics"].items():
        pooled = ""
        if s.get("aggregate") == "corpus":
            pooled = f", corpus {s['corpus']}" if s.get("corpus") is not None else \
                ", corpus value left out (the shards keep no corpus statistics: give --input, the file they " \
                "scored, to compute it)"
        print(f"{name}: mean {s['mean']} (n={s['n']}){pooled}")
    print(f"rows scored: {summary['samples'] - summary['errors']} of {summary['samples']}")  # as `score` ends
    return row_failures([f"{reason}: {n} row(s)" for reason, n in summary["failed_by_reason"].items()],
                        allow=args.allow_row_errors)


def _cmd_store_merge(args: argparse.Namespace) -> int:
    from caprecon.store.maintenance import merge_stores

    counts = merge_stores(args.sources, args.into)
    print(json.dumps(counts))
    return 1 if counts["damaged"] else 0
