"""The `caprecon` command."""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import sys

from caprecon.cli.common import (CANNOT_RUN, ROWS_FAILED, Parser, Writes, add_image_root_options, add_run_options,
                                 global_options, plugin_option, real_number, run_command, run_settings)
from caprecon.core.errors import ConfigError, MetricContractError, ServerError
from caprecon.models.common import ModelNotFoundError
from caprecon.core.redaction import install_log_filter, redact_text
from caprecon.data.qa import QABankError
from caprecon.data.samples import SampleFormatError
from caprecon.store.errors import StoreError

# exit statuses besides ROWS_FAILED (1) and CANNOT_RUN (2): 141 (a shell's 128 + SIGPIPE) when the
# reader of stdout went away, as `caprecon ... | head` does
INTERRUPTED, READER_GONE = 130, 141
# what the user can fix: printed as one line, never a traceback
USER_ERRORS = (ConfigError, ModelNotFoundError, SampleFormatError, QABankError, FileNotFoundError, StoreError,
               MetricContractError)  # a plug-in metric's code is wrong (`reward-audit` raises it as it is)
# a disk that cannot take what a command writes: the user's to fix, like a bad setting
STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS}


def cmd_score(args: argparse.Namespace) -> int:
    from caprecon.api import score
    from caprecon.data.loaders import load_samples
    from caprecon.cli.common import score_settings

    if args.cascade or args.decision or args.budget is not None or args.by:
        return _cascade(args)
    # A split narrows a Karpathy split file; only then are samples read here rather than in score().
    source = load_samples(args.input, images_root=args.image_root, annotations=args.annotations,
                          captions=args.captions, split=args.split,
                          max_image_bytes=args.max_image_bytes) if args.split else args.input
    results = score(source, metrics=args.metrics, config=args.config, out=args.out,
                    progress=not args.quiet, images_root=args.image_root, max_image_bytes=args.max_image_bytes,
                    annotations=args.annotations,
                    captions=args.captions, **score_settings(args), **run_settings(args))
    if not args.quiet:
        _report(results)
    return _outcome(results.summary, allow_row_errors=args.allow_row_errors)


def _cascade(args: argparse.Namespace) -> int:
    """`score --cascade CHEAP --decision D`: the cheap metric on every row, the full one (-m) where open."""
    from caprecon.api import cascade
    from caprecon.cli.common import score_settings

    if not (args.cascade and args.decision):
        raise ConfigError("--cascade CHEAP and --decision go together (--budget and --by with them)")
    if len(args.metrics or []) > 1:
        raise ConfigError(f"--cascade decides on one full metric; give one -m, not {len(args.metrics)}")
    if args.split or args.shard or args.executor != "local":
        raise ConfigError("--cascade runs locally on the whole input: drop --split, --shard and --executor")
    score_settings(args)  # its refusals (ray options without --executor ray) hold here too
    results = cascade(args.input, cheap=args.cascade, metric=(args.metrics or ["recon"])[0], decision=args.decision,
                      budget=args.budget if args.budget is not None else 0.3, by=args.by, out=args.out,
                      progress=not args.quiet, images_root=args.image_root, max_image_bytes=args.max_image_bytes,
                      annotations=args.annotations, captions=args.captions, config=args.config, **run_settings(args))
    failed = [r for r in results.records if r.get("error")]
    if not args.quiet:
        for line in results.closing_lines():
            print(line)
    print(f"rows decided: {results.rows - len(failed)} of {results.rows}")
    if failed and not args.allow_row_errors:
        print(f"caprecon: {len(failed)} row(s) failed; their `error` field says why (--allow-row-errors exits 0)",
              file=sys.stderr)
        return ROWS_FAILED
    return 0


def _outcome(summary: dict, *, allow_row_errors: bool) -> int:
    """Rows scored, rows failed by reason (then `main` says where the outputs are); the exit status."""
    total, failed = summary["samples"], summary["errors"]
    print(f"rows scored: {total - failed} of {total}")
    if failed:
        reasons = ", ".join(f"{reason}: {n}" for reason, n in summary["failed_by_reason"].items())
        print(f"rows failed: {failed} ({reasons})")
    if total == 0:
        print("caprecon: error: the input holds no rows", file=sys.stderr)
        return ROWS_FAILED
    if failed and not allow_row_errors:
        print(f"caprecon: {failed} row(s) failed; their `error` field says why (--allow-row-errors exits 0)",
              file=sys.stderr)
        return ROWS_FAILED
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
        from caprecon.reports.categories import category_table

        print()
        print(category_table(results.records).to_text())


def cmd_meta(args: argparse.Namespace) -> int:
    from caprecon.cli.meta import run_meta_command

    settings = run_settings(args)
    settings.pop("seed", None)  # meta's --seed seeds the bootstrap, not the reconstructions
    # caprecon's own metrics (and one written outside caprecon, module:Class or an entry point) are scored
    # by `caprecon.score` with the run settings
    return run_meta_command(args, "caprecon", config=args.config, progress=not args.quiet, **settings)


def cmd_report(args: argparse.Namespace) -> int:
    from caprecon.apps.report import report

    result = report(args.run, metric=args.metric, out=args.out)
    if result.table is not None:
        print(result.table.to_text())
        for kind, path in result.files.items():
            print(f"{kind}: {path}")
    elif result.note:
        print(result.note)
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from caprecon.metrics import METRICS
    from caprecon.models.registry import describe_registry

    table = describe_registry()
    table["metric"] = {name: entry.about for name, entry in METRICS.items()}
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
    from caprecon.apps.demo import NOTICE, demo
    from caprecon.core.tables import format_table

    results = demo(out=args.out, progress=not args.quiet)
    if args.quiet:
        return 0
    rows = [["id", "quality", "caption", "own rank", "retrieved", "recon"]]
    for r in results.records:
        rows.append([r["id"], r.get("quality", ""), r["caption"][:50], str(r.get("source_rank", "")),
                     str(r.get("retrieved", "")),
                     f"{r['recon']:.4f}" if isinstance(r.get("recon"), float) else r.get("error", "")])
    print(format_table(rows))
    print()
    by_quality: dict[str, list[dict]] = {}
    for r in results.records:
        if isinstance(r.get("recon"), float):
            by_quality.setdefault(r.get("quality", "?"), []).append(r)
    for quality, scored in by_quality.items():
        mean = sum(r["recon"] for r in scored) / len(scored)
        first = sum(1 for r in scored if r.get("source_rank") == 1)
        print(f"{quality:9s} captions: mean recon {mean:.4f}, own photo ranked first {first} of {len(scored)}")
    print()
    generator, embedder = results.manifest["models"]["generator"], results.manifest["models"]["embedder"]
    matcher = generator["matcher"]
    print(f"generator: retrieval over {len(generator['gallery'])} bundled photos, the scored one left out; "
          f"caption-image match by "
          f"{matcher['classifier']['source']} ImageNet labels ({matcher['labels']}) embedded with "
          f"all-MiniLM-L6-v2 ({matcher['text_model_licence']})")
    print(f"embedder:  {embedder['source']} ({embedder['licence']}), 1280-d pooled features")
    print(f"\n{NOTICE}")  # the closing lines name the folder and the report
    return 0


def _show_nested_usage(sub: argparse._SubParsersAction) -> None:
    """`caprecon cttd --help` (and cache, store) ends with each of its commands' usage, so every
    option is found from the command a reader starts at, not only one level further down."""
    for command in sub.choices.values():
        nested = [a for a in command._actions if isinstance(a, argparse._SubParsersAction)]
        if not nested:
            continue
        usages = "\n".join(p.format_usage().rstrip() for p in nested[0].choices.values())
        command.formatter_class = argparse.RawDescriptionHelpFormatter
        command.epilog = "\n".join(filter(None, [command.epilog, "commands and their options:", usages]))


class _Subcommands:
    """What a command module's `add_parser(subparsers)` receives: `add_parser` as argparse's."""

    def __init__(self, add_parser):
        self.add_parser = add_parser


# The modules that register the other commands, by the commands each adds: a command line
# imports only the one it names (`caprecon cttd build ...` never imports the meta-evaluation code).
PLUGINS = {
    "caprecon.cli.caption": ("caption",),
    "caprecon.cli.refine": ("refine",),
    "caprecon.cli.reward": ("reward-audit", "distill"),
    "caprecon.cli.serve": ("serve",),
    "caprecon.cli.t2i": ("t2i", "text-to-image"),
    "caprecon.cli.suite": ("suite", "suite-agree"),
    "caprecon.cli.cache": ("cache",),
    "caprecon.cli.cttd": ("cttd",),
    "caprecon.cli.seeds": ("compare", "seeds"),
    "caprecon.cli.scale": ("reconstruct", "embed", "judge", "merge", "store"),
}


# One example per command, shown at the end of its --help; each is one the docs show (and
# tests/test_docs.py checks against the command's own parser).
EXAMPLES = {
    "score": "caprecon score -i captions.jsonl -m recon --preset offline --out runs/first",
    "meta": "caprecon meta --judgments judgments.jsonl --metric recon --preset offline --out runs/meta",
    "report": "caprecon report runs/first",
    "models": "caprecon models --json",
    "demo": "caprecon demo --out runs/demo",
    "caption": "caprecon caption --images photos/ --captioner qwen3-vl-8b --n 10 --select recon --out runs/best",
    "refine": "caprecon refine -i captions.jsonl --llm qwen3-8b --judge qwen3-vl-8b --qa-bank bank.jsonl "
              "--out runs/refined",
    "t2i": "caprecon t2i --input prompts.jsonl --generator sd35=sd3.5-medium --generator flux.1-dev --out runs/t2i",
    "suite": "caprecon suite --suite suites.yaml --captioner qwen3-vl-2b --out runs/suite",
    "suite-agree": "caprecon suite-agree --suite-run runs/suite --turing qwen3-vl-2b=runs/turing-qwen",
    "compare": "caprecon compare runs/a8 runs/b8",
    "seeds": "caprecon seeds runs/a8",
    "reconstruct": "caprecon reconstruct -i captions.jsonl -m recon --preset paper-recon --cache-dir /data/cache",
    "embed": "caprecon embed -i captions.jsonl -m recon --preset paper-recon --cache-dir /data/cache",
    "judge": "caprecon judge -i captions.jsonl -m turing --judge qwen3-vl-8b --qa-bank bank.jsonl",
    "merge": "caprecon merge runs/part-0 runs/part-1 --out runs/whole",
    "store": "caprecon store merge stages --into merged-store",
    "cache": "caprecon cache info --cache-dir my-cache",
    "cttd": "caprecon cttd build --images photos/ --out builds/photos --vlm qwen3-vl-32b --judge qwen3-vl-8b",
    "reward-audit": "caprecon reward-audit -i captions.jsonl -m recon --preset fast",
    "distill": "caprecon distill runs/a runs/b --metric recon --out rewards/recon",
    "serve": "caprecon serve -m recon --preset fast --replicas 2 --cache-dir /data/cache --keep vectors",
}


def _show_examples(sub: argparse._SubParsersAction) -> None:
    for name, command in sub.choices.items():
        if name in EXAMPLES:
            command.epilog = "\n".join(filter(None, [f"example: {EXAMPLES[name]}", command.epilog]))


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or, given the `command` a command line names, of only
    that one: what the others' options need is never imported."""
    import importlib

    builtin = ("score", "meta", "report", "models", "demo")
    known = {*builtin, *(name for names in PLUGINS.values() for name in names)}
    wanted = lambda name: command not in known or name == command  # noqa: E731
    parser = Parser(prog="caprecon", description="Caption evaluation by reconstruction.")
    global_options(parser, default=False)
    plugin_option(parser, default=False)
    common = argparse.ArgumentParser(add_help=False)
    global_options(common, default=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True)
    add_parser = lambda name, **kw: sub.add_parser(name, parents=[common], **kw)  # noqa: E731
    plugins = _Subcommands(add_parser)  # command modules register through it, and get the global options too

    def register(*modules: str) -> None:
        for module in modules:
            if any(wanted(name) for name in PLUGINS[module]):
                importlib.import_module(module).add_parser(plugins)

    if wanted("score"):
        p = add_parser("score", help="score captions")
        p.add_argument("--input", "-i", required=True,
                       help="JSONL/CSV/COCO results JSON/parquet file, a datasets folder, or an image folder")
        add_image_root_options(p)
        p.add_argument("--annotations", help="COCO captions annotations (for a COCO results JSON), or a Karpathy "
                       "split JSON whose sentences become the references")
        p.add_argument("--split", choices=("train", "val", "test", "restval"),
                       help="Karpathy split JSON: score only this split's images")
        p.add_argument("--captions", metavar="FILE",
                       help="for an image-folder --input: the captions file (default: captions.jsonl/.csv inside it)")
        p.add_argument("--allow-row-errors", action="store_true",
                       help="exit 0 even when some rows failed (they keep their `error` field)")
        add_run_options(p)
        from caprecon.cli.common import add_score_options

        add_score_options(p)
        cascade = p.add_argument_group(
            "cascade", "score every row with a cheap metric, and the full one (-m, default recon) only on the rows "
                       "whose decision the cheap score, calibrated on the rows reconstructed, leaves open")
        cascade.add_argument("--cascade", metavar="CHEAP", help="the cheap metric: clipscore, distilled:FOLDER, ...")
        cascade.add_argument("--decision", metavar="DECISION",
                             help="what the scores decide: best-of-n (captions of one image), rank (every caption, "
                                  "or the systems --by names) or threshold:X (keep at or above X)")
        cascade.add_argument("--budget", type=real_number(0, 1, low_open=True), metavar="FRACTION",
                             help="the most rows the full metric may score, as a fraction of all (default 0.3)")
        cascade.add_argument("--by", metavar="FIELD",
                             help="with --decision rank: rank the systems this field names (e.g. captioner) by their "
                                  "means, each the mean of its cheap predictions corrected by a random sample of its "
                                  "rows reconstructed, sampling more only where two systems' intervals overlap")
        p.set_defaults(func=cmd_score, writes=Writes(inputs=("input",), outputs="scores.jsonl"))

    if wanted("meta"):
        p = add_parser("meta", help="agreement of metrics with human judgments (Kendall tau, CIs) and probes")
        from caprecon.cli.meta import add_meta_arguments

        add_meta_arguments(p)
        add_run_options(p, for_meta=True)
        p.set_defaults(func=cmd_meta)

    register("caprecon.cli.caption", "caprecon.cli.refine", "caprecon.cli.reward", "caprecon.cli.serve",
             "caprecon.cli.t2i", "caprecon.cli.suite")
    if wanted("report"):
        p = add_parser("report", help="a run's report.html, and the per-category table and radar chart of its "
                                      "question-bank metric")
        p.add_argument("run", help="run folder (or its scores.jsonl)")
        p.add_argument("--metric", choices=("turing", "captionqa", "halluc"),
                       help="the metric of the per-category table and radar (default: turing, when the run has it; "
                            "halluc: precision by claim type, coverage and the pair per captioner; named here, a run "
                            "without it is an error)")
        p.add_argument("--out", help="where to write report.html, categories.md/.csv and radar.png "
                                     "(default: the run folder)")
        p.set_defaults(func=cmd_report, writes=Writes(inputs=("run",), default="run"))

    if wanted("models"):
        p = add_parser("models", help="list metrics, presets and registered models")
        p.add_argument("--json", action="store_true", help="print the table as JSON")
        p.set_defaults(func=cmd_models)

    if wanted("demo"):
        p = add_parser("demo", help="score the bundled examples offline (no text-to-image model needed)")
        p.add_argument("--out", default="runs/demo", help="run folder (default runs/demo)")
        p.add_argument("--quiet", "-q", action="store_true", help="no progress bar or table")
        p.set_defaults(func=cmd_demo, writes=Writes())

    register("caprecon.cli.cache", "caprecon.cli.cttd", "caprecon.cli.seeds", "caprecon.cli.scale")
    _show_examples(sub)
    _show_nested_usage(sub)
    return parser


def named_command(argv: list[str]) -> str | None:
    """The command a command line names: its first word that is not an option (the options
    before a command take no values)."""
    return next((word for word in argv if not word.startswith("-")), None)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(named_command(argv)).parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    install_log_filter()
    if not args.verbose:
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        if "transformers" in sys.modules:  # else it reads HF_HUB_DISABLE_PROGRESS_BARS when first imported
            from transformers.utils import logging as transformers_logging

            transformers_logging.disable_progress_bar()  # one bar for the run, not one per weight file
    from caprecon.run.failures import RunError, RunInterrupted

    try:
        code = run_command(args, args.func)
        sys.stdout.flush()  # a reader that went away is seen here, not in the interpreter's last flush
        return code
    except USER_ERRORS as exc:
        print(f"caprecon: error: {redact_text(str(exc))}", file=sys.stderr)
        return CANNOT_RUN
    except ServerError as exc:  # the one path for a model server that failed, whichever command asked it
        out = getattr(args, "out", None)
        kept = f"what finished is kept in {out}" if out else \
            "nothing was kept (no --out, --no-cache)" if getattr(args, "no_cache", None) else \
            "answers already received are in the cache"
        print(f"caprecon: error: {redact_text(str(exc))}; {kept}: once the server answers, run the same command "
              "again to resume", file=sys.stderr)
        return CANNOT_RUN
    except BrokenPipeError:
        # stdout's reader has all it wanted; point stdout at nothing so the exit's flush is quiet too
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (AttributeError, ValueError, OSError):  # stdout is no file (captured in-process)
            pass
        return READER_GONE
    except OSError as exc:
        if exc.errno not in STORAGE_ERRNOS:
            raise
        where = f" writing {exc.filename}" if exc.filename else ""
        print(f"caprecon: error: {exc.strerror}{where}", file=sys.stderr)
        return CANNOT_RUN
    except RunError as exc:
        out = getattr(args, "out", None)
        kept = f"; the {len(exc.records)} rows finished are in {out}/scores.jsonl: fix this and run the same " \
               "command again to resume" if out and exc.records else ""
        if exc.__cause__ is not None:  # with --verbose, the traceback of what stopped it (a bug shows where)
            logging.getLogger("caprecon").info("the run stopped on this error:", exc_info=exc.__cause__)
        print(f"caprecon: error: {redact_text(str(exc))}{kept}", file=sys.stderr)
        return CANNOT_RUN
    except RunInterrupted as stop:
        out = getattr(args, "out", None)
        saved = (f"{len(stop.records)} of {stop.total} rows are in {out}/scores.jsonl and {out}/summary.json "
                 "sums them up; run the same command again to resume") if out else \
            "no --out, so no rows were saved; model results already computed are in the cache"
        print(f"caprecon: interrupted: {saved}", file=sys.stderr)
        return INTERRUPTED
    except KeyboardInterrupt:
        print("caprecon: interrupted before any row was scored", file=sys.stderr)
        return INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
