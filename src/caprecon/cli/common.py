"""The options every run command shares, and the settings they turn into.

`add_run_options` are the models, reconstruction and cache options of `score`, `meta`,
`caption` and the split stages; `add_score_options` how `score` runs (Ray, shards).
"""

from __future__ import annotations

import argparse
import contextlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from caprecon.core.checks import MAX_SEEDS, count_problem, number_problem
from caprecon.core.errors import ConfigError
from caprecon.core.paths import path_problem
from caprecon.run.config import parse_options, parse_pairs, parse_seeds

# the exit status of a command some of whose rows failed (or that had none), whichever command it is;
# and of one that could not run (a usage error) or had to stop
ROWS_FAILED, CANNOT_RUN = 1, 2


class Parser(argparse.ArgumentParser):
    """argparse's parser, taking any number that begins with a minus for a value, not an option:
    argparse's own test knows only -1 and -.5, so `--alpha -1e-3` was refused as an unknown option
    (no option of caprecon's is spelled like a number). Subcommands' parsers are of the same class."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$|^-(inf|infinity|nan)$",
                                                   re.IGNORECASE)

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        # how the command line spelled each option, so a message about its value can name it; the
        # subcommand's parser ran first (inside super()), so its names are already there and win
        own = {action.dest: action.option_strings[0] if action.option_strings else action.dest
               for action in self._actions}
        namespace.option_names = {**own, **getattr(namespace, "option_names", {})}
        return namespace, extras


def path_value(text: str) -> Path:
    """An option's path, refused when empty: `Path("")` is the working folder, which an unset shell
    variable (`--out "$OUT"`) would otherwise write into or read unasked."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"is empty ({text!r}); give a path")
    return Path(text)


def whole_number(low: int, high: int | None = None):
    """An argparse `type` for a count in [low, high], so `--batch-size 0` or `--rounds 10**9` is
    refused up front, in the words the Python API uses (`caprecon.core.checks`)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number, not {text!r}") from None
        problem = count_problem(value, low, high)
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return value

    parse.__name__ = "whole number"
    return parse


def seed_count(text: str) -> int | str:
    """`--seeds`: a count K, or a range MIN..MAX / auto for adaptive seeds (checked with the run's settings)."""
    if ".." in text or text.strip() == "auto":
        try:
            low, high = parse_seeds(text)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        problem = count_problem(low, 2, MAX_SEEDS) or count_problem(high, low, MAX_SEEDS)
        if problem:
            raise argparse.ArgumentTypeError(f"MIN..MAX {problem}")
        return text.strip()
    return whole_number(1, MAX_SEEDS)(text)


def real_number(low: float | None = None, high: float | None = None, *, low_open: bool = False,
                high_open: bool = False):
    """An argparse `type` for a finite number in its range (NaN and inf refused), as `whole_number`."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, not {text!r}") from None
        problem = number_problem(value, low, high, low_open=low_open, high_open=high_open)
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return value

    parse.__name__ = "number"
    return parse


def cache_size(text: str) -> int:
    """A size in bytes from 10GB, 500MiB, ... (`caprecon cache prune --max-size`'s reading)."""
    from caprecon.cli.cache import parse_size  # the cache commands' module loads the store: only when asked

    return parse_size(text)


def global_options(p: argparse.ArgumentParser, default=None) -> None:
    """Options accepted before and after the subcommand; after it, they only override when given."""
    p.add_argument("--verbose", "-v", action="store_true", default=default,
                   help="log what each stage does (model loading, cache hits, retries)")


def plugin_option(p: argparse.ArgumentParser, default=argparse.SUPPRESS) -> None:
    """--allow-plugins, on the commands that read a --config file (it means nothing elsewhere); on a
    command it only overrides the one before the command when given."""
    p.add_argument("--allow-plugins", action="store_true", default=default,
                   help="load plug-ins (module:Class) named in a --config file or in a distilled:FOLDER's "
                        "config.json: they are code the run imports and calls, so only for files you trust "
                        "(plug-ins given as options always load)")


def add_run_options(parser: argparse.ArgumentParser, *, for_meta: bool = False) -> None:
    # in groups, so that --help shows what a reader needs first (a meta run on --scores files needs
    # none of the models) and not one list of sixty options
    p = parser
    if not for_meta:  # `meta` has its own --metric, --seed and --out
        p.add_argument("--metric", "-m", action="append", dest="metrics", metavar="NAME",
                       help="metric to compute (repeatable); see `caprecon models`")
        p.add_argument("--seed", type=whole_number(0, 2**63 - 1),
                       help="base seed of the reconstructions (default 0; see --seed-policy)")
        p.add_argument("--out", "-o", help="run folder for scores.jsonl, summary.json/csv and manifest.json")
    p = parser.add_argument_group(
        "models" + (" (only for metrics scored here: not those in --scores, nor bleu, cider, ...)" if for_meta else ""))
    p.add_argument("--preset", help="run preset: paper-recon, fast, offline")
    p.add_argument("--config", help="YAML or TOML file of settings (same names as the options)")
    plugin_option(p)
    p.add_argument("--generator", "-g", action="append",
                   help="registry name, hub id, local folder or module:Class; given twice or more, an ensemble: "
                        "reconstruction metrics report the mean over the generators (and --seeds) and how much of "
                        "the spread is the generator's and how much the seed's")
    p.add_argument("--generator-opt", action="append", metavar="KEY=VALUE",
                   help="generator option, e.g. steps=8, guidance=0, dtype=bfloat16 (repeatable)")
    p.add_argument("--embedder", "-e", help="registry name, hub id, local folder or module:Class")
    p.add_argument("--embedder-opt", action="append", metavar="KEY=VALUE",
                   help="embedder option, e.g. dtype=float16, device=cpu (repeatable)")
    p.add_argument("--clip", help="CLIP model for clip-image (name, hub id or folder)")
    p.add_argument("--judge", help="VLM judge of turing/vqascore/fleur: name, hub id or folder")
    p.add_argument("--judge-opt", action="append", metavar="KEY=VALUE",
                   help="judge option, e.g. base_url=http://127.0.0.1:8000/v1 for an OpenAI-compatible server")
    p.add_argument("--judge-for", action="append", metavar="CATEGORY=MODEL",
                   help="a judge for one question category of turing, e.g. grounding=qwen2.5-vl-72b (repeatable)")
    p.add_argument("--llm", help="text LLM of captionqa and of meta --probes: name, hub id or folder")
    p.add_argument("--llm-opt", action="append", metavar="KEY=VALUE",
                   help="text-LLM option, e.g. base_url=... for an OpenAI-compatible server (repeatable)")
    p = parser.add_argument_group("metric settings")
    p.add_argument("--iou-threshold", type=float, help="box answers are correct at IoU >= this (default 0.5)")
    p.add_argument("--qa-bank", help="QA bank JSONL (image_id, question, category, type, choices, answer)")
    p.add_argument("--vqa-on", choices=["image", "reconstruction", "both"], help="what VQAScore looks at")
    p.add_argument("--vqa-template", help="VQAScore question with {caption}")
    p.add_argument("--vqa-normalise", action="store_const", const=True,
                   help="VQAScore as P(yes)/(P(yes)+P(no)) instead of the raw P('Yes')")
    p.add_argument("--clipscore-weight", type=float, metavar="W",
                   help="clipscore's w in w·max(cos, 0) (default 2.5, Hessel et al.; 100 is the Caption Turing "
                        "Test paper's CLIP-S, also the metric clip-s)")
    p.add_argument("--clipscore-prefix", metavar="TEXT",
                   help="clipscore's text before the caption (default 'A photo depicts '; '' for none)")
    p.add_argument("--beta", type=float, help="halluc's F_beta of precision and coverage (default 1; above 1 "
                   "weighs coverage more)")
    p = parser.add_argument_group("reconstruction")
    p.add_argument("--template", help="prompt template with {caption}, or a preset: plain, photo, remote-sensing")
    p.add_argument("--seed-policy", choices=["per-sample", "per-image", "fixed"],
                   help="per-sample: a seed per (image, candidate) (default); per-image: one per image, shared by "
                        "its candidates; fixed: --seed for every caption")
    p.add_argument("--seeds", type=seed_count, metavar="K|MIN..MAX|auto",
                   help="reconstructions per caption (default 1): recon, clip-image, turing and vqascore on the "
                        "reconstruction report the mean over K seeds with its sd and 95%% interval. Costs K times "
                        "the generation; the cache keeps each seed, so raising K generates only the new ones. "
                        "MIN..MAX or auto (3..16), which need --target-width W: MIN seeds each, then as many more "
                        "(up to MAX) as a caption's first-stage variance says its 95%% interval needs to be W wide")
    p.add_argument("--target-width", type=real_number(0, low_open=True), metavar="W",
                   help="required with --seeds MIN..MAX or auto: the width of the 95%% interval each caption's seeds aim "
                        "at (e.g. 0.01); wider only for captions that reach MAX")
    p.add_argument("--adaptive-rule", choices=["mixture", "moderated", "pooled", "stein"],
                   help="adaptive seeds' variance for each caption's seed count and interval, from the first MIN "
                        "seeds: mixture (default: its own, moderated towards the other captions' by a mixture of "
                        "1-3 scaled inverse chi-square spreads fitted to them, so quiet and noisy captions each "
                        "borrow from their like; one spread is integrated over its parameters' uncertainty, so "
                        "a few captions keep some of their own), moderated (one such spread, as limma does), pooled (the mean "
                        "over captions: for noise alike) or stein (its own alone)")
    p.add_argument("--adaptive-stages", type=int, metavar="S",
                   help="adaptive seeds' most rounds of generation (default 5; stein: 2, the only count it "
                        "allows): MIN seeds, then at each decision the captions still open draw 0.35 (first) or "
                        "0.6 (later) of what their variance so far says they need, the variance refitted over "
                        "all captions' draws after each; a caption whose interval is already W wide stops, and "
                        "the last decision draws all of the rest. The rounds end "
                        "once no caption is open. Each round is one more generator batch per batch of captions "
                        "and one more pass over the input before scoring")
    p.add_argument("--ceiling", action="store_const", const=True,
                   help="also reconstruct each row's references (refs) with the caption's seeds: every "
                        "reconstruction score beside the references' mean and best and the ratio caption/references "
                        "(one more generation per reference and seed)")
    p.add_argument("--max-side", type=whole_number(16), help="long side of reconstructions (default 1024)")
    p.add_argument("--no-upscale", dest="upscale", action="store_const", const=False,
                   help="keep sources smaller than --max-side at their own size (paper-recon's setting)")
    p.add_argument("--upscale", dest="upscale", action="store_const", const=True,
                   help="scale sources smaller than --max-side up to it (the default, except under paper-recon)")
    p.add_argument("--size", metavar="WxH", help="size of every reconstruction (default: the source's aspect ratio "
                   "at --max-side; caption-only rows: the generator's native resolution)")
    p.add_argument("--normalise-captions", action="store_const", const=True,
                   help="strip markdown, list markers and line breaks from captions first (raw text kept as "
                        "caption_raw); off by default so existing scores do not change")
    p = parser.add_argument_group("execution and cache")
    p.add_argument("--batch-size", type=whole_number(1),
                   help="samples per model batch (default 16; halved automatically on out-of-memory)")
    p.add_argument("--workers", type=whole_number(0),
                   help="threads that read, hash and decode the next batch's images while the models run "
                        "(default 4; 0: in line). Raise it when a fast accelerator waits on image decoding")
    p.add_argument("--cache-dir", help="content-addressed cache (default $CAPRECON_CACHE or ~/.cache/caprecon)")
    p.add_argument("--cache-overlay", metavar="DIR",
                   help="writable store for new results when --cache-dir is read-only (default OUT/cache-overlay)")
    p.add_argument("--cache-read-only", action="store_const", const=True,
                   help="never write to --cache-dir (a shared cache); new results go to the overlay")
    p.add_argument("--no-cache", action="store_const", const=True,
                   help="reuse nothing from earlier runs; keep this run's results in OUT/store")
    p.add_argument("--keep", choices=["images", "vectors", "none"],
                   help="what the cache keeps: images (every reconstruction as a PNG, the default); vectors "
                        "(embeddings, answers and each reconstruction's record, no picture: a re-run scores from "
                        "them without generating, a picture asked for again is made again); none (nothing: the "
                        "scores in the run's rows are all that remain)")
    p.add_argument("--cache-max-size", type=cache_size, metavar="SIZE",
                   help="the most the cache may hold, e.g. 50GB: past it, the oldest entries are deleted as "
                        "the run writes (down to 90%%)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar or table")


def run_settings(args: argparse.Namespace) -> dict:
    keys = ("preset", "generator", "embedder", "clip", "judge", "llm", "qa_bank", "vqa_on", "vqa_template",
            "vqa_normalise", "clipscore_weight", "clipscore_prefix", "beta", "template", "seed", "seed_policy", "seeds", "target_width",
            "adaptive_rule", "adaptive_stages", "ceiling",
            "max_side", "upscale", "size", "normalise_captions", "batch_size", "workers", "cache_dir", "cache_overlay",
            "cache_read_only", "no_cache", "keep", "cache_max_size", "iou_threshold")
    settings = {k: getattr(args, k) for k in keys if getattr(args, k, None) is not None}
    settings["allow_plugins"] = bool(getattr(args, "allow_plugins", False))  # for the --config file
    if getattr(args, "judge_for", None):
        settings["judge_for"] = parse_pairs(args.judge_for, "--judge-for")
    for role in ("generator", "embedder", "judge", "llm"):
        pairs = getattr(args, f"{role}_opt")
        if pairs:
            settings[f"{role}_options"] = parse_options(pairs)
    return settings


def add_image_root_options(p: argparse.ArgumentParser) -> None:
    """--image-root and --max-image-bytes, for the commands that read the images an input file names."""
    p.add_argument("--image-root", "--images-root", dest="image_root", metavar="DIR",
                   help="relative image paths resolve against DIR (default: the input file's folder), and every "
                        "image must lie inside it: a row whose image escapes it is a row error")
    p.add_argument("--max-image-bytes", type=whole_number(1), metavar="N",
                   help="a row whose image file holds more bytes is a row error (default 64 MiB)")


def add_score_options(p: argparse.ArgumentParser) -> None:
    """`score`'s options for running elsewhere than in this process."""
    p.add_argument("--executor", choices=["local", "ray"], default="local",
                   help="local: this process (default); ray: Ray Data, each model stage an actor pool")
    p.add_argument("--ray-address", metavar="ADDRESS",
                   help="join this Ray cluster (e.g. auto, ray://head:10001); default: start Ray locally")
    p.add_argument("--ray-workers", type=whole_number(1), default=1,
                   help="--executor ray: actors per stage, unless --stage says otherwise (default 1)")
    p.add_argument("--stage", action="append", metavar="NAME:KEY=VALUE,...",
                   help="--executor ray: one stage's pool, e.g. reconstruct:workers=4,gpus=1,batch_size=8 or "
                        "turing:gpus=0.5, or turing:with=reconstruct to run a stage inside an earlier stage's "
                        "actors (stages: reconstruct and each metric; repeatable). recon and clip-image run "
                        "inside the reconstruct actors unless named here")
    p.add_argument("--retries", type=whole_number(0), default=3,
                   help="--executor ray: times a failed stage task is retried (default 3)")
    add_shard_option(p)


def add_shard_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shard", metavar="I/N",
                   help="work on slice I of N (0-based; all captions of an image in one slice); "
                        "`caprecon merge` joins the slices' run folders")


def score_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of `api.score` that `add_score_options` sets."""
    from caprecon.run.ray import parse_stage_options

    out: dict[str, Any] = {"executor": args.executor, "shard": args.shard}
    if args.executor == "ray":
        out["ray"] = {"address": args.ray_address, "workers": args.ray_workers, "retries": args.retries,
                      "stages": parse_stage_options(args.stage)}
    elif args.ray_address or args.stage or args.ray_workers != 1:
        raise ConfigError("--ray-address, --ray-workers and --stage need --executor ray")
    return out


def row_failures(problems: list[str], *, allow: bool) -> int:
    """How a command whose rows can fail ends: each kind of failure, with its count, on
    stderr; exit 1 unless --allow-row-errors, as `score` does."""
    import sys

    for problem in problems:
        print(f"caprecon: failed: {problem}", file=sys.stderr)
    if not problems or allow:
        return 0
    print("caprecon: some rows failed; --allow-row-errors exits 0 all the same", file=sys.stderr)
    return ROWS_FAILED


def failed_records(records, what: str = "row") -> list[str]:
    """'reason: how many' for the records that failed, by their `error_reasons` (else the
    first words of their `error`), for `row_failures`."""
    counts: dict[str, int] = {}
    for record in records:
        if record.get("error"):
            for reason in record.get("error_reasons") or [str(record["error"]).split(":")[0]]:
                counts[reason] = counts.get(reason, 0) + 1
    return [f"{reason}: {n} {what}(s)" for reason, n in counts.items()]


@dataclass(frozen=True)
class Writes:
    """What a command writes, as its parser declares it (`p.set_defaults(writes=Writes(...))`), so that
    `command_folder` checks and locks it before the command loads a model or reads a row.

    `folder`: the option (dest) naming its run folder; `default`: the option naming a run whose folder
    is written when `folder` is not given (`report`, `seeds`); `files`: options naming single files it
    writes (`--save`); `inputs`: options naming what it reads, which an output may not be; `trees`: options
    naming folders it searches to their depth, which an output may not lie inside either;
    `outputs`: the main file in the folder, for the closing lines; `ends`: whether it prints them; `once`:
    inputs whose paths may not repeat (a run given twice to `distill` would count its rows twice)."""

    folder: str | None = "out"
    inputs: tuple[str, ...] = ()
    trees: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    default: str | None = None
    outputs: str | None = None
    ends: bool = True
    once: tuple[str, ...] = ()

    def folder_of(self, args: argparse.Namespace) -> tuple[str | Path | None, bool]:
        """The folder the command writes, and whether the user named it."""
        given = getattr(args, self.folder, None) if self.folder else None
        if given is not None:  # as given: Path('') would be the working folder, and check_out refuses ''
            return given, True
        run = getattr(args, self.default, None) if self.default else None
        if run is None:
            return None, False
        return (Path(run) if not Path(run).is_file() else Path(run).parent), False


def _inputs_exist(args: argparse.Namespace, names: tuple[str, ...], once: tuple[str, ...] = ()) -> None:
    """A path the command reads that is not there, named by its option (`--input: not found: x.jsonl`);
    an empty one (an unset shell variable, which would read the working folder); and one that is neither
    a file nor a folder (a FIFO no one writes to hangs the command on opening it, a device never ends);
    and, for the options in `once`, a path given twice."""
    spelled = getattr(args, "option_names", {})
    for name in names:
        value = getattr(args, name, None)
        seen: dict[Path, Any] = {}
        for path in value if isinstance(value, (list, tuple)) else [value]:
            if path is None:
                continue
            problem = path_problem(path)
            if problem:
                raise ConfigError(f"{spelled.get(name, name)}: {problem}")
            if name in once and Path(path).resolve() in seen:  # its rows would count twice (distill's training rows)
                first = seen[Path(path).resolve()]
                also = f" (also as {first})" if str(first) != str(path) else ""
                raise ConfigError(f"{spelled.get(name, name)}: {path} is given twice{also}")
            seen[Path(path).resolve()] = path


@contextlib.contextmanager
def command_folder(args: argparse.Namespace) -> Iterator[Path | None]:
    """The run lifecycle's prologue for a command line (`caprecon.run.folder.run_folder`): every
    output checked, the folder locked until the command ends."""
    from caprecon.run.folder import check_out, run_folder

    writes: Writes | None = getattr(args, "writes", None)
    if writes is None:
        yield None
        return
    _inputs_exist(args, (*writes.inputs, *writes.trees, *filter(None, [writes.default])), writes.once)
    inputs = [getattr(args, name, None) for name in writes.inputs]
    trees = [getattr(args, name, None) for name in writes.trees]
    for name in writes.files:
        if getattr(args, name, None) is not None:
            check_out(getattr(args, name), inputs=inputs, trees=trees, option=f"--{name.replace('_', '-')}",
                      file=True)
    folder, named = writes.folder_of(args)
    if folder is None:
        yield None
        return
    option = f"--{writes.folder}" if named else "the run folder"
    with run_folder(folder, inputs=inputs if named else (), trees=trees if named else (), option=option) as out:
        yield out


def closing(args: argparse.Namespace) -> list[str]:
    """The closing lines of a command that writes a run folder (`caprecon.run.folder.closing_lines`)."""
    from caprecon.run.folder import closing_lines

    writes: Writes | None = getattr(args, "writes", None)
    if writes is None or not writes.ends:
        return []
    if writes.folder is None:  # a command writing single files: each one it wrote
        return [f"outputs: {getattr(args, name)}" for name in writes.files if getattr(args, name, None)]
    folder, _ = writes.folder_of(args)
    return closing_lines(folder, writes.outputs)


def run_command(args: argparse.Namespace, command) -> int:
    """A command through the run lifecycle: the prologue (`command_folder`), the command, and, unless
    it could not run (exit 2), the closing lines."""
    with command_folder(args):
        code = command(args)
    if code != CANNOT_RUN:
        for line in closing(args):
            print(line)
    return code
