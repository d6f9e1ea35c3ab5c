"""CapArena's human battles (Cheng et al. 2025, `njucckevin/CapArena`): `caparena_annots_eval.json`.

A list of `{"img", "source1", "source2", "caption1", "caption2", "ref", "winner", "cluster",
"in-400"}`: two models' detailed captions of one DOCCI image (`img` is the DOCCI file name),
DOCCI's human description as `ref`, the annotators' `winner` (`source1`'s or `source2`'s model
name, `equal`, `skip` or `bad`) and the difficulty `cluster` ("level 1" .. "level 4").

As CapArena's `cal_agreement` reads the label, `equal`, `skip` and `bad` are ties; the raw
label is kept in `PairJudgment.verdict` (the human Elo leaves `skip` and `bad` out, as
`compute_elo` accepts only a source or a tie). Any other `winner` is an error naming the battle.
A battle of a model against itself, and a repeat of an earlier battle (the same image, models
and captions, in either order), are dropped, each named in `Judgments.notes`.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from caprecon.data.judgments import PAIRS, JudgmentFormatError, Judgments, PairJudgment
from caprecon.data.loaders.common import caption_text, norm_text

log = logging.getLogger(__name__)

CAPARENA_FILE = "caparena_annots_eval.json"
NO_WINNER = ("equal", "skip", "bad")  # the labels of a battle neither caption won
HUMAN_SOURCE = "human"  # DOCCI's own description entered as a model; CapArena leaves its battles out


def load_caparena(path: str | Path) -> Judgments:
    path = Path(path)
    file = path / CAPARENA_FILE if path.is_dir() else path
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise JudgmentFormatError(f"benchmark file not found: {file}") from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise JudgmentFormatError(f"{file}: not readable as CapArena's JSON ({exc})") from None
    if not isinstance(data, list):
        raise JudgmentFormatError(f"{file}: CapArena's battle file is a list of battles")
    items: list[PairJudgment] = []
    needed = ("img", "source1", "source2", "caption1", "caption2", "winner", "cluster")
    seen: dict[tuple, int] = {}
    against_itself: list[int] = []
    repeats: list[tuple[int, int]] = []
    for k, battle in enumerate(data):
        where = f"{file} [{k}]"
        if not isinstance(battle, dict) or (missing := [f for f in needed if battle.get(f) is None]):
            raise JudgmentFormatError(f"{where}: a CapArena battle needs {', '.join(needed)}; missing "
                                      f"{', '.join(missing) if isinstance(battle, dict) else 'all'}")  # fmt: skip
        a, b, winner = str(battle["source1"]), str(battle["source2"]), str(battle["winner"])
        if winner not in (a, b, *NO_WINNER):
            raise JudgmentFormatError(f"{where}: winner {winner!r} is neither source1 ({a!r}), source2 ({b!r}) nor "
                                      f"one of {', '.join(NO_WINNER)}")  # fmt: skip
        if a == b:
            against_itself.append(k)
            continue
        key = (str(battle["img"]), frozenset({(a, norm_text(battle["caption1"])), (b, norm_text(battle["caption2"]))}))
        if key in seen:
            repeats.append((k, seen[key]))
            continue
        seen[key] = k
        preference = 1.0 if winner == a else 0.0 if winner == b else 0.5
        ref = battle.get("ref")
        items.append(PairJudgment(
            id=str(k + 1), image=str(battle["img"]), caption_a=caption_text(battle["caption1"], where, "caption1"),
            caption_b=caption_text(battle["caption2"], where, "caption2"), preference=preference, refs=[norm_text(ref)] if ref else [],
            image_id=Path(str(battle["img"])).stem, category=str(battle["cluster"]), row=k + 1, systems=(a, b),
            verdict=winner,
        ))  # fmt: skip
    notes = []
    if against_itself:
        notes.append(f"{file}: {len(against_itself)} battle(s) of a model against itself dropped "
                     f"([{', '.join(map(str, against_itself[:5]))}]{', ...' if len(against_itself) > 5 else ''})")
    if repeats:
        shown = ", ".join(f"[{k}] repeats [{first}]" for k, first in repeats[:5])
        notes.append(f"{file}: {len(repeats)} repeated battle(s) dropped ({shown}{', ...' if len(repeats) > 5 else ''})")
    if not items:
        raise JudgmentFormatError(f"{file}: no battles" + (f" ({'; '.join(notes)})" if notes else ""))
    for note in notes:
        log.warning("%s", note)
    return Judgments(PAIRS, items, file, notes=notes)
