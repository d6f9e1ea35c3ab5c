"""Scripted revisers for the refinement tests, on the shapes world of `oracle` and `cttd_fakes`.

`ReviserLLM` reads the revision prompt back: the caption it is asked to revise, and the
colours the flipped questions say are missing ("Is there a blue shape in the image?", the
answer "yes"). Its `mode` decides what it writes: `fix` adds the first missing colour as a
square, `copy` copies every flipped question's answer into the caption (a square of each
colour told missing), `add COLOUR` always adds a square of that colour, `worse` turns the caption's first
colour yellow, `same` returns the caption unchanged. It logs every prompt (`prompts`), and with `fail_on_call=k` raises on its k-th
call, as a killed process would stop. Its comparison replies (for `differences`) name the
colours one description has and the other lacks.

`ShapesCaptioner` is a captioner that sees the image: asked for candidates it names one
shape of the wrong colour first, then the right scene; asked for a revision it adds one
shape of the image the caption lacks. `FailingGenerator` is the oracle generator that
raises on the first prompt naming a colour, once per process.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from cttd_fakes import ScriptedVLM, shapes
from oracle import COLOURS, OracleGenerator

_FLIP = re.compile(r'Asked "Is there an? (\w+) shape in the image\?", the answer is "yes"')


def revised_caption(prompt: str) -> str:
    """The caption a revision prompt asks to revise (the line after its introduction)."""
    lines = prompt.split("\n")
    start = next(i for i, line in enumerate(lines) if line.endswith("Here is a caption of the image:"))
    return lines[start + 2]


def missing_colours(prompt: str) -> list[str]:
    return _FLIP.findall(prompt)


class ReviserLLM:
    def __init__(self, mode: str = "fix", fail_on_call: int | None = None):
        self.mode = mode
        self.fail_on_call = fail_on_call
        self.calls = 0
        self.prompts: list[str] = []

    @property
    def fingerprint(self) -> str:
        return f"reviser-llm-{self.mode}"

    def _reply(self, prompt: str) -> str:
        if prompt.startswith("Two descriptions follow"):
            first, second = prompt.split("The drawing:")
            a = set(re.findall(rf"\b({'|'.join(COLOURS)})\b", first.split("The photograph:")[1]))
            b = set(re.findall(rf"\b({'|'.join(COLOURS)})\b", second))
            gaps = [f"- the drawing has no {c} shape" for c in sorted(a - b)]
            return "\n".join(gaps) or "- none"
        caption = revised_caption(prompt)
        if self.mode == "fix":
            missing = missing_colours(prompt) or re.findall(r"the drawing has no (\w+) shape", prompt)
            return caption + (f" and a {missing[0]} square" if missing else "")
        if self.mode == "copy":
            return caption + "".join(f" and a {c} square" for c in missing_colours(prompt))
        if self.mode.startswith("add "):
            return caption + f" and a {self.mode[4:]} square"
        if self.mode == "worse":
            return re.sub(rf"\b({'|'.join(COLOURS)})\b", "yellow", caption, count=1)
        return caption

    def generate(self, prompts: Sequence[str], max_new_tokens: int = 64) -> list[str]:
        self.calls += 1
        if self.fail_on_call is not None and self.calls >= self.fail_on_call:
            raise KeyboardInterrupt("stopped by the test")
        self.prompts += list(prompts)
        return [self._reply(p) for p in prompts]

    def option_probs(self, prompts, options):
        raise NotImplementedError


class DescribingVLM(ScriptedVLM):
    """The scripted judge, which also describes an image by its shapes' colours."""

    def _reply(self, request) -> str:
        if request.prompt.startswith("Describe this image"):
            return "Shapes: " + ", ".join(f"a {c} shape" for c, _ in shapes(request.image)) + "."
        return super()._reply(request)


class ShapesCaptioner:
    def __init__(self):
        self.revisions = 0

    @property
    def fingerprint(self) -> str:
        return "shapes-captioner-v1"

    def generation_defaults(self) -> dict:
        return {}

    def caption(self, requests, sampling) -> list[list[str]]:
        out = []
        for r in requests:
            colours = [c for c, _ in shapes(r.image)]
            if "Here is a caption of the image:" in r.prompt:
                self.revisions += 1
                caption = revised_caption(r.prompt)
                missing = [c for c in colours if c not in caption]
                out.append([caption + (f" and a {missing[0]} square" if missing else "")])
            else:
                first = f"a {colours[0]} square" if colours else "a white picture"
                out.append((["a yellow square", first] * r.n)[: r.n])
        return out


class FailingGenerator(OracleGenerator):
    """Raises on the first prompt naming `colour` (once per process), after the earlier images."""

    failed = False

    def __init__(self, colour: str = "green"):
        self.colour = colour

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(b"oracle-v1").hexdigest()[:24]  # the oracle's: the cache is shared

    def generate(self, requests):
        if not FailingGenerator.failed and any(self.colour in r.prompt for r in requests):
            FailingGenerator.failed = True
            raise KeyboardInterrupt("killed mid-round by the test")
        return super().generate(requests)


class SlowReviserLLM(ReviserLLM):
    """The fixing reviser for a `caprecon refine` subprocess: with REFINE_BLOCK_MARKER set, its
    second call (round 2) writes that file and hangs until the test kills the process."""

    def __init__(self):
        super().__init__("fix")

    @property
    def fingerprint(self) -> str:
        return "reviser-llm-fix"  # the in-process reviser's: the resumed run finds its answers

    def generate(self, prompts, max_new_tokens: int = 64):
        marker = os.environ.get("REFINE_BLOCK_MARKER")
        if marker and self.calls >= 1:
            Path(marker).write_text("blocked")
            time.sleep(3600)
        return super().generate(prompts, max_new_tokens)


class ClaimReviserLLM:
    """The halluc tests' claim splitter (`halluc_fakes.ClaimLLM`) that also revises: asked for a
    revision, it drops each shape whose colour the prompt's Remove list names."""

    fingerprint = "claim-reviser-llm-v1"

    def __init__(self):
        from halluc_fakes import ClaimLLM

        self.splitter = ClaimLLM()
        self.revision_prompts: list[str] = []

    def _reply(self, prompt: str) -> str:
        if "Rewrite the caption" not in prompt:
            return self.splitter._reply(prompt)
        self.revision_prompts.append(prompt)
        caption = revised_caption(prompt)
        removed = prompt.split("Remove (the image does not show these):")[1] if "Remove (" in prompt else ""
        for colour in re.findall(r"- there is an? (\w+) shape", removed):
            caption = re.sub(rf"\s*and an? {colour} \w+", "", caption)
        return caption

    def generate(self, prompts, max_new_tokens: int = 64):
        return [self._reply(p) for p in prompts]

    def option_probs(self, prompts, options):
        raise NotImplementedError


class SeedSensitiveGenerator(OracleGenerator):
    """The oracle, except that of the requests for one prompt in a call, only the one with the
    smallest seed is drawn in full; the others lose the last shape named. A caption's K seeds
    come in one call, so its drawings differ by seed, the same way for every caption."""

    @property
    def fingerprint(self) -> str:
        return "seed-sensitive-oracle-v1"

    def generate(self, requests):
        smallest = {}
        for r in requests:
            smallest[r.prompt] = min(smallest.get(r.prompt, r.seed), r.seed)
        out = []
        for r in requests:
            prompt = r.prompt if r.seed == smallest[r.prompt] else r.prompt.rsplit(" and ", 1)[0] \
                if " and " in r.prompt else ""
            out.append(super().generate([replace(r, prompt=prompt)])[0])
        return out


class WordyLLM:
    """For random-weight models, where no feedback means anything: every comparison finds a
    difference, and every revision appends one more word, chosen by the caption's length."""

    fingerprint = "wordy-llm-v1"
    WORDS = ("red", "tiny", "blue", "striped", "green", "round", "old")

    def __init__(self):
        self.prompts: list[str] = []

    def generate(self, prompts, max_new_tokens: int = 64):
        self.prompts += list(prompts)
        out = []
        for p in prompts:
            if p.startswith("Two descriptions follow"):
                out.append("- the drawing differs")
            else:
                caption = revised_caption(p)
                out.append(f"{caption} {self.WORDS[len(caption.split()) % len(self.WORDS)]}")
        return out

    def option_probs(self, prompts, options):
        raise NotImplementedError
