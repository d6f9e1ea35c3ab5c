"""`format_table`: the one plain-text table layout of every command, and `terminal_safe`, how
text from a dataset (a caption, an id) is shown on a terminal."""

from __future__ import annotations

import re
from typing import Any, Sequence

# what a terminal acts on instead of showing: C0 and C1 controls (ESC starts colour, cursor and
# title sequences; CR and BS overwrite what was printed), DEL, line and paragraph separators,
# and the bidirectional overrides and isolates that reorder what follows them; and a lone
# surrogate, which stdout cannot encode (printing it would stop the command)
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def terminal_safe(text: str) -> str:
    """`text` with every character a terminal would act on written as its escape (ESC as
    `\\x1b`, CR as `\\r`, U+202E as `\\u202e`), so a caption cannot forge what is printed."""
    return _UNSAFE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def number(value: Any) -> str:
    """A table cell of a score: a float to 4 decimals (in powers of ten from 10^6 on, so 1e308 is
    not 309 digits wide), a missing value blank, anything else as it is."""
    if isinstance(value, float):
        return f"{value:.4e}" if abs(value) >= 1e6 else f"{value:.4f}"
    return "" if value is None else str(value)


def format_table(rows: Sequence[Sequence[Any]], *, right: Sequence[int] = (), rule: bool = False) -> str:
    """Rows of cells (the first row is the header) as aligned plain text: columns two spaces
    apart, left-aligned except the column indices in `right`, trailing spaces dropped;
    `rule` puts a line of dashes under the header."""
    if not rows:
        return ""
    cells = [[_cell(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells if i < len(row)) for i in range(max(map(len, cells)))]

    def line(row: list[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                         for i, (c, w) in enumerate(zip(row, widths))).rstrip()

    out = [line(cells[0])]
    if rule:
        out.append("  ".join("-" * w for w in widths))
    out += [line(row) for row in cells[1:]]
    return "\n".join(out)


def _cell(value: Any) -> str:
    return "" if value is None else terminal_safe(str(value))
