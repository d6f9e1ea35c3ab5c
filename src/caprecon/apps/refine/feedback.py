"""The feedback a revision is asked from and the models asked for it: the prompts, the replies
read, and the revisions, descriptions and differences, each model call cached in the run's store
(`Asker`)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from caprecon.data.images import LoadedSample, decode_bytes
from caprecon.data.samples import Sample
from caprecon.metrics.base import Context
from caprecon.models.captioner import CaptionRequest, Sampling
from caprecon.models.vlm import VLMRequest
from caprecon.store.index import content_key

FEEDBACK = ("flipped", "unsupported", "differences")

DESCRIBE_PROMPT = ("Describe this image in detail: every object with its colour, shape, size, count and position, "
                   "the setting, and any visible text. Describe only what can be seen. Answer in plain prose.")
COMPARE_PROMPT = (
    "Two descriptions follow. The first describes a photograph. The second describes a picture that was drawn "
    "from a caption of that photograph.\n\nThe photograph: {original}\n\nThe drawing: {reconstruction}\n\n"
    "List each way the drawing differs from the photograph (something missing, wrong or added), one per line, "
    "each line starting with \"- \". If they agree, write \"- none\".")

REVISION_MAX_NEW_TOKENS = 512
DESCRIPTION_MAX_NEW_TOKENS = 256


def revision_prompt(caption: str, feedback: Mapping[str, Sequence[Any]], *, sees_image: bool,
                    words: int | None) -> str:
    """What the reviser is asked: the caption, what to add or correct, what to remove, the budget."""
    add = [f'Asked "{f["question"]}", the answer is "{f["answer"]}", but the picture suggested '
           f'"{f["on_reconstruction"]}".' for f in feedback.get("flipped", [])]
    add += list(feedback.get("differences", []))
    remove = [c["claim"] for c in feedback.get("unsupported", [])]
    lines = [("You can see the image. " if sees_image else "") + "Here is a caption of the image:", "",
             caption.strip(), "",
             "A picture was drawn from this caption alone and compared with the image."]
    if add:
        lines += ["", "Add or correct (the picture got these wrong):", *(f"- {a}" for a in add)]
    if remove:
        lines += ["", "Remove (the image does not show these):", *(f"- {r}" for r in remove)]
    budget = f" Use at most {words} words." if words else ""
    lines += ["", "Rewrite the caption: keep what is right, add what is missing, remove what is not in the image."
              f"{budget} Reply with the caption only."]
    return "\n".join(lines)


def parse_differences(reply: str) -> list[str]:
    """The '- ' lines of the LLM's comparison; '- none' means none."""
    items = [line.strip()[2:].strip() for line in reply.splitlines() if line.strip().startswith("- ")]
    return [i for i in items if i and i.lower().rstrip(".") != "none"]


def clean_revision(reply: str) -> str:
    text = reply.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        text = text[1:-1].strip()
    return text


def words_budget(tokens: int | None) -> int | None:
    """Words that fit in `tokens` text-encoder tokens, leaving room for words of several tokens."""
    return None if tokens is None else max(1, tokens * 3 // 4)


class Asker:
    """Revisions, descriptions and differences, each cached by content key in the run's store."""

    def __init__(self, ctx: Context, *, reviser: Any, sees_image: bool, judge: Any = None, llm: Any = None,
                 seed: int = 0):
        self.ctx, self.reviser, self.sees_image = ctx, reviser, sees_image
        self.judge, self.llm, self.seed = judge, llm, seed
        self.sampling = Sampling(temperature=0.0, max_new_tokens=REVISION_MAX_NEW_TOKENS)  # greedy: reproducible

    def revise(self, asks: Sequence[tuple[str, Any]]) -> list[str]:
        """One revision per (prompt, original LoadedSample)."""
        keys = [content_key("refine-revision", reviser=self.reviser.fingerprint, prompt=prompt,
                            image=item.image_key if self.sees_image else None, seed=self.seed,
                            sampling=self.sampling.to_dict() if self.sees_image else REVISION_MAX_NEW_TOKENS)
                for prompt, item in asks]

        def compute(order: list[int]) -> list[dict[str, str]]:
            if self.sees_image:
                requests = [CaptionRequest(asks[i][1].image, asks[i][0], 1, self.seed, asks[i][1].image_key)
                            for i in order]
                with self.ctx.model_call():
                    replies = [c[0] for c in self.reviser.caption(requests, self.sampling)]
            else:
                with self.ctx.model_call():
                    replies = self.reviser.generate([asks[i][0] for i in order], REVISION_MAX_NEW_TOKENS)
            return [{"text": r} for r in replies]

        return [clean_revision(r["text"]) for r in self.ctx.cached("refine-revision", keys, compute,
                                                                   model=self.reviser)]

    def describe(self, images: Sequence[tuple[str, Any]]) -> list[str]:
        """The judge's description of each (content key, loader of the image)."""
        keys = [content_key("refine-description", judge=self.judge.fingerprint, prompt=DESCRIBE_PROMPT, image=k)
                for k, _ in images]

        def compute(order: list[int]) -> list[dict[str, str]]:
            requests = [VLMRequest(images[i][1](), DESCRIBE_PROMPT, images[i][0]) for i in order]
            with self.ctx.model_call():
                return [{"text": t} for t in self.judge.generate(requests, DESCRIPTION_MAX_NEW_TOKENS)]

        return [r["text"] for r in self.ctx.cached("refine-description", keys, compute, model=self.judge)]

    def differences(self, pairs: Sequence[tuple[str, str]]) -> list[list[str]]:
        """The LLM's list of differences between each (description of I, description of Î)."""
        prompts = [COMPARE_PROMPT.format(original=a.strip(), reconstruction=b.strip()) for a, b in pairs]
        keys = [content_key("refine-differences", llm=self.llm.fingerprint, prompt=p) for p in prompts]

        def compute(order: list[int]) -> list[dict[str, str]]:
            with self.ctx.model_call():
                return [{"text": t} for t in self.llm.generate([prompts[i] for i in order],
                                                                DESCRIPTION_MAX_NEW_TOKENS)]

        return [parse_differences(r["text"]) for r in self.ctx.cached("refine-differences", keys, compute,
                                                                      model=self.llm)]


def feedback_notes(due: Sequence[Sample], states: Mapping[str, Mapping[str, Any]], sources: Sequence[str],
                   asker: Asker, original: Callable[[Sample], LoadedSample]) -> dict[str, dict[str, list]]:
    """Each due caption's feedback, by source, from its version as it stands (`states`): the
    guiding half's flipped questions, the unsupported claims, the differences of the judge's
    descriptions of I and Î (`original` reads a sample's image once)."""
    notes: dict[str, dict[str, list]] = {s.id: {} for s in due}
    for s in due:
        if "flipped" in sources:  # the guiding half's: a held-out question is never told
            notes[s.id]["flipped"] = list(states[s.id].get("turing_guiding_flipped") or [])
        if "unsupported" in sources:
            notes[s.id]["unsupported"] = list(states[s.id].get("halluc_unsupported") or [])
    if "differences" in sources:
        with_recon = [s for s in due if states[s.id].get("reconstruction")]
        for s in due:
            notes[s.id]["differences"] = []
        if with_recon:
            originals = asker.describe([(original(s).image_key, lambda s=s: original(s).image) for s in with_recon])
            recons = asker.describe([_recon_image(states[s.id]["reconstruction"]) for s in with_recon])
            for s, listed in zip(with_recon, asker.differences(list(zip(originals, recons)))):
                notes[s.id]["differences"] = listed
    return notes


def _recon_image(path: str) -> tuple[str, Any]:
    """A reconstruction's content key and a loader of its image."""
    data = Path(path).read_bytes()
    return hashlib.sha256(data).hexdigest(), lambda: decode_bytes(data, path)
