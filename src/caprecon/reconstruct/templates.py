"""Prompt templates that wrap a caption before it reaches the text-to-image model.

A template is a string holding `{caption}` once, or the name of a preset. The rendered
template text is part of every reconstruction's cache key.
"""

from __future__ import annotations

import re

PRESETS: dict[str, str] = {
    "plain": "{caption}",
    "photo": "A photograph. {caption}",
    # Remote-sensing captions describe a scene seen from above; without the constraint a
    # general generator often renders it at street level. Wording is ours; the idea (a
    # perspective constraint wrapped around the caption) is the ReconScore paper's.
    "remote-sensing": (
        "A high-resolution satellite image, captured from directly overhead in a strict top-down "
        "(nadir) view, with no horizon, no sky and no oblique perspective. The scene: {caption}"
    ),
}


def resolve_template(template: str | None) -> str:
    """A preset name or a literal template; the result always contains `{caption}`."""
    if template is None:
        return PRESETS["plain"]
    text = PRESETS.get(template, template)
    if text.count("{caption}") != 1:
        known = ", ".join(sorted(PRESETS))
        raise ValueError(f"prompt template must contain '{{caption}}' exactly once, or be a preset ({known}): {template!r}")
    # only {caption} is filled in: another {name}, or a positional {} / {0}, would reach the generator as
    # written, a mistake (as --vqa-template refuses) rather than text anyone meant to draw
    others = sorted(set(re.findall(r"\{[^{}]*\}", text)) - {"{caption}"})
    if others:
        raise ValueError(f"prompt template: {', '.join(others)} is not filled in (only {{caption}} is): {template!r}")
    return text


def render(template: str, caption: str) -> str:
    # str.replace, not str.format: captions may contain braces
    return template.replace("{caption}", caption.strip())
