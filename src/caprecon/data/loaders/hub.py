"""Tables of Hugging Face datasets read from this machine, never downloaded.

A benchmark published on the Hub (`yuwd/Polaris`, `Ka2ukiMatsuda/Nebula`, ...) reaches a
machine in one of three shapes, all read here with pyarrow:

- a `datasets.save_to_disk` folder (`dataset_dict.json`, one subfolder per split);
- a snapshot of the dataset repository (`data/test-00000-of-00001.parquet`, a split named
  `dci_test.desc` as `data/dci_test.desc-*.parquet`, a config as a subfolder), which is
  also what the Hub cache keeps under `snapshots/<revision>/`;
- the `datasets` library's own cache (`<name>-<split>.arrow`, `<name>-<split>-00000-of-00002.arrow`).

`source` is a folder of one of these shapes, or a repository id (`owner/name`) looked up
in the local Hub cache with `local_files_only=True`. Image columns are not decoded: a
stored image is referred to by the file name it was stored under.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

from caprecon.data.judgments import JudgmentFormatError

_SUFFIXES = (".parquet", ".arrow", ".jsonl", ".json", ".csv")


def looks_like_repo_id(source: str | Path) -> bool:
    """`owner/name` that is not a path on this machine."""
    text = str(source)
    parts = text.split("/")
    return len(parts) == 2 and all(parts) and not text.startswith((".", "~")) and not Path(text).exists()


def resolve(source: str | Path) -> Path:
    """The local folder behind `source`: the folder itself, or the cached snapshot of a repo id."""
    if not looks_like_repo_id(source):
        path = Path(source).expanduser()
        if not path.exists():
            raise JudgmentFormatError(f"benchmark data not found: {path}")
        return path
    try:
        from huggingface_hub import snapshot_download
    except ImportError:  # a dependency of caprecon, so only a broken install lands here
        raise JudgmentFormatError("reading the Hugging Face cache needs huggingface_hub") from None
    try:
        return Path(snapshot_download(repo_id=str(source), repo_type="dataset", local_files_only=True))
    except Exception:  # noqa: BLE001 - any failure means the same thing here: not in the cache
        raise JudgmentFormatError(
            f"{source}: not in the local Hugging Face cache (HF_HOME={os.environ.get('HF_HOME', '~/.cache/huggingface')}); "
            f"fetch it once with `huggingface-cli download --repo-type dataset {source}` or give its folder"
        ) from None


def read_rows(source: str | Path, split: str, *, config: str | None = None) -> tuple[Path, list[dict[str, Any]]]:
    """The rows of `split` (of `config`, when the dataset has several) as plain dicts.

    A column holding stored images (`{"bytes", "path"}`) comes back as its `path` only.
    """
    folder = resolve(source)
    table = _read_table(folder, split, config)
    columns = {}
    for name in table.column_names:
        column = table.column(name)
        if _is_image(column.type):
            column = column.combine_chunks().field("path")
        columns[name] = column.to_pylist()
    n = table.num_rows
    return folder, [{name: values[k] for name, values in columns.items()} for k in range(n)]


def _is_image(kind) -> bool:
    import pyarrow as pa

    return pa.types.is_struct(kind) and {kind.field(i).name for i in range(kind.num_fields)} >= {"bytes", "path"}


def _read_table(folder: Path, split: str, config: str | None):
    import pyarrow as pa

    if folder.is_file():
        return _read_file(folder)
    saved = folder / split if (folder / "dataset_dict.json").is_file() else folder
    if (saved / "state.json").is_file():
        files = [saved / entry["filename"] for entry in _json(saved / "state.json").get("_data_files", [])]
        return pa.concat_tables([_read_file(f) for f in files]) if files else _empty(folder, split)
    files = [f for f in _data_files(folder) if _in_split(f, folder, split)]
    if config is not None:
        files = [f for f in files if config in f.relative_to(folder).parts[:-1]] or files
    if not files:
        return _empty(folder, split)
    return pa.concat_tables([_read_file(f) for f in files], promote_options="default")


def _empty(folder: Path, split: str):
    found = sorted({_split_of(f) for f in _data_files(folder)} - {""})
    raise JudgmentFormatError(
        f"{folder}: no data files for split {split!r}" + (f" (found {', '.join(found)})" if found else "")
    )


def _data_files(folder: Path) -> Iterator[Path]:
    for root, dirs, names in os.walk(folder, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(names):
            if name.endswith(_SUFFIXES) and name not in ("dataset_info.json", "state.json", "dataset_dict.json"):
                yield Path(root) / name


def _base_name(path: Path) -> str:
    name = path.name
    for suffix in _SUFFIXES:
        name = name.removesuffix(suffix)
    return name


def _split_of(path: Path) -> str:
    # data/test-00000-of-00001, data/dci_test.desc-00000-of-00002, nebula-test (datasets cache)
    return _base_name(path).split("-")[0]


def _in_split(path: Path, folder: Path, split: str) -> bool:
    name = _base_name(path)
    parents = path.relative_to(folder).parts[:-1]
    return (
        name == split
        or name.startswith(f"{split}-")
        or name.endswith(f"-{split}")
        or f"-{split}-" in name  # datasets cache: nebula-test-00000-of-00002.arrow
        or (split in parents and len(name.split(".")) == 1 and name.split("-")[0].isdigit())  # default/test/0000.parquet
    )


def _read_file(path: Path):
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.json as pjson
    import pyarrow.parquet as pq

    try:
        if path.suffix == ".parquet":
            return pq.read_table(path)
        if path.suffix == ".arrow":
            with pa.memory_map(str(path)) as source:
                try:
                    return pa.ipc.open_stream(source).read_all()
                except pa.ArrowInvalid:
                    source.seek(0)
                    return pa.ipc.open_file(source).read_all()
        if path.suffix == ".csv":
            return pcsv.read_csv(path)
        return pjson.read_json(path)
    except (pa.ArrowException, OSError) as exc:
        raise JudgmentFormatError(f"{path}: cannot be read as {path.suffix[1:]} ({exc})") from None


def _json(path: Path) -> dict:
    import json

    return json.loads(path.read_text(encoding="utf-8"))
