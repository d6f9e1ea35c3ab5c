"""What a reward call is given, read: a completion's text (a string, or TRL's conversational form),
the picture a row describes, the forms a picture may take, and a call's columns as lists; each
refused with `ConfigError` or `SampleError` saying what to give instead."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from PIL import Image

from caprecon.core.errors import ConfigError
from caprecon.data.samples import SampleError


def completion_text(completion: Any) -> str:
    """A completion's text: a string as it is; in TRL's conversational form (a list of messages),
    the last assistant message's content, whose text parts are joined when it is a list of parts.
    A content of None (a reply of tool calls alone) and a text part of None hold no text; anything
    else that is not text (a number, a mapping) is refused with `ConfigError`."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Mapping):
        completion = [completion]
    if isinstance(completion, Sequence):
        replies = [m for m in completion if isinstance(m, Mapping) and m.get("role", "assistant") == "assistant"]
        if not replies:
            raise ConfigError("a completion in TRL's conversational form needs an assistant message; this one has "
                              f"{len(completion)} message(s) and none from the assistant")
        content = replies[-1].get("content")
        if content is None or isinstance(content, str):
            return content or ""
        if not isinstance(content, Sequence) or isinstance(content, (bytes, bytearray)):
            raise ConfigError(f"the assistant message's content is {kind_of(content)}, not text or a list of parts")
        texts = [part.get("text") for part in content
                 if isinstance(part, Mapping) and part.get("type", "text") == "text"]
        for text in texts:
            if text is not None and not isinstance(text, str):
                raise ConfigError(f"a text part of the assistant message holds {kind_of(text)}, not text")
        return " ".join(text for text in texts if text)
    raise ConfigError(f"a completion must be a string or a list of messages, not {kind_of(completion)}")


def kind_of(value: Any) -> str:
    """`an int`, `a str`: what a value is, for messages."""
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def row_image(image: Any = None, images: Any = None) -> Any:
    """The picture a completion describes: the row's `image`, else the single one of its `images`
    (None when it has none or several: which one the caption describes is not known)."""
    if image is not None:
        return image
    if isinstance(images, (list, tuple)):
        return images[0] if len(images) == 1 else None
    return images


def image_source(image: Any) -> Any:
    """What a `Sample` takes from a dataset cell: a datasets `Image` left undecoded is {bytes, path},
    its path read only where it has no bytes (None). Bytes that are empty are a `SampleError`: no
    picture, and not a cue to open the file the cell names instead."""
    if isinstance(image, Mapping):
        image = image.get("path") if image.get("bytes") is None else image["bytes"]
    if isinstance(image, (bytes, bytearray)) and not image:
        raise SampleError("the image's bytes are empty (no picture)", "empty image")
    return image


#: what a picture may be (`Reward.__call__`): a file, its bytes, a PIL image, or a datasets `Image` cell
PICTURE_FORMS = "a path, the file's bytes, a PIL image or a datasets Image cell ({bytes, path})"


def picture_problem(picture: Any) -> str | None:
    """Why `picture` (one row's) is none of the forms a reward reads (`PICTURE_FORMS`), or None: a
    numpy array or a number would fail deep in the reading, naming no row."""
    if isinstance(picture, Mapping):
        cell = {key: picture.get(key) for key in ("bytes", "path")}
        if not isinstance(cell["bytes"], (bytes, bytearray, type(None))) or \
                not isinstance(cell["path"], (str, Path, type(None))):
            return f"is a mapping whose bytes or path is neither bytes nor a path; give {PICTURE_FORMS}, or None"
        return None
    if picture is None or isinstance(picture, (str, Path, bytes, bytearray, Image.Image)):
        return None
    advice = " (a numpy array: give PIL.Image.fromarray(...) of it)" if hasattr(picture, "__array__") else ""
    return f"is {kind_of(picture)}{advice}; give {PICTURE_FORMS}, or None"


def column_list(what: str, values: Any) -> list[Any]:
    """A column of the call as a list (an iterator is read once); a lone string is refused, since
    it would be read as one caption per character."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise ConfigError(f"{what} must be a list with one entry per completion, not {kind_of(values)}")
    return list(values)
