"""One caption normaliser, shared by every metric: markdown and layout out, words kept.

Captions written by language models often arrive as markdown: numbered or bulleted
lists, bold labels, headers, line breaks. Text encoders read those characters as tokens
(BPE tokenizers merge "\\n", "**" or "1." with the neighbouring word into pieces no
training caption had), which the Re-LAION-Caption 19M evaluation names as a pitfall for
prompt adherence. `normalise_caption` removes the layout and keeps the words:

- list markers ("1.", "2)", "(3)", "-", "*", "+", "•") at the start of a line;
- headers ("## Scene"), block quotes ("> "), horizontal rules, code fences;
- inline markup: **bold**, __bold__, *italics*, _italics_, `code`, [links](url)
  (the link text stays), images ![alt](url) (the alt text stays), <br> tags;
- line breaks: a header, a list item or a line that starts with a capital letter is a
  block of its own; a line that starts otherwise continues the block before it (a
  sentence wrapped over two lines joins with a space). When the caption has several
  blocks, each ends with a full stop (unless it already ends with . ! ? : or ;), so the
  sentence boundaries the layout gave survive as punctuation. A one-block caption keeps
  its own ending;
- whitespace: runs of spaces and tabs, non-breaking and zero-width spaces become one
  space; the ends are trimmed.

Anything else — wording, case, punctuation inside sentences — is left as written, so a
plain one-line caption comes out unchanged apart from its whitespace.

`collapse_whitespace`, the lighter rule every reconstruction request goes through (whether or
not the captions are normalised): the ends trimmed and each run of whitespace one space, so
`" a cat"` and `"a  cat "` are one request, and one generation, with `"a cat"`.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Sequence

from caprecon.data.samples import Sample

_ZERO_WIDTH = re.compile("[\u200b\u200c\u200d\u2060\ufeff]")
_SPACES = re.compile(r"[ \t\u00a0\u2000-\u200a\u202f\u205f\u3000]+")
_BR = re.compile(r"<br\s*/?>", re.IGNORECASE)

_FENCE = re.compile(r"^\s*(```|~~~)")
_RULE = re.compile(r"^\s*([-*_])(\s*\1){2,}\s*$")
_HEADER = re.compile(r"^\s*#{1,6}\s+(.*?)\s*#*\s*$")
_QUOTE = re.compile(r"^\s*(>\s*)+")
_NUMBERED = re.compile(r"^\s*(\d{1,3}[.)]|\(\d{1,3}\))\s+")
_BULLET = re.compile(r"^\s*[-*+\u2022\u00b7\u25aa\u25e6\u2023\u2013\u2014]\s+")

_IMAGE = re.compile(r"!\[([^\]]*)\]\([^)]*\)")
_LINK = re.compile(r"\[([^\]]+)\]\([^)]*\)")
_CODE = re.compile(r"`+([^`]*)`+")
_STRONG = re.compile(r"(\*\*|__)(?=\S)(.+?)(?<=\S)\1")
_EMPHASIS_STAR = re.compile(r"(?<![\w*])\*(?=\S)([^*]+?)(?<=\S)\*(?![\w*])")
_EMPHASIS_UNDERSCORE = re.compile(r"(?<![\w_])_(?=\S)([^_]+?)(?<=\S)_(?![\w_])")
_LEFTOVER_MARKS = re.compile(r"\*{2,}|_{2,}")

_ENDS_SENTENCE = (".", "!", "?", ":", ";")


def _inline(text: str) -> str:
    text = _IMAGE.sub(r"\1", text)
    text = _LINK.sub(r"\1", text)
    text = _CODE.sub(r"\1", text)
    text = _STRONG.sub(r"\2", text)
    text = _EMPHASIS_STAR.sub(r"\1", text)
    text = _EMPHASIS_UNDERSCORE.sub(r"\1", text)
    text = _LEFTOVER_MARKS.sub("", text)  # an unmatched ** or __ is markup, never words
    return _SPACES.sub(" ", text).strip()


def _blocks(text: str) -> list[str]:
    """The caption's blocks (header, list item, paragraph), still with inline markup."""
    blocks: list[str] = []
    current: list[str] = []  # lines of the block being read

    def close() -> None:
        nonlocal current
        if current:
            blocks.append(" ".join(current))
        current = []

    for line in text.split("\n"):
        if not line.strip() or _RULE.match(line) or _FENCE.match(line):
            close()
            continue
        line = _QUOTE.sub("", line)
        header = _HEADER.match(line)
        if header:
            close()
            blocks.append(header.group(1))
            continue
        item = _NUMBERED.match(line) or _BULLET.match(line)
        if item:
            close()
            current = [line[item.end():]]
            continue
        if _inline(line)[:1].isupper():
            close()
        current.append(line)
    close()
    return blocks


def collapse_whitespace(text: str) -> str:
    """`text` with its ends trimmed and every run of whitespace (line breaks included) one space."""
    return " ".join(text.split())


def normalise_caption(text: str) -> str:
    """The caption without markdown, list markers and stray line breaks (see the module doc)."""
    text = _ZERO_WIDTH.sub("", str(text)).replace("\r\n", "\n").replace("\r", "\n")
    text = _BR.sub("\n", text)
    blocks = [b for b in (_inline(block) for block in _blocks(text)) if b]
    if len(blocks) > 1:
        blocks = [b if b.endswith(_ENDS_SENTENCE) else b + "." for b in blocks]
    return " ".join(blocks)


def normalised_samples(samples: Sequence[Sample]) -> list[Sample]:
    """Copies of `samples` with normalised captions; each keeps its raw text in
    `meta["caption_raw"]`, which run records carry as `caption_raw`."""
    return [replace(s, caption=normalise_caption(s.caption), meta={**s.meta, "caption_raw": s.caption})
            for s in samples]
