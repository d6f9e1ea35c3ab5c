"""One refinement as a run object with steps (`RefineRun`): built from checked settings
(`start`: every configuration error raised before any model runs, the bank split when the
reviser is told flipped questions), then `resume` (the finished rounds read back), `originals`
(round 0: each caption as given, scored), `round` (one round of feedback, revisions and the
guard), `close`, `result` and `write`. `refine` (the package's front) runs them in that order."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any, Mapping, Sequence

from caprecon.apps.refine.feedback import FEEDBACK, Asker, feedback_notes, revision_prompt, words_budget
from caprecon.apps.refine.guard import current_version, scored_version, verdict
from caprecon.apps.refine.holdout import GuidingQuestions, WithBank, split_bank, unsplittable
from caprecon.apps.refine.outputs import Refined, refined_row, rounds_table, write_refined
from caprecon.apps.refine.resume import read_rounds
from caprecon.core.checks import MAX_ROUNDS, check_count, check_number
from caprecon.core.describe import describe_model
from caprecon.core.digests import keep_memo_in
from caprecon.core.errors import ConfigError
from caprecon.core.records import append_jsonl
from caprecon.data.images import LoadedSample, read_image
from caprecon.data.loaders import load_samples
from caprecon.data.samples import Sample, SampleError, check_unique_ids, confining_root
from caprecon.metrics import build_metric
from caprecon.metrics.base import Metric
from caprecon.models.build import build_model
from caprecon.reconstruct.templates import render
from caprecon.run.captioning import Selection, one_noise_per_image
from caprecon.run.config import RunConfig
from caprecon.run.frame import RunFrame
from caprecon.run.roles import Roles
from caprecon.store.index import content_key

log = logging.getLogger("caprecon.apps.refine")


def check_settings(rounds: Any, margin: Any, holdout: Any) -> None:
    """The refinement's own numbers, refused in one line as the command's options refuse them
    (`caption` checks them before it captions anything)."""
    check_count("--rounds", rounds, 1, MAX_ROUNDS)
    check_number("--margin", margin, 0)
    if isinstance(holdout, bool) or not isinstance(holdout, (int, float)) or not 0 < holdout < 1:
        raise ConfigError(f"--holdout must be a share strictly between 0 and 1, not {holdout!r}")


def feedback_sources(feedback: str | Sequence[str] | None, cfg: RunConfig, selection: Selection) -> list[str]:
    """The feedback sources asked for, each checked against what the configuration has; none
    asked: every one it allows."""
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


@dataclass
class RefineRun:
    """A refinement: its checked settings and resolved models (from `start`), and its state as the
    steps run: every caption's rows by round (`history`), the run's settings as the manifest records
    them, the images read so far."""

    frame: RunFrame  # the configuration, the store and context, the output folder, the clock
    rows: list[Sample]
    selection: Selection
    rounds: int
    margin: float
    holdout: float
    sources: list[str]
    roles: Roles
    judging: Any  # the models the guard's metrics ask: with a split bank, only its held-out half
    guiding: WithBank | None  # with a split bank, the run's models over its guiding half
    headlines: dict[str, str]  # the field each selection metric writes its value to
    metrics: list[Metric]
    reviser: Any
    asker: Asker
    room: int | None  # the generator's text tokens left after the template; None: no limit known
    words: int | None
    scoring: dict[str, Any]  # what each version's scoring is called with beside its samples and metrics
    history: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # per caption, its rows by round
    settings_record: dict[str, Any] = field(default_factory=dict)
    image_root: str | None = None
    sink: IO[str] | None = None  # rounds.jsonl, appended to as the rounds finish
    loaded: dict[str, LoadedSample] = field(default_factory=dict)

    @property
    def split(self) -> bool:
        """Whether the bank is split: it reaches the reviser only through the flipped questions."""
        return self.guiding is not None

    @classmethod
    def start(cls, captions: Any, *, captioner: Any, captioner_options: dict[str, Any] | None, select: Any,
              rounds: int, margin: float, feedback: str | Sequence[str] | None, holdout: float,
              out: str | Path | None, preset: str | None, config: str | Path | None, progress: bool,
              image_root: str | Path | None, max_image_bytes: int | None, settings: dict[str, Any]) -> RefineRun:
        """The run, its settings checked and its captions read: everything that can be wrong with
        the configuration fails here, before any model runs."""
        started = time.time()
        selection = Selection.parse(select or "recon")
        check_settings(rounds, margin, holdout)
        cfg = RunConfig.build(preset=preset, file=config, metrics=selection.metrics, **settings)
        keep_memo_in(cfg.memo_folder)  # this run's memo of file digests, for its caller's call alone (`refine`)
        one_noise_per_image(cfg, settings, "refinement")
        sources = feedback_sources(feedback, cfg, selection)
        if captioner is None and cfg.llm is None:
            raise ConfigError("refinement needs a reviser: --captioner (it sees the image) or --llm (it sees the "
                              "caption and the feedback)")
        rows = load_samples(captions, images_root=image_root, max_image_bytes=max_image_bytes)
        check_unique_ids(rows)
        if not rows:
            raise ConfigError("no captions to refine")

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
        frame = RunFrame.open(cfg, out, started=started)
        asker = Asker(frame.ctx, reviser=reviser, sees_image=captioner is not None, seed=cfg.seed,
                      judge=roles.judge if "differences" in sources else None,
                      llm=roles.llm if "differences" in sources else None)
        room = _token_room(roles.generator, render(cfg.spec.template, ""))
        scoring = {"preset": preset, "config": config, "progress": progress,
                   "settings": {**settings, "seed": cfg.seed, "seed_policy": cfg.seed_policy}}
        return cls(frame, rows, selection, rounds, margin, holdout, sources, roles, judging, guiding, headlines,
                   metrics, reviser, asker, room, words_budget(room), scoring)

    # -----------------------------------------------------------------------------------
    # the steps

    def resume(self) -> None:
        """The run's key and settings; the finished rounds an earlier run of the same settings left in
        the folder read back (another run's refused); the manifest marked running; rounds.jsonl opened."""
        cfg, out_dir = self.frame.cfg, self.frame.out_dir
        run_key = content_key("refine-run", captions=[[s.id, str(s.image_id), s.caption] for s in self.rows],
                              select=self.selection.weights, margin=self.margin, feedback=self.sources,
                              holdout=self.holdout if self.split else None, reviser=self.reviser.fingerprint,
                              sees_image=self.asker.sees_image, generator=self.roles.generator.fingerprint,
                              template=cfg.spec.template, seed=cfg.seed, seed_policy=cfg.seed_policy,
                              seeds=cfg.seeds)
        self.history = read_rounds(out_dir, run_key) if out_dir else {}
        self.settings_record = {
            "key": run_key, "select": self.selection.weights, "headlines": self.headlines, "margin": self.margin,
            "feedback": self.sources, "rounds": self.rounds, "holdout": self.holdout if self.split else None,
            "questions": {"guiding": sum(map(len, self.guiding.qa_bank.values())),
                          "held_out": sum(map(len, self.judging.qa_bank.values()))} if self.split else None,
            "reviser": describe_model(self.reviser),
            "reviser_sees_image": self.asker.sees_image, "token_room": self.room, "words": self.words}
        self.image_root = confining_root(self.rows)  # the report's thumbnails keep to it too
        self.frame.write_manifest({"status": "running", "refine": self.settings_record, "config": cfg.to_dict(),
                                   "image_root": self.image_root})
        self.sink = (out_dir / "rounds.jsonl").open("a", encoding="utf-8") if out_dir else None

    def originals(self) -> None:
        """Round 0: every caption not yet in the history, as given and scored. An image the bank asks
        nothing about gives no flipped feedback and no Caption Turing Test score: its caption is kept
        as it is, said, rather than failed."""
        for s in self.rows:
            if self.split and not self.roles.qa_bank.get(s.image_id) and s.id not in self.history:
                try:  # an image that cannot be read is that row's error first
                    self.original(s)
                except SampleError as exc:
                    self.append([{"id": s.id, "round": 0, "caption": s.caption, "accepted": True, "score": None,
                                  "error": str(exc)}])
                    continue
                self.append([{"id": s.id, "round": 0, "caption": s.caption, "accepted": True, "score": None},
                             {"id": s.id, "round": 1, "caption": None, "accepted": False,
                              "reason": f"no feedback: the QA bank has no question for image {s.image_id!r}"}])
        fresh = [s for s in self.rows if s.id not in self.history]
        if fresh:
            self.append([{"id": s.id, "round": 0, "caption": s.caption, "accepted": True, **v}
                         for s, v in zip(fresh, self.score_versions([(s, 0, s.caption) for s in fresh]))])

    def converged(self) -> bool:
        """Whether every caption has converged or stopped: a later round would write nothing."""
        return not any(_due(self.history[s.id], self.rounds + 1) for s in self.rows)

    def round(self, round_no: int) -> None:
        """One round for the captions due in it: their feedback, a revision each, the guard's verdict."""
        due = self.readable([s for s in self.rows if _due(self.history[s.id], round_no)], round_no)
        if not due:
            return
        log.info("refinement round %d: %d caption(s)", round_no, len(due))
        states = {s.id: current_version(self.history[s.id]) for s in due}
        notes = feedback_notes(due, states, self.sources, self.asker, self.original)
        asks, held = [], []
        for s in due:
            if not any(notes[s.id].values()):
                self.append([{"id": s.id, "round": round_no, "caption": None, "accepted": False,
                              "reason": "no feedback: nothing left to fix", "feedback": notes[s.id]}])
                continue
            asks.append((revision_prompt(states[s.id]["caption"], notes[s.id], sees_image=self.asker.sees_image,
                                         words=self.words), self.original(s)))
            held.append(s)
        revisions = self.asker.revise(asks) if asks else []
        verdicts, to_score = {}, []
        for s, text in zip(held, revisions):
            over = (-_token_room(self.roles.generator, render(self.frame.cfg.spec.template, text))
                    if self.room is not None else 0)
            if not text:
                verdicts[s.id] = "empty revision"
            elif over > 0:
                verdicts[s.id] = f"over the generator's text limit by {over} token(s): it would be cut"
            else:
                to_score.append((s, round_no, text))
        scored = dict(zip([s.id for s, _, _ in to_score], self.score_versions(to_score))) if to_score else {}
        new_rows = []
        for s, text in zip(held, revisions):
            before = states[s.id]["score"]
            row = {"id": s.id, "round": round_no, "caption": text, "feedback": notes[s.id],
                   "previous_score": before, **scored.get(s.id, {"score": None})}
            row["accepted"], row["reason"] = verdict(row, states[s.id], self.margin, verdicts.get(s.id))
            new_rows.append(row)
        self.append(new_rows)

    def close(self) -> None:
        """rounds.jsonl closed, whether the rounds finished or stopped."""
        if self.sink:
            self.sink.close()

    def result(self) -> Refined:
        """Per caption its original, final and every round; per round the mean score; the manifest."""
        results = [refined_row(s, self.history[s.id], self.selection) for s in self.rows]
        curve = rounds_table(self.history, [s.id for s in self.rows], self.rounds)
        cfg = self.frame.cfg
        manifest = {"status": "complete", "refine": self.settings_record, "config": cfg.to_dict(),
                    "image_root": self.image_root, "models": self.roles.describe(),
                    "store": self.frame.store.describe(), "cache": self.frame.ctx.stats(),
                    "captions": len(self.rows), "improved": sum(1 for r in results if r["improved"]),
                    "seconds": self.frame.seconds(),
                    "noise": f"one reconstruction seed per image ({cfg.seed_policy}): versions differ only by "
                             "their text"}
        return Refined(results, curve, self.selection, manifest, self.frame.out_dir)

    def write(self, run: Refined) -> None:
        """The output files and the report, into the run folder."""
        from caprecon.reports.html import write_html_report

        write_refined(run, self.frame.out_dir)
        write_html_report(self.frame.out_dir)

    # -----------------------------------------------------------------------------------
    # what the steps share

    def original(self, sample: Sample) -> LoadedSample:
        """The sample's image, read once."""
        if sample.id not in self.loaded:
            self.loaded[sample.id] = read_image(sample)
        return self.loaded[sample.id]

    def readable(self, due: list[Sample], round_no: int) -> list[Sample]:
        """The captions of `due` whose image can be read; each other one stops with its error
        (an image that escapes --image-root, or went missing since a resumed run's first round)."""
        kept = []
        for s in due:
            try:
                self.original(s)
            except SampleError as exc:
                self.append([{"id": s.id, "round": round_no, "caption": None, "accepted": False,
                              "reason": f"the image cannot be read: {exc}", "error": str(exc)}])
                continue
            kept.append(s)
        return kept

    def score_versions(self, versions: list[tuple[Sample, int, str]]) -> list[dict[str, Any]]:
        """Each (sample, round, caption) scored by the run's metrics, in the run's store."""
        from caprecon.run.score import score

        # each version keeps its sample's image_root and max_image_bytes (replace copies every field)
        samples = [replace(s, id=f"{s.id}@{r}", caption=text) for s, r, text in versions]
        scored = score(samples, metrics=self.metrics, preset=self.scoring["preset"], config=self.scoring["config"],
                       store=self.frame.store, progress=self.scoring["progress"], **self.scoring["settings"]).records
        return [scored_version(record, self.selection, self.headlines, self.split) for record in scored]

    def append(self, new_rows: list[dict[str, Any]]) -> None:
        """Rows added to the history, and to rounds.jsonl as they finish."""
        for row in new_rows:
            self.history.setdefault(row["id"], []).append(row)
        if self.sink:
            append_jsonl(self.sink, new_rows, allow_nan=True)


def _token_room(generator: Any, prompt: str) -> int | None:
    """What the generator's most limiting text encoder leaves after `prompt`; None: no limit known."""
    room = getattr(generator, "token_room", None)
    return room(prompt) if callable(room) else None


def _due(rows: Sequence[Mapping[str, Any]], round_no: int) -> bool:
    """Whether a caption is refined in this round: not stopped, round not done, first version scored."""
    last = rows[-1]
    return last["round"] < round_no and last["accepted"] and last.get("score") is not None
