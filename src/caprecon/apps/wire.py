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
- `{"path": "a/b.jpg"}`: a file under the root the server was started with (`--image-root`).

The reward of a row is the sum of its parts (`Reward.__call__` sums them, in the client as in
process); a part is null where the row does not apply, and `errors` says why, by row.
"""

from __future__ import annotations

import base64
import binascii
import io
from pathlib import Path
from typing import Any, Mapping

from PIL import Image

from caprecon.apps.reward import row_image
from caprecon.data.images import decode_image

ENCODED, PIXELS, PATH = "encoded", "pixels", "path"
NAME = "name"  # beside ENCODED: the file's name, which names the picture


def encode_cell(picture: Any, *, send_paths: bool = False) -> dict[str, str] | None:
    """The wire cell of a row's picture (see the module's docstring). A path is read and sent as
    its bytes, unless `send_paths` (the server then opens it under its own image root)."""
    name = None
    if isinstance(picture, Mapping):  # a datasets Image left undecoded: {bytes, path}
        name = picture.get("path") if picture.get("bytes") else None
        picture = picture.get("bytes") or picture.get("path")
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
        return {ENCODED: base64.b64encode(Path(picture).read_bytes()).decode("ascii"), NAME: Path(picture).name}
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
    if kind == PATH:
        return value
    try:
        data = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise CellError(f"{kind}: not base64 ({exc})") from None
    if len(data) > max_bytes:
        raise CellError(f"image of {len(data)} bytes is over the server's limit of {max_bytes} (--max-image-bytes)")
    if kind == ENCODED:
        return {"bytes": data, "path": name} if name else data  # as a dataset's cell: `Reward` names it
    try:
        with Image.open(io.BytesIO(data)) as opened:
            opened.load()
            return opened.copy()
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise CellError(f"pixels: not a readable PNG ({exc})") from None
