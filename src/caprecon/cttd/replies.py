"""Reading JSON out of model replies: strict first, then the repairs models commonly need.

A reply is read by `parse_json_reply`: `json.loads` on the whole text; failing that, the
same text after each repair below, in order, until one parses:

1. the inside of a Markdown code fence (a missing closing fence is tolerated);
2. the first JSON object or list found in prose around it;
3. trailing commas removed, Python literals (True/False/None) as JSON's;
4. single-quoted strings as double-quoted ones;
5. a reply cut off mid-way (token limit): cut back to the last complete element and the
   open brackets closed. The element in flight is lost rather than guessed at.

What the parsed value must look like is the caller's business (`ReplyShapeError`); the
stages ask the model once more with the error (`REPAIR_PROMPT`) before dropping a reply.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable


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
    start = min((i for i in (body.find("{"), body.find("[")) if i >= 0), default=-1)
    if start < 0:
        raise ReplyError("no JSON object or list in the reply")
    body = body[start:]
    for fix in (_complete_value, _literals_and_commas, _single_quotes):
        body = fix(body)
        try:
            return json.loads(body), True
        except json.JSONDecodeError:
            continue
    value = _close_truncated(body)
    if value is _NOTHING:
        raise ReplyError("the reply holds JSON that could not be repaired")
    return value, True


def _complete_value(text: str) -> str:
    """The first complete top-level value, dropping prose after it (the text unchanged when
    the value never closes)."""
    depth, in_string, escaped = 0, False, False
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return text[: i + 1]
    return text


def _outside_strings(text: str, pattern: re.Pattern, replace: Callable[[re.Match], str]) -> str:
    """Apply a regex substitution only to the parts of `text` outside double-quoted strings."""
    out: list[str] = []
    last, in_string, escaped = 0, False, False
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
                out.append(text[last : i + 1])
                last = i + 1
        elif ch == '"':
            out.append(pattern.sub(replace, text[last:i]))
            last = i
            in_string = True
    out.append(text[last:] if in_string else pattern.sub(replace, text[last:]))
    return "".join(out)


_TRAILING_COMMA = re.compile(r",(\s*[}\]])")
_PY_LITERALS = re.compile(r"\b(True|False|None)\b")


def _literals_and_commas(text: str) -> str:
    text = _outside_strings(text, _TRAILING_COMMA, lambda m: m.group(1))
    return _outside_strings(text, _PY_LITERALS, lambda m: {"True": "true", "False": "false", "None": "null"}[m.group(1)])


def _single_quotes(text: str) -> str:
    """'...' strings (Python style) as "..." strings; apostrophes inside "..." are untouched."""
    out: list[str] = []
    quote: str | None = None
    escaped = False
    for ch in text:
        if quote is None:
            if ch in "\"'":
                quote = ch
                out.append('"')
            else:
                out.append(ch)
        elif escaped:
            escaped = False
            if quote == "'" and ch == "'":
                out[-1] = "'"  # \' inside '...' is a plain apostrophe: drop the backslash
            else:
                out.append(ch)
        elif ch == "\\":
            escaped = True
            out.append(ch)
        elif ch == quote:
            quote = None
            out.append('"')
        elif ch == '"':  # a double quote inside '...'
            out.append('\\"')
        else:
            out.append(ch)
    return _literals_and_commas(_complete_value("".join(out)))


_NOTHING = object()


def _close_truncated(text: str) -> Any:
    """Parse a reply cut off mid-way: from the end backwards, each comma outside strings
    is a point where the elements before it are complete; close the brackets open there."""
    cuts: list[tuple[int, list[str]]] = []
    stack: list[str] = []
    in_string = escaped = False
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            stack.append("}" if ch == "{" else "]")
        elif ch in "}]":
            if stack and stack[-1] == ch:
                stack.pop()
            cuts.append((i + 1, list(stack)))
        elif ch == ",":
            cuts.append((i, list(stack)))
    if not in_string:
        cuts.append((len(text), list(stack)))
    for end, open_brackets in reversed(cuts):
        candidate = _literals_and_commas(text[:end].rstrip().rstrip(",") + "".join(reversed(open_brackets)))
        try:
            return json.loads(candidate)
        except json.JSONDecodeError:
            continue
    return _NOTHING


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
