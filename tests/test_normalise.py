"""The caption normaliser on each kind of tokenizer artifact, against hand-written text."""

import pytest

from caprecon.data.normalise import normalise_caption, normalised_samples
from caprecon.data.samples import Sample

CASES = {
    "plain caption unchanged": ("A brown dog runs across a sunny meadow.", "A brown dog runs across a sunny meadow."),
    "plain caption keeps its (missing) ending": ("a cat on a mat", "a cat on a mat"),
    "repeated whitespace and tabs": ("A  dog\t\truns   fast ", "A dog runs fast"),
    "non-breaking and zero-width spaces": ("A\u00a0red\u200b car", "A red car"),
    "stray newline inside a sentence": ("a dog sitting on\nthe grass", "a dog sitting on the grass"),
    "newlines between sentences": ("A dog.\n\n\nA cat sleeps", "A dog. A cat sleeps."),
    "windows line ends": ("Subject: a dog\r\nSetting: a park", "Subject: a dog. Setting: a park."),
    "numbered list": ("1. A red car\n2. A blue sky\n3) Three birds", "A red car. A blue sky. Three birds."),
    "numbered list in parentheses": ("(1) a tree (2) not a list", "a tree (2) not a list"),
    "bullets": ("- a dog\n* a cat\n+ a bird\n\u2022 a fish", "a dog. a cat. a bird. a fish."),
    "bullet wrapped over two lines": ("- a cat sitting\n  on a mat\n- a dog", "a cat sitting on a mat. a dog."),
    "bold labels": ("**Subject:** a dog\n**Setting:** a park", "Subject: a dog. Setting: a park."),
    "italics and underscores": ("a *very* small _red_ car near __the__ snake_case sign",
                                "a very small red car near the snake_case sign"),
    "headers": ("## Scene\nA beach at dusk\n### Style ###\nWatercolour", "Scene. A beach at dusk. Style. Watercolour."),
    "links, images, code": ("See [the harbour](http://x.org/h) and ![a boat](b.png) in `oil`",
                            "See the harbour and a boat in oil"),
    "rules, quotes, fences, br": ("> A fox<br>jumps\n---\n```\nA hen\n```", "A fox jumps. A hen."),
    "unmatched bold marks": ("**A dog on grass", "A dog on grass"),
    "arithmetic star kept": ("5 * 3 apples", "5 * 3 apples"),
    "header ending in a colon keeps it": ("# Subject:\nA dog", "Subject: A dog."),
}


@pytest.mark.parametrize("raw, expected", CASES.values(), ids=CASES.keys())
def test_normalise_caption(raw, expected):
    assert normalise_caption(raw) == expected


def test_normalising_twice_changes_nothing():
    for raw, _ in CASES.values():
        once = normalise_caption(raw)
        assert normalise_caption(once) == once


def test_samples_keep_their_raw_caption():
    raw = "1. A red car\n2. A blue sky"
    (sample,) = normalised_samples([Sample(id="x", image=None, caption=raw, meta={"url": "u"})])
    assert sample.caption == "A red car. A blue sky."
    assert sample.meta == {"url": "u", "caption_raw": raw}
