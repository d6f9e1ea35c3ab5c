"""What a run's digest memo (`digests.sqlite` in its cache folder) holds, read straight from the
file with sqlite3, for tests that check which folder a run's memo went to."""

import sqlite3
from pathlib import Path


def memo_rows(folder: Path) -> dict[str, str]:
    """The memo's digest of each path in `folder`; {} where the folder holds no memo."""
    if not (folder / "digests.sqlite").is_file():
        return {}
    db = sqlite3.connect(folder / "digests.sqlite")
    try:
        return dict(db.execute("SELECT path, digest FROM digests"))
    finally:
        db.close()
