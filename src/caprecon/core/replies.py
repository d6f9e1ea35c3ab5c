"""Reading JSON out of model replies: strict first, then a repair by `json_repair`, then one
retry that shows the model its reply and the error (`read_replies`).

Shared by the CTTD builder's stages and the claim extraction of the `halluc` metric.

A reply is read by `parse_json_reply`: `json.loads` on the whole text; failing that, the
inside of a Markdown code fence (a missing closing fence is tolerated) or else the whole
text is handed to the `json-repair` library, which drops prose around the value, trailing
commas and comments, reads single quotes and Python literals, and closes a reply cut off
mid-way (token limit). A value cut off mid-way comes back completed as far as it went (a
half-written pair keeps its half); whether it is complete is the stages' business.

The library never raises: for text holding no JSON it returns "" (or an empty container),
so anything but a non-empty object or list counts as unreadable (`ReplyError`). What the
parsed value must look like is the caller's business (`ReplyShapeError`); the stages ask
the model once more with the error (`REPAIR_PROMPT`) before dropping a reply.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import json_repair

log = logging.getLogger(__name__)


class ReplyError(ValueError):
    """No JSON value could be read from a reply, even after repair."""


class ReplyShapeError(ValueError):
    """The reply is JSON, but not in the shape the prompt asked for."""


REPAIR_PROMPT = (
    "Your previous reply could not be used: {error}.\n"
    "Rewrite it as valid JSON of exactly this shape, with nothing before or after it:\n{shape}\n\n"
    "Your previous reply:\n{reply}"
)


def repair_prompt(error: str, shape: str, reply: str) -> str:
    # str.replace, not str.format: replies and shapes hold braces
    return REPAIR_PROMPT.replace("{error}", error).replace("{shape}", shape).replace("{reply}", reply)


# json_repair reads prose after a fence as more JSON ("see {x}" becomes a second element),
# so the fence's inside is taken here first
_FENCE = re.compile(r"```[A-Za-z0-9_-]*[ \t]*\n?(.*?)(?:```|$)", re.DOTALL)


def parse_json_reply(text: str) -> tuple[Any, bool]:
    """(value, repaired): the JSON value in `text`, and whether a repair was needed."""
    text = str(text).strip()
    try:
        return json.loads(text), False
    except json.JSONDecodeError:
        pass
    fenced = _FENCE.search(text)
    body = fenced.group(1).strip() if fenced else text
    if "{" not in body and "[" not in body:
        raise ReplyError("no JSON object or list in the reply")
    try:
        value = json_repair.loads(body, skip_json_loads=True)
    except (ValueError, RecursionError) as exc:  # the library is lenient, but not on every input
        raise ReplyError(f"the reply holds JSON that could not be repaired ({exc})") from exc
    if not isinstance(value, (dict, list)) or not value:
        raise ReplyError("the reply holds JSON that could not be repaired")
    return value, True


@dataclass
class ParseTally:
    """How replies were read: counted per stage for the datasheet."""

    strict: int = 0
    repaired: int = 0  # read after a local repair
    retried: int = 0  # read after asking the model once more
    dropped: int = 0  # unreadable even after the retry
    reasons: dict[str, int] = field(default_factory=dict)

    def drop(self, reason: str) -> None:
        self.dropped += 1
        self.reasons[reason] = self.reasons.get(reason, 0) + 1

    def to_dict(self) -> dict[str, Any]:
        return {"strict": self.strict, "repaired": self.repaired, "retried": self.retried, "dropped": self.dropped,
                "drop_reasons": dict(sorted(self.reasons.items()))}


def read_reply(text: str, shape: Callable[[Any], tuple[Any, bool]]) -> tuple[Any, bool]:
    """(shaped value, repaired) or raise `ReplyError` / `ReplyShapeError`. `shape` turns the
    parsed JSON into what the caller needs and says whether it had to adjust it (other
    key names, say), raising `ReplyShapeError` when it cannot."""
    value, repaired = parse_json_reply(text)
    shaped, adjusted = shape(value)
    return shaped, repaired or adjusted


def read_replies(replies: Sequence[str], shape: Callable[[Any], tuple[Any, bool]], shape_text: str,
                 ask_again: Callable[[list[str]], list[str]], tally: ParseTally,
                 rejects: list[dict[str, Any]], context: Sequence[dict[str, Any]]) -> list[Any]:
    """Each reply read as JSON of the wanted shape (None where it could not be): strict,
    then locally repaired, then one retry that shows the model its reply and the error.
    What still fails is counted in `tally` and kept in `rejects` with `context[i]`."""
    values: list[Any] = [None] * len(replies)
    failed: list[tuple[int, str]] = []
    for i, reply in enumerate(replies):
        try:
            values[i], repaired = read_reply(reply, shape)
        except (ReplyError, ReplyShapeError) as exc:
            failed.append((i, str(exc)))
            continue
        if repaired:
            tally.repaired += 1
        else:
            tally.strict += 1
    if not failed:
        return values
    second = ask_again([repair_prompt(error, shape_text, replies[i]) for i, error in failed])
    for (i, error), reply in zip(failed, second):
        try:
            values[i], _ = read_reply(reply, shape)
            tally.retried += 1
        except (ReplyError, ReplyShapeError) as exc:
            reason = "wrong shape" if isinstance(exc, ReplyShapeError) else "not JSON"
            tally.drop(reason)
            rejects.append({**context[i], "reason": reason, "error": str(exc), "first_error": error,
                            "reply": replies[i], "retry_reply": reply})
            log.info("dropped a reply (%s: %s) for %s", reason, exc, context[i])
    return values
