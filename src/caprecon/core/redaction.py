"""Keep secrets off disk: API keys, tokens and passwords never reach a manifest, a log or a report.

Options whose name looks secret (`api_key`, `token`, `password`, `authorization`,
`secret`, `headers`, `cookie`, ...) are replaced by a mark wherever a run writes its
configuration, and `key=value` command-line words naming one are too. A logging filter
masks the values themselves, so a key that reaches a message by another path is hidden
as well. Keep keys in the environment (`api_key_env=NAME`, or `OPENAI_API_KEY`), not
on the command line, where other users of the machine can read them in the process list.
"""

from __future__ import annotations

import logging
import re
from typing import Any

MASK = "***"
_SECRET_WORDS = {"apikey", "token", "password", "passwd", "authorization", "authorisation", "secret", "header",
                 "headers", "cookie", "cookies", "credential", "credentials"}
# name=value, name: value, "name": "value" -- found at every position (a lookahead), so the
# `token=...` inside `--judge-opt=token=...` is seen as well
_PAIR = re.compile(r"(?=\b([A-Za-z_][\w.-]*)[\"']?\s*[=:]\s*[\"']?([^\s,;&'\"]+))")
_BEARER = re.compile(r"(Bearer\s+)[^\s'\"]+", re.IGNORECASE)

_known: set[str] = set()  # secret values seen while redacting, masked in log messages too


def is_secret_name(name: str) -> bool:
    """`api_key`, `x-api-key`, `hf_token`, `password`, `headers`... but not `max_new_tokens`,
    nor `api_key_env` (it names an environment variable; the name is not the secret)."""
    words = [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w]
    if words and words[-1] == "env":
        return False
    joined = {a + b for a, b in zip(words, words[1:])}
    return bool(_SECRET_WORDS & (set(words) | joined))


def redact(value: Any) -> Any:
    """A copy of `value` (dicts, lists, strings) with secret-looking entries masked."""
    _collect(value)  # first every secret value, so each is masked wherever else it appears
    return _mask(value)


def _collect(value: Any) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and is_secret_name(key):
                _remember(item)
            else:
                _collect(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _collect(item)
    elif isinstance(value, str):
        for match in _PAIR.finditer(value):
            if is_secret_name(match.group(1)):
                _remember(match.group(2))


def _mask(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: MASK if isinstance(key, str) and is_secret_name(key) and item not in (None, "", {}, [])
                else _mask(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_mask(item) for item in value)
    if isinstance(value, str):
        return redact_text(value)
    return value


def redact_text(text: str) -> str:
    """`api_key=...`, `"token": "..."`, `Bearer ...` and every secret seen before, masked."""
    spans = [m.span(2) for m in _PAIR.finditer(text) if is_secret_name(m.group(1))]
    for start, end in reversed(_merge(spans)):
        _remember(text[start:end])
        text = text[:start] + MASK + text[end:]
    text = _BEARER.sub(lambda m: m.group(1) + MASK, text)
    for secret in sorted(_known, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start < merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def _remember(value: Any) -> None:
    if isinstance(value, str) and len(value) >= 4:  # shorter values would mask ordinary words
        _known.add(value)
    elif isinstance(value, dict):
        for item in value.values():
            _remember(item)


def remember_options(options: dict[str, Any] | None) -> None:
    """Note the secret values among a role's options, so logs mask them from the start."""
    redact(options or {})


class RedactingFilter(logging.Filter):
    """Masks known secrets and bearer tokens in every record a handler emits."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _known or "earer" in str(record.msg):
            record.msg = redact_text(record.getMessage())
            record.args = None
        return True


def install_log_filter() -> None:
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())
