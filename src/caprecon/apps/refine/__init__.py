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

The parts: the run and its steps (`run`: `RefineRun`), the feedback and the models asked for it
(`feedback`), the guard (`guard`), the held-out questions (`holdout`), resuming (`resume`), what is
returned and written (`outputs`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from caprecon.apps.refine.feedback import FEEDBACK, revision_prompt
from caprecon.apps.refine.holdout import split_bank
from caprecon.apps.refine.outputs import HALVES, Refined, rounds_table, write_refined
from caprecon.apps.refine.run import RefineRun, check_settings
from caprecon.core.digests import memo_scoped
from caprecon.data.samples import Sample
from caprecon.run.folder import holds_run_folder

__all__ = ["FEEDBACK", "HALVES", "RefineRun", "Refined", "check_settings", "refine", "revision_prompt",
           "rounds_table", "split_bank", "write_refined"]


@holds_run_folder("out", inputs=("captions",))
@memo_scoped
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
    run = RefineRun.start(captions, captioner=captioner, captioner_options=captioner_options, select=select,
                          rounds=rounds, margin=margin, feedback=feedback, holdout=holdout, out=out, preset=preset,
                          config=config, progress=progress, image_root=image_root, max_image_bytes=max_image_bytes,
                          settings=settings)
    run.resume()
    try:
        run.originals()
        for round_no in range(1, rounds + 1):
            if run.converged():
                break
            run.round(round_no)
    finally:
        run.close()
    refined = run.result()
    if run.frame.out_dir:
        run.write(refined)
    return refined
