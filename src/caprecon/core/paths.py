"""Where caprecon keeps things on disk by default."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    """`$CAPRECON_CACHE`, else `$XDG_CACHE_HOME/caprecon`, else `~/.cache/caprecon`."""
    if os.environ.get("CAPRECON_CACHE"):
        return Path(os.environ["CAPRECON_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "caprecon"


def _opened_for_writing(path: str | Path) -> int:
    """A descriptor of `path` opened for writing, the file made or emptied (as `open(path, "wb")` makes
    it), its folder made only when the open finds it missing: making or checking it first costs
    system calls on every file, on the threads that write a run's pictures. A symbolic link at `path`
    is refused (`OSError`, ELOOP), not written through: the store's partial files have names anyone
    sharing a cache folder can predict, and a link planted there would have a run empty and overwrite
    the file it points to. The flag costs nothing: the open is the same one system call."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
    try:
        return os.open(path, flags, 0o666)
    except FileNotFoundError:
        make_folder(os.path.dirname(path))
        return os.open(path, flags, 0o666)


def make_folder(folder: str | Path) -> None:
    """`folder` made, with its parents when they are missing: one `mkdir` when its parent is there,
    where `os.makedirs` looks at the parent first (a system call more for each folder a run's
    pictures and thumbnails make)."""
    try:
        os.mkdir(folder)
    except FileExistsError:
        pass
    except FileNotFoundError:
        os.makedirs(folder, exist_ok=True)


def write_file(path: str | Path, data: bytes) -> None:
    """`data` written to a new file at `path` (one emptied if it is there), its folder made when missing.
    Through a descriptor: a file object costs three system calls more a file (an fstat, a seek, a
    terminal check), each of which lets the writing thread take the interpreter from the models'."""
    fd = _opened_for_writing(path)
    try:
        view = memoryview(data)
        while view:  # a write may take less than it is given
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def path_problem(path: str | Path) -> str | None:
    """What is wrong with a path a command reads, in the words of `--input: not found: x.jsonl`: not
    there, empty, or neither a file nor a folder; None when it can be read."""
    import stat

    if not str(path).strip():
        return f"empty path {str(path)!r}; give a file or folder"
    if not Path(path).exists():
        return f"not found: {path}"
    mode = Path(path).stat().st_mode
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
        return f"not a file or folder: {path} is {kind}"
    return None


def file_problem(path: str | Path) -> str | None:
    """`path_problem` for a path that must be one file (a suite file, a captions file, an
    expected-values table): a folder is `not a file: x`."""
    problem = path_problem(path)
    if problem is None and Path(path).is_dir():
        return f"not a file: {path}"
    return problem
