"""Small inline SVG charts: a scatter of metric vs human score, and a line chart.

Thousands of points go into one `<path>` of tiny squares, which a browser draws far
faster than thousands of `<circle>` elements. Every label is escaped here.
"""

from __future__ import annotations

import math
from typing import Sequence

from markupsafe import Markup, escape

WIDTH, HEIGHT = 320, 240
LEFT, RIGHT, TOP, BOTTOM = 48, 12, 12, 40
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")


def _range(values: Sequence[float]) -> tuple[float, float]:
    low, high = min(values), max(values)
    if high == low:
        low, high = low - 0.5, high + 0.5
    pad = (high - low) * 0.04
    return low - pad, high + pad


def _ticks(low: float, high: float, count: int = 4) -> list[float]:
    step = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(step)) if step > 0 else 1
    step = min((m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= step), default=step)
    first = math.ceil(low / step) * step
    return [first + k * step for k in range(int((high - first) / step) + 1)]


def _fmt(value: float) -> str:
    return f"{value:.3g}"


class _Frame:
    """Axes, grid and labels for data ranges `xr`, `yr`; `x()` and `y()` map data to pixels."""

    def __init__(self, xr: tuple[float, float], yr: tuple[float, float]):
        self.xr, self.yr = xr, yr
        self.width, self.height = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(self, value: float) -> float:
        return LEFT + (value - self.xr[0]) / (self.xr[1] - self.xr[0]) * self.width

    def y(self, value: float) -> float:
        return TOP + self.height - (value - self.yr[0]) / (self.yr[1] - self.yr[0]) * self.height

    def svg(self, body: str, *, xlabel: str, ylabel: str, title: str) -> Markup:
        bottom, middle = TOP + self.height, TOP + self.height / 2
        parts = [f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" '
                 f'aria-label="{escape(title)}"><title>{escape(title)}</title>',
                 f'<rect x="{LEFT}" y="{TOP}" width="{self.width}" height="{self.height}" class="plot"/>']
        for tick in _ticks(*self.xr):
            x = self.x(tick)
            parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{bottom}" class="grid"/>'
                         f'<text x="{x:.1f}" y="{bottom + 14}" class="tick" text-anchor="middle">{_fmt(tick)}</text>')
        for tick in _ticks(*self.yr):
            y = self.y(tick)
            parts.append(f'<line x1="{LEFT}" x2="{LEFT + self.width}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
                         f'<text x="{LEFT - 4}" y="{y + 3:.1f}" class="tick" text-anchor="end">{_fmt(tick)}</text>')
        parts.append(f'<text x="{LEFT + self.width / 2}" y="{HEIGHT - 6}" class="axis" text-anchor="middle">'
                     f'{escape(xlabel)}</text>')
        parts.append(f'<text x="12" y="{middle}" class="axis" text-anchor="middle" '
                     f'transform="rotate(-90 12 {middle})">{escape(ylabel)}</text>')
        parts.append(body)
        parts.append("</svg>")
        return Markup("".join(parts))


def scatter(xs: Sequence[float], ys: Sequence[float], *, xlabel: str, ylabel: str, title: str) -> Markup:
    """Points (x, y) as one path of 3-px squares; pairs where either is missing are skipped."""
    pairs = [(x, y) for x, y in zip(xs, ys) if x is not None and y is not None and math.isfinite(x)
             and math.isfinite(y)]
    if not pairs:
        return Markup("")
    frame = _Frame(_range([p[0] for p in pairs]), _range([p[1] for p in pairs]))
    d = "".join(f"M{frame.x(x) - 1.5:.1f} {frame.y(y) - 1.5:.1f}h3v3h-3z" for x, y in pairs)
    return frame.svg(f'<path d="{d}" class="points" data-points="{len(pairs)}"/>', xlabel=xlabel, ylabel=ylabel,
                     title=title)


def lines(x: Sequence[float], series: dict[str, Sequence[float | None]], *, xlabel: str, ylabel: str,
          title: str) -> Markup:
    """One polyline per series over a shared x, with a legend."""
    values = [v for ys in series.values() for v in ys if v is not None and math.isfinite(v)]
    if not values or not x:
        return Markup("")
    frame = _Frame(_range(list(x)), _range(values))
    body = []
    for k, (name, ys) in enumerate(series.items()):
        colour = PALETTE[k % len(PALETTE)]
        points = [(frame.x(xv), frame.y(yv)) for xv, yv in zip(x, ys) if yv is not None and math.isfinite(yv)]
        path = " ".join(f"{px:.1f},{py:.1f}" for px, py in points)
        body.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="1.8"/>')
        body.extend(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="2.5" fill="{colour}"/>' for px, py in points)
        body.append(f'<text x="{LEFT + 6}" y="{TOP + 14 + 13 * k}" class="legend" fill="{colour}">'
                    f'{escape(name)}</text>')
    return frame.svg("".join(body), xlabel=xlabel, ylabel=ylabel, title=title)
