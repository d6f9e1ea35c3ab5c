"""Captions improved by their own reconstructions, with a guard (`caprecon refine`).

Each round, for every caption still being refined:

1. its reconstruction Î (the scoring's, so from the store) and its **feedback**: the Caption
   Turing Test questions of the bank's guiding half answered right on I but wrong on Î
   (`flipped`), the claims the judge finds unsupported by I (`unsupported`, the hallucination
   metric's), and the differences between I and Î (`differences`: the judge describes each
   image, the LLM lists where the description of Î departs from that of I);
2. a **revision**: the captioner, seeing I, or the LLM, seeing only the caption and the
   feedback, is asked to add what is missing, remove what is unsupported and stay within a
   length budget (the room the generator's text encoder leaves after the prompt template);
   a revision the encoder would cut is rejected unscored;
3. the **guard**: the revision is scored with the selection score (`--select`, as in best-of-N)
   and kept only if it beats the caption it revises by more than `margin`; with `--seeds K`
   (every version rebuilt from the same K noises), only if the 95 % interval of its paired
   per-seed gain lies above `margin`. A caption whose revision is rejected, or that has no
   feedback left, stops.

So a caption's score never falls from one round to the next, and `rounds.csv` (the mean
score of the captions as they stand after each round) cannot decrease.

**Held-out questions.** A reviser told the flipped questions reads their gold answers, so a
score on those same questions measures its copying. With `flipped` feedback, each image's
questions are therefore split (`split_bank`, `holdout` of them held out): the reviser is told
only the guiding half's flips, and every metric of the guard (and the reported gain) reads only
the held-out half. Each version's Caption Turing Test accuracy on both halves is recorded side
by side (`guiding`, `held_out`): a reviser that copies answers gains on the first alone.

Every model call goes through the store (reconstructions and judge answers by the scoring,
descriptions, differences and revisions here), and each finished round appends one row per
caption to `rounds.jsonl`: a killed run, started again with the same settings, reads the
finished rounds back and goes on from the round it reached.

RICO (EMNLP 2025) revises captions from what the reconstruction got wrong, without a guard: here
`differences` (the descriptions of I and Î compared) or `flipped` (the judge's answers on Î
against its answers on I); the guard and the held-out questions are ours.
"""

from __future__ import annotations

import csv
import hashlib
import json
import logging
import math
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from caprecon.apps.refine.holdout import GuidingQuestions, WithBank, unsplittable, split_bank
from caprecon.apps.refine.resume import read_rounds
from caprecon.core.checks import MAX_ROUNDS, check_count, check_number
from caprecon.core.describe import describe_model
from caprecon.core.errors import ConfigError
from caprecon.core.records import append_jsonl, is_number, write_jsonl_atomically
from caprecon.data.images import decode_bytes, read_image
from caprecon.data.loaders import load_samples
from caprecon.data.samples import Sample, SampleError, check_unique_ids
from caprecon.metrics import build_metric
from caprecon.metrics.base import Context
from caprecon.metrics.seeds import seed_interval
from caprecon.models.build import build_model
from caprecon.models.captioner import CaptionRequest, Sampling
from caprecon.models.vlm import VLMRequest
from caprecon.reconstruct.templates import render
from caprecon.run.captioning import Selection, export_parquet, one_noise_per_image
from caprecon.run.config import RunConfig
from caprecon.run.folder import holds_run_folder, open_store, write_manifest
from caprecon.run.roles import Roles
from caprecon.store.index import content_key

log = logging.getLogger(__name__)

FEEDBACK = ("flipped", "unsupported", "differences")

DESCRIBE_PROMPT = ("Describe this image in detail: every object with its colour, shape, size, count and position, "
                   "the setting, and any visible text. Describe only what can be seen. Answer in plain prose.")
COMPARE_PROMPT = (
    "Two descriptions follow. The first describes a photograph. The second describes a picture that was drawn "
    "from a caption of that photograph.\n\nThe photograph: {original}\n\nThe drawing: {reconstruction}\n\n"
    "List each way the drawing differs from the photograph (something missing, wrong or added), one per line, "
    "each line starting with \"- \". If they agree, write \"- none\".")

# a version's Caption Turing Test accuracy on each half of a split bank (`split_bank`)
HALVES = ("guiding", "held_out")

REVISION_MAX_NEW_TOKENS = 512
DESCRIPTION_MAX_NEW_TOKENS = 256


@dataclass
class Refined:
    captions: list[dict[str, Any]]  # one per input caption: original, final, every round
    rounds: list[dict[str, Any]]  # rounds.csv: per round, the mean score and the share improved
    selection: Selection
    manifest: dict[str, Any]
    out: Path | None = None


# ---------------------------------------------------------------------------------------
# prompts


def revision_prompt(caption: str, feedback: Mapping[str, Sequence[Any]], *, sees_image: bool,
                    words: int | None) -> str:
    """What the reviser is asked: the caption, what to add or correct, what to remove, the budget."""
    add = [f'Asked "{f["question"]}", the answer is "{f["answer"]}", but the picture suggested '
           f'"{f["on_reconstruction"]}".' for f in feedback.get("flipped", [])]
    add += list(feedback.get("differences", []))
    remove = [c["claim"] for c in feedback.get("unsupported", [])]
    lines = [("You can see the image. " if sees_image else "") + "Here is a caption of the image:", "",
             caption.strip(), "",
             "A picture was drawn from this caption alone and compared with the image."]
    if add:
        lines += ["", "Add or correct (the picture got these wrong):", *(f"- {a}" for a in add)]
    if remove:
        lines += ["", "Remove (the image does not show these):", *(f"- {r}" for r in remove)]
    budget = f" Use at most {words} words." if words else ""
    lines += ["", "Rewrite the caption: keep what is right, add what is missing, remove what is not in the image."
              f"{budget} Reply with the caption only."]
    return "\n".join(lines)


def parse_differences(reply: str) -> list[str]:
    """The '- ' lines of the LLM's comparison; '- none' means none."""
    items = [line.strip()[2:].strip() for line in reply.splitlines() if line.strip().startswith("- ")]
    return [i for i in items if i and i.lower().rstrip(".") != "none"]


def clean_revision(reply: str) -> str:
    text = reply.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        text = text[1:-1].strip()
    return text


def words_budget(tokens: int | None) -> int | None:
    """Words that fit in `tokens` text-encoder tokens, leaving room for words of several tokens."""
    return None if tokens is None else max(1, tokens * 3 // 4)


# ---------------------------------------------------------------------------------------
# the models asked here, each call through the store


class Asker:
    """Revisions, descriptions and differences, each cached by content key in the run's store."""

    def __init__(self, ctx: Context, *, reviser: Any, sees_image: bool, judge: Any = None, llm: Any = None,
                 seed: int = 0):
        self.ctx, self.reviser, self.sees_image = ctx, reviser, sees_image
        self.judge, self.llm, self.seed = judge, llm, seed
        self.sampling = Sampling(temperature=0.0, max_new_tokens=REVISION_MAX_NEW_TOKENS)  # greedy: reproducible

    def revise(self, asks: Sequence[tuple[str, Any]]) -> list[str]:
        """One revision per (prompt, original LoadedSample)."""
        keys = [content_key("refine-revision", reviser=self.reviser.fingerprint, prompt=prompt,
                            image=item.image_key if self.sees_image else None, seed=self.seed,
                            sampling=self.sampling.to_dict() if self.sees_image else REVISION_MAX_NEW_TOKENS)
                for prompt, item in asks]

        def compute(order: list[int]) -> list[dict[str, str]]:
            if self.sees_image:
                requests = [CaptionRequest(asks[i][1].image, asks[i][0], 1, self.seed, asks[i][1].image_key)
                            for i in order]
                with self.ctx.model_call():
                    replies = [c[0] for c in self.reviser.caption(requests, self.sampling)]
            else:
                with self.ctx.model_call():
                    replies = self.reviser.generate([asks[i][0] for i in order], REVISION_MAX_NEW_TOKENS)
            return [{"text": r} for r in replies]

        return [clean_revision(r["text"]) for r in self.ctx.cached("refine-revision", keys, compute,
                                                                   model=self.reviser)]

    def describe(self, images: Sequence[tuple[str, Any]]) -> list[str]:
        """The judge's description of each (content key, loader of the image)."""
        keys = [content_key("refine-description", judge=self.judge.fingerprint, prompt=DESCRIBE_PROMPT, image=k)
                for k, _ in images]

        def compute(order: list[int]) -> list[dict[str, str]]:
            requests = [VLMRequest(images[i][1](), DESCRIBE_PROMPT, images[i][0]) for i in order]
            with self.ctx.model_call():
                return [{"text": t} for t in self.judge.generate(requests, DESCRIPTION_MAX_NEW_TOKENS)]

        return [r["text"] for r in self.ctx.cached("refine-description", keys, compute, model=self.judge)]

    def differences(self, pairs: Sequence[tuple[str, str]]) -> list[list[str]]:
        """The LLM's list of differences between each (description of I, description of Î)."""
        prompts = [COMPARE_PROMPT.format(original=a.strip(), reconstruction=b.strip()) for a, b in pairs]
        keys = [content_key("refine-differences", llm=self.llm.fingerprint, prompt=p) for p in prompts]

        def compute(order: list[int]) -> list[dict[str, str]]:
            with self.ctx.model_call():
                return [{"text": t} for t in self.llm.generate([prompts[i] for i in order],
                                                                DESCRIPTION_MAX_NEW_TOKENS)]

        return [parse_differences(r["text"]) for r in self.ctx.cached("refine-differences", keys, compute,
                                                                      model=self.llm)]


# ---------------------------------------------------------------------------------------
# the run


def check_settings(rounds: Any, margin: Any, holdout: Any) -> None:
    """The refinement's own numbers, refused in one line as the command's options refuse them
    (`caption` checks them before it captions anything)."""
    check_count("--rounds", rounds, 1, MAX_ROUNDS)
    check_number("--margin", margin, 0)
    if isinstance(holdout, bool) or not isinstance(holdout, (int, float)) or not 0 < holdout < 1:
        raise ConfigError(f"--holdout must be a share strictly between 0 and 1, not {holdout!r}")


@holds_run_folder("out", inputs=("captions",))
def refine(captions: str | Path | Sequence[Sample | Mapping[str, Any]], *, captioner: Any = None,
           captioner_options: dict[str, Any] | None = None, select: Any = "recon", rounds: int = 2,
           margin: float = 0.0, feedback: str | Sequence[str] | None = None, holdout: float = 0.5,
           out: str | Path | None = None, preset: str | None = None, config: str | Path | None = None,
           progress: bool = False,
           image_root: str | Path | None = None, max_image_bytes: int | None = None, **settings: Any) -> Refined:
    """Refine every caption for up to `rounds` rounds (see the module doc).

    The reviser is `captioner` (it sees the image) when given, else the run's `llm` (it sees
    the caption and the feedback only). `feedback` names the sources (flipped, unsupported,
    differences; default: every one the configuration allows). With `flipped`, `holdout` is the
    share of each image's questions held out from the reviser for the guard (`split_bank`).
    `image_root` confines every image to a folder and `max_image_bytes` caps an image file's
    size, as in `score`: a row whose image breaks either is that row's error. `settings` are `RunConfig` fields
    (generator, embedder, judge, llm, qa_bank, template, seed, cache_dir, ...).
    """
    from caprecon.run.score import confining_root, score

    started = time.time()
    selection = Selection.parse(select or "recon")
    check_settings(rounds, margin, holdout)
    cfg = RunConfig.build(preset=preset, file=config, metrics=selection.metrics, **settings)
    one_noise_per_image(cfg, settings, "refinement")
    sources = _feedback_sources(feedback, cfg, selection)
    if captioner is None and cfg.llm is None:
        raise ConfigError("refinement needs a reviser: --captioner (it sees the image) or --llm (it sees the "
                          "caption and the feedback)")
    rows = load_samples(captions, images_root=image_root, max_image_bytes=max_image_bytes)
    check_unique_ids(rows)
    if not rows:
        raise ConfigError("no captions to refine")

    # everything that can be wrong with the configuration fails here, before any model runs
    roles = Roles(cfg)
    # the bank reaches the reviser only through the flipped questions: only then is it split
    split = "flipped" in sources
    judging, guiding = roles, None
    if split:
        unsplittable(rows, roles.qa_bank)
        guiding_bank, held_out_bank = split_bank(roles.qa_bank, holdout)
        judging, guiding = WithBank(roles, held_out_bank), WithBank(roles, guiding_bank)
    names = list(dict.fromkeys([*selection.metrics, *(["turing"] if split else [])]))
    measured = [build_metric(name, judging, cfg) for name in names]
    headlines = {name: m.headline for name, m in zip(names, measured)}
    metrics = [*measured, *([GuidingQuestions(build_metric("turing", guiding, cfg))] if split else [])]
    reviser = build_model("captioner", captioner, captioner_options) if captioner is not None else roles.llm
    out_dir = Path(out) if out else None
    store = open_store(cfg, out_dir)
    ctx = Context(store)
    asker = Asker(ctx, reviser=reviser, sees_image=captioner is not None, seed=cfg.seed,
                  judge=roles.judge if "differences" in sources else None,
                  llm=roles.llm if "differences" in sources else None)
    generator = roles.generator
    room = _token_room(generator, render(cfg.spec.template, ""))
    words = words_budget(room)

    run_key = content_key("refine-run", captions=[[s.id, str(s.image_id), s.caption] for s in rows],
                          select=selection.weights, margin=margin, feedback=sources,
                          holdout=holdout if split else None, reviser=reviser.fingerprint,
                          sees_image=captioner is not None, generator=generator.fingerprint,
                          template=cfg.spec.template, seed=cfg.seed, seed_policy=cfg.seed_policy,
                          seeds=cfg.seeds)
    history = read_rounds(out_dir, run_key) if out_dir else {}
    settings_record = {"key": run_key, "select": selection.weights, "headlines": headlines, "margin": margin,
                       "feedback": sources, "rounds": rounds, "holdout": holdout if split else None,
                       "questions": {"guiding": sum(map(len, guiding.qa_bank.values())),
                                     "held_out": sum(map(len, judging.qa_bank.values()))} if split else None,
                       "reviser": describe_model(reviser),
                       "reviser_sees_image": captioner is not None, "token_room": room, "words": words}
    confined_to = confining_root(rows)  # the report's thumbnails keep to it too
    if out_dir:
        write_manifest(out_dir, {"status": "running", "refine": settings_record, "config": cfg.to_dict(),
                                 "image_root": confined_to})
    sink = (out_dir / "rounds.jsonl").open("a", encoding="utf-8") if out_dir else None
    loaded: dict[str, Any] = {}

    def original(sample: Sample):
        if sample.id not in loaded:
            loaded[sample.id] = read_image(sample)
        return loaded[sample.id]

    def readable(due: list[Sample], round_no: int) -> list[Sample]:
        """The captions of `due` whose image can be read; each other one stops with its error
        (an image that escapes --image-root, or went missing since a resumed run's first round)."""
        kept = []
        for s in due:
            try:
                original(s)
            except SampleError as exc:
                append([{"id": s.id, "round": round_no, "caption": None, "accepted": False,
                         "reason": f"the image cannot be read: {exc}", "error": str(exc)}])
                continue
            kept.append(s)
        return kept

    def score_versions(versions: list[tuple[Sample, int, str]]) -> list[dict[str, Any]]:
        # each version keeps its sample's image_root and max_image_bytes (replace copies every field)
        samples = [replace(s, id=f"{s.id}@{r}", caption=text) for s, r, text in versions]
        scored = score(samples, metrics=metrics, preset=preset, config=config, store=store, progress=progress,
                       **{**settings, "seed": cfg.seed, "seed_policy": cfg.seed_policy}).records
        return [_version(record, selection, headlines, split) for record in scored]

    def append(new_rows: list[dict[str, Any]]) -> None:
        for row in new_rows:
            history.setdefault(row["id"], []).append(row)
        if sink:
            append_jsonl(sink, new_rows, allow_nan=True)

    # an image the bank asks nothing about gives no flipped feedback and no Caption Turing Test score:
    # its caption is kept as it is, said, rather than failed
    unasked = {s.id for s in rows if split and not roles.qa_bank.get(s.image_id)}
    try:
        for s in rows:
            if s.id in unasked and s.id not in history:
                try:  # an image that cannot be read is that row's error first
                    original(s)
                except SampleError as exc:
                    append([{"id": s.id, "round": 0, "caption": s.caption, "accepted": True, "score": None,
                             "error": str(exc)}])
                    continue
                append([{"id": s.id, "round": 0, "caption": s.caption, "accepted": True, "score": None},
                        {"id": s.id, "round": 1, "caption": None, "accepted": False,
                         "reason": f"no feedback: the QA bank has no question for image {s.image_id!r}"}])
        fresh = [s for s in rows if s.id not in history]
        if fresh:
            append([{"id": s.id, "round": 0, "caption": s.caption, "accepted": True, **v}
                    for s, v in zip(fresh, score_versions([(s, 0, s.caption) for s in fresh]))])
        for round_no in range(1, rounds + 1):
            if not any(_due(history[s.id], rounds + 1) for s in rows):
                break  # every caption has converged or stopped: a later round would write nothing
            due = readable([s for s in rows if _due(history[s.id], round_no)], round_no)
            if not due:
                continue
            log.info("refinement round %d: %d caption(s)", round_no, len(due))
            states = {s.id: _current(history[s.id]) for s in due}
            notes = _feedback(due, states, sources, asker, original)
            asks, held = [], []
            for s in due:
                if not any(notes[s.id].values()):
                    append([{"id": s.id, "round": round_no, "caption": None, "accepted": False,
                             "reason": "no feedback: nothing left to fix", "feedback": notes[s.id]}])
                    continue
                asks.append((revision_prompt(states[s.id]["caption"], notes[s.id], sees_image=asker.sees_image,
                                             words=words), original(s)))
                held.append(s)
            revisions = asker.revise(asks) if asks else []
            verdicts, to_score = {}, []
            for s, text in zip(held, revisions):
                over = -_token_room(generator, render(cfg.spec.template, text)) if room is not None else 0
                if not text:
                    verdicts[s.id] = "empty revision"
                elif over > 0:
                    verdicts[s.id] = f"over the generator's text limit by {over} token(s): it would be cut"
                else:
                    to_score.append((s, round_no, text))
            scored = dict(zip([s.id for s, _, _ in to_score], score_versions(to_score))) if to_score else {}
            new_rows = []
            for s, text in zip(held, revisions):
                before = states[s.id]["score"]
                row = {"id": s.id, "round": round_no, "caption": text, "feedback": notes[s.id],
                       "previous_score": before, **scored.get(s.id, {"score": None})}
                row["accepted"], row["reason"] = _verdict(row, states[s.id], margin, verdicts.get(s.id))
                new_rows.append(row)
            append(new_rows)
    finally:
        if sink:
            sink.close()

    results = [_refined(s, history[s.id], selection) for s in rows]
    curve = rounds_table(history, [s.id for s in rows], rounds)
    manifest = {"status": "complete", "refine": settings_record, "config": cfg.to_dict(), "image_root": confined_to,
                "models": roles.describe(), "store": store.describe(), "cache": ctx.stats(),
                "captions": len(rows), "improved": sum(1 for r in results if r["improved"]),
                "seconds": round(time.time() - started, 3),
                "noise": f"one reconstruction seed per image ({cfg.seed_policy}): versions differ only by their text"}
    run = Refined(results, curve, selection, manifest, out_dir)
    if out_dir:
        write_refined(run, out_dir)
        from caprecon.reports.html import write_html_report

        write_html_report(out_dir)
    return run


def _feedback_sources(feedback: str | Sequence[str] | None, cfg: RunConfig, selection: Selection) -> list[str]:
    if feedback is None:
        sources = (["flipped"] if cfg.qa_bank else []) + (["unsupported"] if "halluc" in selection.metrics else [])
        sources += ["differences"] if cfg.judge is not None and cfg.llm is not None else []
        if not sources:
            raise ConfigError("refinement needs feedback: give --qa-bank (the questions that flip), or --judge "
                              "with --llm (the differences between the image and its reconstruction)")
        return sources
    wanted = [part.strip() for part in (feedback.split(",") if isinstance(feedback, str) else feedback)
              if part.strip()]
    unknown = [w for w in wanted if w not in FEEDBACK]
    if unknown or not wanted:
        raise ConfigError(f"--feedback {','.join(wanted) or repr(feedback)}: choose from {', '.join(FEEDBACK)}")
    if "unsupported" in wanted and "halluc" not in selection.metrics:
        raise ConfigError("--feedback unsupported needs halluc in --select (e.g. --select recon=0.7,halluc=0.3): "
                          "the unsupported claims come from the hallucination metric, and a revision that drops "
                          "them must also be judged by it")
    if "flipped" in wanted and not cfg.qa_bank:
        raise ConfigError("--feedback flipped needs a QA bank: set --qa-bank FILE")
    if "differences" in wanted and (cfg.judge is None or cfg.llm is None):
        raise ConfigError("--feedback differences needs --judge (it describes both images) and --llm (it "
                          "compares the descriptions)")
    return list(dict.fromkeys(wanted))


def _token_room(generator: Any, prompt: str) -> int | None:
    """What the generator's most limiting text encoder leaves after `prompt`; None: no limit known."""
    room = getattr(generator, "token_room", None)
    return room(prompt) if callable(room) else None


def _version(record: Mapping[str, Any], selection: Selection, headlines: Mapping[str, str],
             split: bool) -> dict[str, Any]:
    """What a round keeps of a scored version: its score, the metrics' values, its
    reconstruction, the feedback fields of the next round and, with a split bank, its
    Caption Turing Test accuracy on the guiding and on the held-out questions."""
    kept = {"score": selection.value(record, headlines),
            "scores": {name: record.get(field) for name, field in headlines.items()}}
    if split:
        kept.update(guiding=record.get("turing_guiding"), held_out=record.get("turing"))
    per_seed = _seed_scores(record, selection, headlines)
    if per_seed:
        kept["score_seeds"] = per_seed
    for key in ("reconstruction", "tokens_cut", "error", "turing_flipped", "turing_guiding_flipped",
                "halluc_unsupported"):
        if record.get(key) is not None:
            kept[key] = record[key]
    if kept.get("error"):
        # the scoring names a failed row by its place among the versions scored together and by the
        # version's id, which mean nothing to the user: the caption's id goes with the error here
        kept["error"] = re.sub(rf"(^|; )row \d+ \(id {re.escape(str(record.get('id')))}\): ", r"\1", kept["error"])
    return kept


def _seed_scores(record: Mapping[str, Any], selection: Selection, headlines: Mapping[str, str]) -> list[float] | None:
    """The selection score under each of the run's seeds (`--seeds K`), from the metrics'
    per-seed values (a metric that rebuilds no image counts the same under every seed);
    None without seeds or when a value is missing."""
    if record.get("error"):
        return None
    lists = {name: record.get(f"{field}_seeds") for name, field in headlines.items() if name in selection.weights}
    counts = {len(v) for v in lists.values() if isinstance(v, list)}
    if len(counts) != 1 or min(counts) < 2:
        return None
    out = []
    for k in range(counts.pop()):
        values = [lists[name][k] if isinstance(lists[name], list) else record.get(headlines[name])
                  for name in selection.weights]
        if not all(is_number(v) for v in values):
            return None
        out.append(math.fsum(w * v for w, v in zip(selection.weights.values(), values)))
    return out


def _verdict(row: Mapping[str, Any], current: Mapping[str, Any], margin: float,
             refused: str | None) -> tuple[bool, str]:
    """Kept only if the revision beats the caption it revises by more than `margin`; with K
    seeds (the same K noises for both), only if the 95 % interval of the paired per-seed gain
    lies above `margin`, so a gain the noise alone could give is not taken."""
    if refused:
        return False, refused
    if row.get("error"):
        return False, f"the revision could not be scored: {row['error']}"
    if row.get("tokens_cut"):
        return False, f"the generator cut {row['tokens_cut']} token(s) of the revision"
    if row["score"] is None:
        return False, "the revision has no score"
    before, old_seeds, new_seeds = current["score"], current.get("score_seeds"), row.get("score_seeds")
    if old_seeds and new_seeds and len(old_seeds) == len(new_seeds):
        gain, _, (low, high) = seed_interval([b - a for a, b in zip(old_seeds, new_seeds)])
        told = f"gain {gain:+.4f}, 95 % interval over {len(new_seeds)} seeds [{low:.4f}, {high:.4f}]"
        if low > margin:
            return True, f"score {before:.4f} -> {row['score']:.4f}; {told}"
        return False, f"no gain beyond the seed noise: {told}" + (f", margin {margin:g}" if margin else "")
    if row["score"] > before + margin:
        return True, f"score {before:.4f} -> {row['score']:.4f}"
    return False, f"no gain: {row['score']:.4f} against {before:.4f}" + (f" + margin {margin:g}" if margin else "")


def _current(rows: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """The caption as it stands: the last accepted version."""
    return [r for r in rows if r["accepted"]][-1]


def _due(rows: Sequence[Mapping[str, Any]], round_no: int) -> bool:
    """Whether a caption is refined in this round: not stopped, round not done, first version scored."""
    last = rows[-1]
    return last["round"] < round_no and last["accepted"] and last.get("score") is not None


def _feedback(due: Sequence[Sample], states: Mapping[str, Mapping[str, Any]], sources: Sequence[str],
              asker: Asker, original) -> dict[str, dict[str, list]]:
    notes: dict[str, dict[str, list]] = {s.id: {} for s in due}
    for s in due:
        if "flipped" in sources:  # the guiding half's: a held-out question is never told
            notes[s.id]["flipped"] = list(states[s.id].get("turing_guiding_flipped") or [])
        if "unsupported" in sources:
            notes[s.id]["unsupported"] = list(states[s.id].get("halluc_unsupported") or [])
    if "differences" in sources:
        with_recon = [s for s in due if states[s.id].get("reconstruction")]
        for s in due:
            notes[s.id]["differences"] = []
        if with_recon:
            originals = asker.describe([(original(s).image_key, lambda s=s: original(s).image) for s in with_recon])
            recons = asker.describe([_recon_image(states[s.id]["reconstruction"]) for s in with_recon])
            for s, listed in zip(with_recon, asker.differences(list(zip(originals, recons)))):
                notes[s.id]["differences"] = listed
    return notes


def _recon_image(path: str) -> tuple[str, Any]:
    data = Path(path).read_bytes()
    return hashlib.sha256(data).hexdigest(), lambda: decode_bytes(data, path)


# ---------------------------------------------------------------------------------------
# resuming and the outputs


def rounds_table(history: Mapping[str, Sequence[Mapping[str, Any]]], ids: Sequence[str],
                 rounds: int) -> list[dict[str, Any]]:
    """Per round 0..R (R: the last round a caption reached, at most `rounds`): the mean score of the captions as they stand after it (those whose
    original has a score), the share of them above their original, and the revisions asked
    and accepted in it; with a split bank, also their mean Caption Turing Test accuracy on
    the guiding and on the held-out questions. The standing caption changes only by an
    accepted, higher revision, so the mean score cannot fall (the guiding one can)."""
    scored = [i for i in ids if history[i] and history[i][0].get("score") is not None]
    firsts = [history[i][0]["score"] for i in scored]
    halves = [h for h in HALVES if any(h in history[i][0] for i in scored)]
    reached = max((r["round"] for i in ids for r in history[i]), default=0)
    table = []
    for round_no in range(min(rounds, reached) + 1):
        versions = [_current([r for r in history[i] if r["round"] <= round_no]) for i in scored]
        standing = [v["score"] for v in versions]
        asked = [r for i in ids for r in history[i] if r["round"] == round_no and round_no and r["caption"]]
        table.append({"round": round_no, "captions": len(scored),
                      "mean_score": sum(standing) / len(standing) if standing else None,
                      **{half: _mean([v.get(half) for v in versions]) for half in halves},
                      "improved": (sum(1 for a, b in zip(standing, firsts) if a > b) / len(scored)) if scored else None,
                      "revised": len(asked), "accepted": sum(1 for r in asked if r["accepted"])})
    return table


def _mean(values: Sequence[Any]) -> float | None:
    numbers = [v for v in values if is_number(v)]
    return math.fsum(numbers) / len(numbers) if numbers else None


def _refined(sample: Sample, rows: Sequence[Mapping[str, Any]], selection: Selection) -> dict[str, Any]:
    first, final = rows[0], _current(rows)
    stop = next((r["reason"] for r in rows[1:] if not r["accepted"]), None)
    halves = [h for h in HALVES if h in first]
    return {
        "id": sample.id, "image": str(sample.image) if isinstance(sample.image, (str, Path)) else None,
        "image_id": sample.image_id, "original": sample.caption, "caption": final["caption"],
        "score_before": first.get("score"), "score": final.get("score"),
        **{f"{half}_before": first.get(half) for half in halves}, **{half: final.get(half) for half in halves},
        "improved": final is not first, "accepted_rounds": [r["round"] for r in rows[1:] if r["accepted"]],
        "stopped": stop, "scores_before": first.get("scores"), "scores": final.get("scores"),
        "reconstruction_before": first.get("reconstruction"), "reconstruction": final.get("reconstruction"),
        # with a split bank the held-out questions, the fixes that count; the guiding ones were told
        "fixed": _fixed(first, final, "turing_flipped"),
        **({"fixed_guiding": _fixed(first, final, "turing_guiding_flipped")} if halves else {}),
        # the first version's scoring error, else the error of an image that could not be read later
        "error": first.get("error") or next((r["error"] for r in rows[1:] if r["caption"] is None and r.get("error")),
                                            None),
        "rounds": [{k: r.get(k) for k in ("round", "caption", "score", *halves, "accepted", "reason", "feedback")}
                   for r in rows],
        "selection": selection.describe(),
    }


def _fixed(first: Mapping[str, Any], final: Mapping[str, Any], field: str) -> list[dict[str, Any]]:
    """The questions of `field` that flip on the first version and no longer on the final one."""
    after = {f["question"] for f in final.get(field) or []}
    return [f for f in first.get(field) or [] if f["question"] not in after]


def write_refined(run: Refined, out_dir: str | Path) -> dict[str, Path]:
    """refined.jsonl (+ .parquet with pyarrow), rounds.csv and manifest.json; rounds.jsonl is
    written as the rounds finish."""
    out_dir = Path(out_dir)
    paths = {"refined": out_dir / "refined.jsonl", "rounds": out_dir / "rounds.csv"}
    write_jsonl_atomically(paths["refined"], run.captions, allow_nan=True)
    # parquet wants one type per column: the nested rounds and feedback travel as JSON text there
    flat = [{**r, "rounds": json.dumps(r["rounds"], ensure_ascii=False), "fixed": json.dumps(r["fixed"]),
             **({"fixed_guiding": json.dumps(r["fixed_guiding"])} if "fixed_guiding" in r else {}),
             "scores_before": json.dumps(r["scores_before"]), "scores": json.dumps(r["scores"])}
            for r in run.captions]
    parquet = export_parquet(flat, out_dir / "refined.parquet")
    if parquet:
        paths["parquet"] = parquet
    with paths["rounds"].open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(run.rounds[0]))
        writer.writeheader()
        writer.writerows(run.rounds)
    paths["manifest"] = write_manifest(out_dir, run.manifest)
    return paths

