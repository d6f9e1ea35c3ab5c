"""`format_table`: the one plain-text table layout of every command."""

from __future__ import annotations

from typing import Any, Sequence


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
    return "" if value is None else str(value)
