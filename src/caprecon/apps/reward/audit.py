"""`caprecon reward-audit`: how a reward responds to padding and repetition before training with it
(`reward_audit`, `audit`, what they find: `Audit`). The reward itself is `caprecon.apps.reward`'s."""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from tqdm.auto import tqdm

from caprecon.apps.reward import Reward
from caprecon.apps.reward.guards import Guards, repetition, words
from caprecon.core.digests import keep_memo_in, memo_scoped
from caprecon.core.errors import ConfigError
from caprecon.data.images import read_image
from caprecon.data.samples import Sample, SampleError
from caprecon.metrics import Metric

log = logging.getLogger(__name__)


# what `audit` appends to pad a caption: words that describe nothing in particular, as a policy
# learning that length pays would add them
PADDING = " The image shows many details, colors, textures and objects arranged in the scene."


@dataclass
class Audit:
    """What `reward_audit` finds (the figures `reward-audit --json` writes): the number of captions,
    the reward's parts, and for the metrics alone (`metrics`) and the whole reward, guards included
    (`reward`), each a dict of `scored` (captions the reward scored), `mean`, `spearman_length`,
    `spearman_repetition`, `rise_padded` and `rise_repeated` (None where there is too little to say)."""

    captions: int
    parts: list[str]
    metrics: dict[str, Any]
    reward: dict[str, Any]

    def figures(self) -> dict[str, Any]:
        """The figures as one JSON-ready dict, as `reward-audit --json` writes them."""
        return asdict(self)


#: captions an audit needs: the Spearman correlations are undefined on fewer than 3
MIN_AUDIT_CAPTIONS = 3


@memo_scoped
def reward_audit(samples: str | Path | Sequence[Sample | dict], metrics: Sequence[str | Metric] | str | None = None,
                 weights: Sequence[float] | Mapping[str, float] | None = None, *, guards: Guards | None = Guards(),
                 preset: str | None = None, config: str | Path | None = None, images_root: str | Path | None = None,
                 max_image_bytes: int | None = None, progress: bool = True, **settings: Any) -> Audit:
    """`caprecon reward-audit`: how the `Reward` built from `metrics`, `weights`, `guards` and the run
    settings (those of `caprecon.score`) responds to padding and repetition on the captions of
    `samples` (a file as `score` reads it, or rows), before training with it (see `audit`).

    An input with nothing to audit is one `ConfigError` before any model loads: no rows, fewer than
    `MIN_AUDIT_CAPTIONS` captions whose image can be read (it names the first that cannot). So is an
    audit the reward scored fewer than that many captions of. `progress`: a bar per stage (the
    reward's own bars stay off: the stages' bars say the same).

        found = caprecon.reward_audit("captions.jsonl", ["recon"], preset="fast",
                                      guards=caprecon.Guards(length_target=40))
        print(found.metrics["rise_padded"], found.reward["rise_padded"])  # guarded, padding should not pay
    """
    from caprecon.data.loaders import load_samples

    reward = Reward(metrics, weights, preset=preset, config=config, guards=guards, progress=False, **settings)
    keep_memo_in(reward.cfg.memo_folder)  # the photos read here go into the reward's memo, for this call alone
    rows = load_samples(samples, images_root=images_root, max_image_bytes=max_image_bytes)
    if not rows:
        raise ConfigError("nothing to audit: the input holds no rows")
    readable, unreadable = [], []
    for row in tqdm(rows, desc="reward-audit: reading images", unit="image", disable=not progress):
        try:
            read_image(row)
            readable.append(row)
        except SampleError as exc:
            unreadable.append(f"row {row.id}: {exc}")
    if len(readable) < MIN_AUDIT_CAPTIONS:
        why = f"; {len(unreadable)} image(s) cannot be read, the first: {unreadable[0]}" if unreadable else ""
        raise ConfigError(f"nothing to audit: {len(readable)} of {len(rows)} caption(s) have an image that can be "
                          f"read, and an audit needs at least {MIN_AUDIT_CAPTIONS} (its Spearman correlations "
                          f"are undefined on fewer){why}")
    if unreadable:
        log.warning("reward-audit: %d caption(s) left out, their image cannot be read; the first: %s",
                    len(unreadable), unreadable[0])
    found = audit(reward, [r.image for r in readable], [r.caption for r in readable], progress=progress)
    if found.metrics["scored"] < MIN_AUDIT_CAPTIONS:
        raise ConfigError(f"nothing to audit: the reward scored {found.metrics['scored']} of {found.captions} "
                          f"caption(s) (its metrics failed on the others; the log says why), and an audit needs "
                          f"at least {MIN_AUDIT_CAPTIONS}")
    return found


#: captions a progress step of `audit` scores at once (the reward deduplicates within a call, the store across)
AUDIT_BATCH = 64


def audit(reward: Reward, images: Sequence[Any], captions: Sequence[str], *, progress: bool = False) -> Audit:
    """What a user checks before training with `reward`: over the captions as given, the Spearman
    correlation of the reward with their length (words) and repetition share; and the mean change of
    the reward when each caption is padded (`PADDING` appended) or repeats itself (said twice). Each
    figure twice: from the metrics alone (`metrics`) and from the whole reward, guards included
    (`reward`). A gamed reward rises with padding or repetition; guarded, it should fall. The three
    stages (as given, padded, repeated) are scored in steps of `AUDIT_BATCH` captions, with a bar
    each when `progress`; a caption's reward does not depend on the step it is scored in."""
    from caprecon.stats.correlation import spearman

    n = len(captions)
    parts: dict[str, list[float | None]] = {}
    filled = 0
    for stage, variants in (("as given", list(captions)), ("padded", [c + PADDING for c in captions]),
                            ("repeated", [f"{c} {c}" for c in captions])):
        for start in tqdm(range(0, n, AUDIT_BATCH), desc=f"reward-audit: scoring captions {stage}", unit="batch",
                          disable=not progress):
            size = len(variants[start : start + AUDIT_BATCH])
            step = reward.parts(images[start : start + AUDIT_BATCH], variants[start : start + AUDIT_BATCH])
            for name in step:  # a part only some steps have (`empty`: a step with an empty caption) is 0 elsewhere
                parts.setdefault(name, [0.0] * filled)
            for name, values in parts.items():
                values.extend(step.get(name, [0.0] * size))
            filled += size
    guards = {"length", "repetition", "hallucination"}
    rows = list(zip(*parts.values()))
    names = list(parts)

    def total(row: tuple, guarded: bool) -> float | None:
        values = [v for name, v in zip(names, row) if guarded or name not in guards]
        return None if any(v is None for v in values) else math.fsum(values)

    out: dict[str, Any] = {}
    for label, guarded in (("metrics", False), ("reward", True)):
        values = [total(r, guarded) for r in rows]
        base, padded, repeated = values[:n], values[n : 2 * n], values[2 * n :]
        scored = [i for i in range(n) if base[i] is not None]
        lengths = [len(words(captions[i])) for i in scored]
        shares = [repetition(captions[i], reward.guards.repetition_n) for i in scored]
        ys = [base[i] for i in scored]

        def correlation(xs: list[float]) -> float | None:
            return spearman(xs, ys) if len(scored) > 2 and len(set(xs)) > 1 and len(set(ys)) > 1 else None

        def rise(changed: list[float | None]) -> float | None:
            deltas = [changed[i] - base[i] for i in scored if changed[i] is not None]
            return math.fsum(deltas) / len(deltas) if deltas else None

        out[label] = {"scored": len(scored), "mean": math.fsum(ys) / len(ys) if ys else None,
                      "spearman_length": correlation(lengths), "spearman_repetition": correlation(shares),
                      "rise_padded": rise(padded), "rise_repeated": rise(repeated)}
    return Audit(captions=n, parts=names, **out)
