"""What travels between `caprecon.RemoteReward` (or another caller) and `caprecon serve`.

    POST /reward   {"captions": [text, ...], "images": [cell, ...]}
               ->  {"parts": {part: [value or null, ...]}, "errors": {"row": "what is wrong"}}

One cell per row, the picture the caption describes:

- `null`: the row has no single picture (the reward is null there, as `Reward` gives);
- `{"encoded": BASE64}`: an image file's bytes as they are (a path the client read, a dataset's
  undecoded `{"bytes": ...}`); the server keys them by those bytes, as `Reward` keys a file; with
  `"name"` (the file's name: a path the client read, a dataset cell's `path`) the picture is named
  by it, as `Reward` and `score` name a file (its reconstruction's seed derives from the name);
- `{"pixels": BASE64}`: a picture the client held in memory, upright and in RGB (`decode_image`),
  sent as a lossless PNG; the server hands the decoded pixels to `Reward`, which keys them as it
  keys a picture in memory, so the seed and the reward are those of the in-process `Reward`;
- `{"path": "a/b.jpg"}`: a file under the root the server was started with (`--image-root`), read
  there and named by its path, as `Reward` names a file (the same seed as in process).

A cell the server cannot take is an error of its row, said in the answer's `errors`: not one of these
forms, bytes that are not base64 or are none at all, more bytes than the server's limit, a picture PIL
does not recognise or of more pixels than PIL's decompression-bomb limit (`PIL.Image.MAX_IMAGE_PIXELS`:
its header says so before any pixel is decoded), a path or name that holds a NUL or is not valid Unicode.

The reward of a row is the sum of its parts (`Reward.__call__` sums them, in the client as in
process); a part is null where the row does not apply, and `errors` says why, by row.
"""

from __future__ import annotations

import base64
import binascii
import io
import warnings
from pathlib import Path
from typing import Any, Mapping

from PIL import Image, UnidentifiedImageError

from caprecon.apps.reward.inputs import row_image
from caprecon.core.records import unicode_problem
from caprecon.data.images import decode_image, read_image_file

ENCODED, PIXELS, PATH = "encoded", "pixels", "path"
NAME = "name"  # beside ENCODED: the file's name, which names the picture
#: an error answer's `kind` where sending the request again would fail again: the client raises at once
CONTRACT_KIND, CONFIG_KIND = "metric contract", "config"


def encode_cell(picture: Any, *, send_paths: bool = False) -> dict[str, str] | None:
    """The wire cell of a row's picture (see the module's docstring). A path is read and sent as
    its bytes, unless `send_paths` (the server then opens it under its own image root)."""
    name = None
    if isinstance(picture, Mapping):  # a datasets Image left undecoded: {bytes, path}
        name = picture.get("path") if picture.get("bytes") else None
        # its path only where it has no bytes: empty bytes travel as they are, and the server refuses them
        picture = picture.get("path") if picture.get("bytes") is None else picture["bytes"]
    if picture is None:
        return None
    if isinstance(picture, Image.Image):
        buffer = io.BytesIO()
        decode_image(picture, "the image given").save(buffer, format="PNG", compress_level=1)
        return {PIXELS: base64.b64encode(buffer.getvalue()).decode("ascii")}
    if isinstance(picture, (bytes, bytearray)):
        return {ENCODED: base64.b64encode(bytes(picture)).decode("ascii"), **({NAME: Path(name).name} if name else {})}
    if isinstance(picture, (str, Path)):
        if send_paths:
            return {PATH: str(picture)}
        # read as `Reward` reads a file (a regular file, at most MAX_IMAGE_BYTES): a FIFO or /dev/zero
        # named by a dataset would hang or fill the trainer; the problem is a `SampleError` of the row
        data = read_image_file(picture)
        return {ENCODED: base64.b64encode(data).decode("ascii"), NAME: Path(picture).name}
    raise TypeError(f"an image must be a PIL image, bytes, a path or a datasets cell, not {type(picture).__name__}")


def trl_pictures(images: Any = None, image: Any = None, count: int = 0) -> list[Any]:
    """The picture of each of `count` completions from TRL's `image` or `images` column, as `Reward` reads them."""
    if image is not None:
        return [row_image(p) for p in image]
    if images is not None:
        return [row_image(images=p) for p in images]
    return [None] * count


class CellError(ValueError):
    """A row's picture cannot be read from its cell; the message says why."""


def decode_cell(cell: Any, *, max_bytes: int) -> Any:
    """What `Reward` takes for a wire cell: None, the file's bytes, a PIL image, or the path as given
    (the caller confines it to its root). Raises `CellError` for a cell that is not one of the forms
    or holds more than `max_bytes`."""
    if cell is None:
        return None
    kinds = [k for k in cell if k != NAME] if isinstance(cell, Mapping) else []
    if len(kinds) != 1 or kinds[0] not in (ENCODED, PIXELS, PATH) or (NAME in cell and kinds[0] != ENCODED):
        raise CellError(f"an image must be null, {{\"{ENCODED}\": ...}}, {{\"{PIXELS}\": ...}} or {{\"{PATH}\": ...}}")
    kind = kinds[0]
    value, name = cell[kind], cell.get(NAME)
    if not isinstance(value, str):
        raise CellError(f"{kind}: expected text, not {type(value).__name__}")
    if name is not None and not isinstance(name, str):
        raise CellError(f"{NAME}: expected text, not {type(name).__name__}")
    for field, text in ((kind, value if kind == PATH else None), (NAME, name)):
        # the file system takes neither; the server's calls would raise instead of naming the row
        if text is not None and (problem := "holds a NUL character" if "\x00" in text else unicode_problem(text)):
            raise CellError(f"{field}: {problem}")
    if kind == PATH:
        return value
    try:
        data = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise CellError(f"{kind}: not base64 ({exc})") from None
    if not data:  # `Reward` would take the cell's name for a path on the server's disk
        raise CellError(f"{kind}: no bytes (an empty image)")
    if len(data) > max_bytes:
        raise CellError(f"image of {len(data)} bytes is over the server's limit of {max_bytes} (--max-image-bytes)")
    pixels_within_limit(kind, data)
    if kind == ENCODED:
        return {"bytes": data, "path": name} if name else data  # as a dataset's cell: `Reward` names it
    try:
        with Image.open(io.BytesIO(data)) as opened:
            opened.load()
            return opened.copy()
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise CellError(f"pixels: not a readable PNG ({exc})") from None


def pixels_within_limit(kind: str, data: bytes) -> None:
    """Raise `CellError` when `data` is no picture PIL recognises, or when its header gives it more
    pixels than `PIL.Image.MAX_IMAGE_PIXELS` (a few KB of PNG can declare gigabytes of pixels: PIL
    only warns up to twice its limit, and a replica decodes a batch of them at once). Only the header
    is read: the pixels are decoded where they are used."""
    limit = Image.MAX_IMAGE_PIXELS
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # refused below, not warned
            with Image.open(io.BytesIO(data)) as opened:
                width, height = opened.size
    except Image.DecompressionBombError as exc:
        raise CellError(f"{kind}: {exc}") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise CellError(f"{kind}: not in any image format PIL reads ({type(exc).__name__})") from None
    if limit and width * height > limit:
        raise CellError(f"{kind}: image of {width}x{height} pixels is over the limit of {limit} pixels "
                        "(PIL.Image.MAX_IMAGE_PIXELS, the decompression-bomb guard)")


def token_problem(token: str) -> str | None:
    """What keeps a bearer token from travelling in an HTTP header (`Authorization: Bearer TOKEN`), or
    None: it must be visible ASCII without spaces. The token itself is never quoted: it is a secret."""
    for at, char in enumerate(token):
        if not "!" <= char <= "~":
            return (f"holds a space, a control character (a newline?) or a non-ASCII character at character {at}, "
                    "which an HTTP header cannot carry")
    return None
