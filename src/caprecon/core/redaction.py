"""Keep secrets off disk: API keys, tokens and passwords never reach a manifest, a log or a report.

This is the project's one redactor: run manifests, command lines, log records, error
messages and the HTML report all go through it. Every record of a caprecon logger is masked
by `redact_record` as it is made (the record factory `import caprecon` installs), so no entry point
(the command line, Python, a `Reward` in a trainer, a service) logs a secret to any handler;
the command line also masks other libraries' records on its handlers (`install_log_filter`).

A name is secret when one of its words is (`api_key`, `hf_token`, `password`, `secret`,
`authorization`, `cookie`, `headers`, ...), unless the words after it say the value is
something about the secret rather than the secret: `token_count`, `token_type_ids`,
`token_room` (how many tokens a prompt may still take), `api_key_env` (the name of an
environment variable), `password_file` (a path). Plurals are other words: `max_new_tokens`
and `tokens_cut` count text pieces, `tokenizer` is a model; and `eos_token` or
`image_token` is an entry of a model's vocabulary.
Values under a secret name are replaced by a mark (a `headers` mapping whole), and so are,
inside any text, `name=value` and `--name value` pairs naming one (a `{...}` or `[...]`
value whole: `headers={"X-Org": "..."}`), the credentials of an
`Authorization: Bearer|Basic ...` header, and the `user:password@` part of a URL.

Every secret value met this way, and those registered by `remember_options`, is
remembered and masked wherever it appears later, so a key that reaches a message by
another path is hidden as well. Keep keys in the environment (`api_key_env=NAME`, or
`OPENAI_API_KEY`), not on the command line, where other users of the machine can read
them in the process list.
"""

from __future__ import annotations

import logging
import re
from typing import Any

MASK = "***"
# a word, or two adjacent words run together (api_key, secret_key), that names a secret
_SECRET_WORDS = frozenset({"apikey", "token", "password", "passwd", "secret", "authorization", "authorisation",
                           "auth", "header", "headers", "cookie", "cookies", "credential", "credentials",
                           "secretkey", "accesskey", "privatekey"})
# words that, following the secret word, make the name one for a fact about the secret: when
# every later word is one of these the value is not secret; any other later word (hf_token_value)
# leaves it secret, since a name we do not know is safer masked
_ABOUT_THE_SECRET = frozenset({"count", "counts", "num", "cut", "id", "ids", "type", "types", "prob", "probs",
                               "logprob", "logprobs", "len", "length", "limit", "budget", "room", "env", "var", "file",
                               "path"})
# `eos_token`, `image_token`: a model's vocabulary entry, not a credential
_VOCABULARY = frozenset({"bos", "eos", "pad", "unk", "sep", "cls", "mask", "image", "special", "start", "end", "stop"})
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
# the scheme of an Authorization value is kept; the credentials after it are the secret
_SCHEME = r"(?:(?i:bearer|basic|digest|token)\s+)?"
_SCHEMED = re.compile(_SCHEME + r"(\S+)")
# name=value, name: value, "name": "value" -- found at every position (a lookahead), so the
# `token=...` inside `--judge-opt=token=...` is seen as well. Space before the `=` or `:` only
# after a quoted name: in prose ("the first answer token = 'Yes'") a word is not an option name
_PAIR = re.compile(r"(?=\b([A-Za-z_][\w.-]*)(?:[\"']\s*[=:]|[=:])\s*[\"']?" + _SCHEME + r"([^\s,;&'\"]+))")
# a command line's `--api-key VALUE`
_FLAG = re.compile(r"-{1,2}([A-Za-z][\w-]*)")
_FLAG_VALUE = re.compile(r"(?<![\w-])-{1,2}([A-Za-z][\w-]*)[ \t]+(?![-\s])([^\s'\"]+)")
_BEARER = re.compile(r"\b(bearer\s+)([^\s'\"]+)", re.IGNORECASE)
# scheme://user:password@host -- the whole user part goes, since a token is often the user itself
_URL_USERINFO = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://([^\s/?#@'\"<>]+)@")
# inside a masked mapping, the values worth remembering: "name": "value" (each header's value)
_QUOTED_VALUE = re.compile(r"""[:=]\s*["']([^"']+)["']""")

_known: set[str] = set()  # secret values seen so far, masked wherever they appear


def _words(name: str) -> list[str]:
    return [w for w in re.split(r"[^a-z0-9]+", _CAMEL.sub("_", name).lower()) if w]


def is_secret_name(name: str) -> bool:
    """`api_key`, `x-api-key`, `apiKey`, `hf_token`, `password`, `headers`... but not `token_count`,
    `max_new_tokens`, `tokenizer`, nor `api_key_env`."""
    words = _words(name)
    secret_at = [i for i, word in enumerate(words)
                 if (word in _SECRET_WORDS and not (word == "token" and i and words[i - 1] in _VOCABULARY))
                 or (i and words[i - 1] + word in _SECRET_WORDS)]
    if not secret_at:
        return False
    after = words[secret_at[-1] + 1:]
    return not (after and set(after) <= _ABOUT_THE_SECRET)


def _flag_names_secret(word: Any) -> bool:
    match = _FLAG.fullmatch(word) if isinstance(word, str) else None
    return bool(match) and is_secret_name(match.group(1))


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
        for previous, item in zip((None, *value), value):
            if _flag_names_secret(previous):
                _remember(item)
            else:
                _collect(item)
    elif isinstance(value, str):
        for secret in _find(value)[1]:
            _remember(secret)


def _mask(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: MASK if isinstance(key, str) and is_secret_name(key) and item not in (None, "", {}, [])
                else _mask(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(MASK if _flag_names_secret(previous) and item not in (None, "") else _mask(item)
                           for previous, item in zip((None, *value), value))
    if isinstance(value, str):
        return redact_text(value)
    return value


def _find(text: str) -> tuple[list[tuple[int, int]], list[str]]:
    """The spans of `text` to mask, and the secret values among them worth remembering."""
    spans, secrets = [], []
    for m in _PAIR.finditer(text):
        if not is_secret_name(m.group(1)):
            continue
        start, end = m.span(2)
        if text[start] in "{[":  # `headers={"X-Org": "..."}`: the whole mapping is the secret
            end = _closing(text, start)
            secrets += _QUOTED_VALUE.findall(text, start, end)
        else:
            secrets.append(text[start:end])
        spans.append((start, end))
    flags = [m.span(2) for m in _FLAG_VALUE.finditer(text) if is_secret_name(m.group(1))]
    flags += [m.span(2) for m in _BEARER.finditer(text)]
    spans += flags
    secrets += [text[start:end] for start, end in flags]
    for match in _URL_USERINFO.finditer(text):
        spans.append(match.span(1))
        user, _, password = match.group(1).partition(":")
        secrets.append(password or user)  # a user name alone is no secret, but a lone token is
    return spans, secrets


def _closing(text: str, start: int) -> int:
    """Where the bracket opened at `start` closes (quotes respected), or the text's end."""
    depth, quote, escaped = 0, None, False
    for i in range(start, len(text)):
        char = text[i]
        if quote:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = None
        elif char in "\"'":
            quote = char
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
            if not depth:
                return i + 1
    return len(text)


def redact_text(text: str) -> str:
    """`api_key=...`, `"token": "..."`, `Bearer ...`, `user:password@` and every secret seen before, masked."""
    spans, secrets = _find(text)
    for secret in secrets:
        _remember(secret)
    for start, end in reversed(_merge(spans)):
        text = text[:start] + MASK + text[end:]
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
        if (schemed := _SCHEMED.fullmatch(value)) and len(schemed.group(1)) >= 4:
            _known.add(schemed.group(1))  # "Basic XXX": XXX may be quoted alone
    elif isinstance(value, dict):
        for item in value.values():
            _remember(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _remember(item)


def remember_options(options: dict[str, Any] | None) -> None:
    """Note the secret values among a role's options, so logs mask them from the start."""
    redact(options or {})


def redact_record(record: logging.LogRecord) -> None:
    """Mask secrets in a log record in place: its message (arguments merged in) and the text of the
    traceback it carries, which the standard formatters print instead of formatting it again."""
    try:
        message = record.getMessage()
    except Exception:  # a malformed call: the handler's formatter reports it as logging does
        return
    record.msg, record.args = redact_text(message), None
    if record.exc_info and not record.exc_text:
        record.exc_text = redact_text(logging.Formatter().formatException(record.exc_info))
    if record.stack_info:
        record.stack_info = redact_text(record.stack_info)


class RedactingFilter(logging.Filter):
    """Masks secrets in every record a handler emits (other libraries' records too, under the
    command line, which installs it on the root's handlers)."""

    def filter(self, record: logging.LogRecord) -> bool:
        redact_record(record)
        return True


def install_log_filter() -> None:
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())
