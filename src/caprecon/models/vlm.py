"""The vision-language judge role: answer questions about an image.

Backends receive a flat list of `VLMRequest`s and group them by `image_key` themselves,
so all the questions about one image go in one batched call (and the image is encoded
once where the model allows it). Decoding is greedy; probabilities are read from the
next-token distribution (full-vocabulary softmax) at the answer position — for an
encoder-decoder language model (InstructBLIP-Flan-T5), the decoder's, teacher-forced after
its start token. A judge also knows the box convention of its grounding answers
(`box_coords`) and, for pixel answers, the size of the image its processor made (`box_frame`).
"""


from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence, runtime_checkable

from PIL import Image

from caprecon.data.qa import COORDS


@dataclass(frozen=True)
class VLMRequest:
    image: Image.Image
    prompt: str  # the whole user turn (question, options, answer instruction)
    image_key: str = ""  # identifies the image: requests sharing it are batched together


@runtime_checkable
class VisionLanguageModel(Protocol):
    @property
    def fingerprint(self) -> str: ...

    def generate(self, requests: Sequence[VLMRequest], max_new_tokens: int = 64) -> list[str]:
        """Greedy free-form answer per request."""
        ...

    def option_probs(self, requests: Sequence[VLMRequest], options: Sequence[Sequence[str]]) -> list[list[float]]:
        """For each request, the next-token probability (full-vocabulary softmax) of the first
        token of each option string (e.g. ["A", "B", "C", "D"] or ["Yes", "No"]) as it starts
        the reply: one token per option, case and whitespace as written, never a sum over
        variants ("Yes" is not " Yes"), the rule every backend follows (t2v_metrics')."""
        ...

    def answer_prob(self, requests: Sequence[VLMRequest], answers: Sequence[str]) -> list[float]:
        """P(answer string | request), teacher-forced product of its tokens' probabilities."""
        ...


def check_box_coords(box_coords: str | None) -> str | None:
    if box_coords is not None and box_coords not in COORDS:
        raise ValueError(f"box_coords must be one of {', '.join(COORDS)}, not {box_coords!r}")
    return box_coords



def group_by_image(requests: Sequence[VLMRequest]) -> list[tuple[Image.Image, list[int]]]:
    """Request indices per image, in order of first appearance. Requests without an
    `image_key` are grouped by the identity of their image object."""
    groups: dict[Any, tuple[Image.Image, list[int]]] = {}
    for i, r in enumerate(requests):
        key = ("key", r.image_key) if r.image_key else ("object", id(r.image))
        groups.setdefault(key, (r.image, []))[1].append(i)
    return list(groups.values())
