"""What every stage shares: its job (folder, settings, models, cache), file helpers, and the
cached model calls (their JSON replies are read, repaired and retried by `caprecon.core.replies`).

Every model result goes through the run's `Context` (the content-addressed store), one
image at a time, so a stage interrupted half-way finds the images it had finished in the
store and asks the models only about the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from PIL import Image

from caprecon.data.images import decode_bytes, read_image_file
from caprecon.metrics.base import Context
from caprecon.metrics.judging import LazyImages
from caprecon.models.vlm import VLMRequest
from caprecon.core.records import json_text, read_jsonl, write_jsonl_atomically
from caprecon.store.index import content_key


@dataclass
class Job:
    """One stage's run: where it writes, the build's settings and models, the cache."""

    folder: Path  # this stage's folder inside the build folder
    build: Path  # the build folder (earlier stages' outputs)
    config: Any  # BuildConfig
    models: Any  # BuildModels
    ctx: Context
    images: list[dict[str, Any]]  # the image folder's listing (`select.list_images`)
    progress: bool = True
    manifest: dict[str, Any] = field(default_factory=dict)  # what the stage reports: counts, drops, prompts

    def upstream(self, stage_folder: str, name: str) -> Path:
        return self.build / stage_folder / name

    def drop(self, reason: str, n: int = 1) -> None:
        dropped = self.manifest.setdefault("dropped", {})
        dropped[reason] = dropped.get(reason, 0) + n


def entry_image(entry: dict[str, Any]) -> Image.Image:
    """An image of the listing (`select.list_images`) as RGB, read as scoring reads images: a
    regular file inside the image folder, of bounded size (a `SampleError` otherwise)."""
    path = entry["path"]
    return decode_bytes(read_image_file(path, entry.get("root")), f"image {path}")


def write_jsonl(path: Path, records: Iterable[dict[str, Any]]) -> int:
    """A stage's JSONL output, written atomically (a partial file never replaces a finished one)."""
    return write_jsonl_atomically(path, records, allow_nan=True)


def read_records(path: Path) -> list[dict[str, Any]]:
    return [record for _, record in read_jsonl(path, keep_surrogates=True)] if path.exists() else []


def write_json(path: Path, value: Any) -> None:
    partial = path.with_suffix(path.suffix + ".part")
    partial.write_text(json_text(value, indent=2, default=str), encoding="utf-8")
    partial.replace(path)


def fill(template: str, **values: Any) -> str:
    """A prompt template with `{name}` placeholders filled (str.replace: prompts hold JSON braces)."""
    for name, value in values.items():
        template = template.replace("{" + name + "}", str(value))
    return template


# ---------------------------------------------------------------------------------------
# cached model calls


def vlm_replies(ctx: Context, vlm: Any, asks: Sequence[tuple[str, str]], images: LazyImages,
                max_new_tokens: int) -> list[str]:
    """Greedy replies of a VLM to (image key, prompt) asks, cached by (VLM, image, prompt,
    max_new_tokens). All asks about one image go to the model in one call."""
    keys = [content_key("vlm-reply", model=vlm.fingerprint, image=image_key, prompt=prompt,
                        max_new_tokens=max_new_tokens) for image_key, prompt in asks]

    def compute(order: list[int]) -> list[str]:
        requests = [VLMRequest(image=images[asks[i][0]], prompt=asks[i][1], image_key=asks[i][0]) for i in order]
        with ctx.model_call():
            return list(vlm.generate(requests, max_new_tokens=max_new_tokens))

    return ctx.cached("vlm-reply", keys, compute) if asks else []


def llm_replies(ctx: Context, llm: Any, prompts: Sequence[str], max_new_tokens: int) -> list[str]:
    """Greedy replies of a text LLM, cached by (LLM, prompt, max_new_tokens)."""
    keys = [content_key("llm-answer", model=llm.fingerprint, prompt=p, max_new_tokens=max_new_tokens)
            for p in prompts]

    def compute(order: list[int]) -> list[str]:
        with ctx.model_call():
            return list(llm.generate([prompts[i] for i in order], max_new_tokens=max_new_tokens))

    return ctx.cached("llm-answer", keys, compute) if prompts else []
