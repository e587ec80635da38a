"""Plots as self-contained inline SVG: no plotting library, no script, nothing fetched, so the HTML report
works offline and renders the same everywhere. Four kinds: line charts (latency-throughput curves, CDFs),
bars with interval whiskers, and a horizontal timeline of set-up phases."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from html import escape

PALETTE = [
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
]
DASHES = ["", "6,3", "2,2", "8,3,2,3"]
PHASE_COLORS = {
    "process_start": "#c7c7c7",
    "tokenizer": "#aec7e8",
    "weights": "#1f77b4",
    "kv_cache": "#2ca02c",
    "compile": "#9467bd",
    "cuda_graphs": "#ff7f0e",
    "init_engine": "#8c564b",
    "server_up": "#dbdb8d",
    "first_health": "#17becf",
}
W, H = 640, 340
M_LEFT, M_RIGHT, M_TOP, M_BOTTOM = 64, 16, 34, 46


@dataclass
class Series:
    label: str
    xs: Sequence[float]
    ys: Sequence[float]
    color: str
    dash: str = ""
    markers: bool = True
    point_labels: Sequence[str] = ()
    marks: Mapping[str, str] = field(default_factory=dict)  # point label -> a ringed note (knee, saturated)


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About `n` round tick values covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0, 1.0]
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    span = max(n, 1) * _label_resolution(max(abs(lo), abs(hi)))
    if hi - lo < span:  # narrower than the labels can tell apart (values equal but for float noise)
        mid = (lo + hi) / 2
        lo, hi = mid - span / 2, mid + span / 2
    raw = (hi - lo) / max(n, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks = []
    t = start
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 12))
        t += step
    if ticks[-1] < hi:
        ticks.append(ticks[-1] + step)
    return ticks


def _label_resolution(magnitude: float) -> float:
    """The smallest step between two values that `fmt_tick` shows differently, at this magnitude."""
    if magnitude >= 10:
        return 1.0
    if magnitude >= 1:
        return 0.1
    if magnitude == 0:
        return 1.0
    return 10.0 ** (math.floor(math.log10(magnitude)) - 1)


def fmt_tick(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.0f}"
    return f"{v:.2g}" if abs(v) < 1 else f"{v:.1f}".rstrip("0").rstrip(".")


def _svg_open(title: str, height: int) -> list[str]:
    """The opening of every chart: the svg element, a white background and the title."""
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" viewBox="0 0 {W} {height}" '
        f'role="img" aria-label="{escape(title)}" font-family="sans-serif" font-size="11">',
        f'<rect width="{W}" height="{height}" fill="#ffffff"/>',
        f'<text x="{W / 2}" y="18" text-anchor="middle" font-size="13" font-weight="bold">'
        f"{escape(title)}</text>",
    ]


def _frame(
    title: str,
    xlabel: str,
    ylabel: str,
    xt: list[float],
    yt: list[float],
    sx: Callable[[float], float],
    sy: Callable[[float], float],
    height: int = H,
) -> list[str]:
    out = _svg_open(title, height)
    x0, x1, y0, y1 = M_LEFT, W - M_RIGHT, height - M_BOTTOM, M_TOP
    for t in yt:
        y = sy(t)
        out.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x1}" y2="{y:.1f}" stroke="#e5e5e5"/>')
        out.append(f'<text x="{x0 - 5}" y="{y + 4:.1f}" text-anchor="end">{fmt_tick(t)}</text>')
    for t in xt:
        x = sx(t)
        out.append(f'<line x1="{x:.1f}" y1="{y0}" x2="{x:.1f}" y2="{y0 + 4}" stroke="#333"/>')
        out.append(f'<text x="{x:.1f}" y="{y0 + 16}" text-anchor="middle">{fmt_tick(t)}</text>')
    out.append(f'<line x1="{x0}" y1="{y0}" x2="{x1}" y2="{y0}" stroke="#333"/>')
    out.append(f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}" stroke="#333"/>')
    out.append(f'<text x="{(x0 + x1) / 2}" y="{height - 8}" text-anchor="middle">{escape(xlabel)}</text>')
    out.append(
        f'<text x="14" y="{(y0 + y1) / 2}" text-anchor="middle" '
        f'transform="rotate(-90 14 {(y0 + y1) / 2})">{escape(ylabel)}</text>'
    )
    return out


def _legend(items: list[tuple[str, str, str]], x: float, y: float) -> list[str]:
    out = []
    for i, (label, color, dash) in enumerate(items):
        yy = y + i * 14
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        out.append(
            f'<line x1="{x}" y1="{yy}" x2="{x + 18}" y2="{yy}" stroke="{color}" stroke-width="2"{dash_attr}/>'
        )
        out.append(f'<text x="{x + 22}" y="{yy + 4}">{escape(label)}</text>')
    return out


def line_chart(
    series: list[Series],
    title: str,
    xlabel: str,
    ylabel: str,
    x_from_zero: bool = True,
    y_from_zero: bool = True,
) -> str:
    pts = [
        (x, y)
        for s in series
        for x, y in zip(s.xs, s.ys, strict=True)
        if math.isfinite(x) and math.isfinite(y)
    ]
    if not pts:
        return empty_chart(title, "no data")
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    xt = nice_ticks(0.0 if x_from_zero else min(xs), max(xs))
    yt = nice_ticks(0.0 if y_from_zero else min(ys), max(ys))
    x0, x1, y0, y1 = M_LEFT, W - M_RIGHT, H - M_BOTTOM, M_TOP

    def sx(v: float) -> float:
        return x0 + (v - xt[0]) / (xt[-1] - xt[0]) * (x1 - x0)

    def sy(v: float) -> float:
        return y0 - (v - yt[0]) / (yt[-1] - yt[0]) * (y0 - y1)

    out = _frame(title, xlabel, ylabel, xt, yt, sx, sy)
    for s in series:
        good = [
            (x, y, lab)
            for x, y, lab in zip(s.xs, s.ys, list(s.point_labels) or [""] * len(s.xs), strict=True)
            if math.isfinite(x) and math.isfinite(y)
        ]
        if not good:
            continue
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y, _ in good)
        dash = f' stroke-dasharray="{s.dash}"' if s.dash else ""
        out.append(
            f'<polyline points="{path}" fill="none" stroke="{s.color}" stroke-width="2"{dash}>'
            f"<title>{escape(s.label)}</title></polyline>"
        )
        if s.markers:
            for x, y, lab in good:
                out.append(
                    f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3.5" fill="{s.color}">'
                    f"<title>{escape(s.label)} {escape(lab)}: ({x:.4g}, {y:.4g})</title></circle>"
                )
                if lab:
                    out.append(
                        f'<text x="{sx(x) + 5:.1f}" y="{sy(y) - 5:.1f}" fill="{s.color}">{escape(lab)}</text>'
                    )
                if lab in s.marks:
                    out.append(
                        f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="8" fill="none" stroke="{s.color}">'
                        f"<title>{escape(s.marks[lab])}</title></circle>"
                        f'<text x="{sx(x) + 5:.1f}" y="{sy(y) + 16:.1f}" fill="{s.color}" font-weight="bold">'
                        f"{escape(s.marks[lab])}</text>"
                    )
    out += _legend([(s.label, s.color, s.dash) for s in series][:12], x0 + 10, y1 + 8)
    out.append("</svg>")
    return "\n".join(out)


def cdf_series(values: Sequence[float], label: str, color: str, dash: str = "") -> Series:
    v = sorted(x for x in values if math.isfinite(x))
    n = len(v)
    if n > 400:  # thin to about 400 points, keeping the extremes
        idx = sorted({round(i * (n - 1) / 399) for i in range(400)})
        v, ys = [v[i] for i in idx], [(i + 1) / n for i in idx]
    else:
        ys = [(i + 1) / n for i in range(n)]
    if v:  # the empirical CDF rises from 0 at the smallest value
        v, ys = [v[0], *v], [0.0, *ys]
    return Series(f"{label} (n={n})", v, ys, color, dash, markers=False)


def bar_chart(
    groups: list[str],
    bars: list[tuple[str, str, list[float], list[float], list[float]]],
    title: str,
    ylabel: str,
) -> str:
    """`bars`: (label, color, values per group, low per group, high per group); whiskers show [low, high]."""
    vals = [v for _, _, vs, los, his in bars for v in (*vs, *his) if math.isfinite(v)]
    if not vals:
        return empty_chart(title, "no data")
    yt = nice_ticks(0.0, max(vals))
    x0, x1, y0, y1 = M_LEFT, W - M_RIGHT, H - M_BOTTOM, M_TOP

    def sy(v: float) -> float:
        return y0 - (v - yt[0]) / (yt[-1] - yt[0]) * (y0 - y1)

    out = _frame(title, "", ylabel, [], yt, lambda v: v, sy)
    slot = (x1 - x0) / max(len(groups), 1)
    width = slot * 0.8 / max(len(bars), 1)
    for g, name in enumerate(groups):
        gx = x0 + g * slot + slot * 0.1
        out.append(
            f'<text x="{x0 + (g + 0.5) * slot:.1f}" y="{y0 + 16}" text-anchor="middle">{escape(name)}</text>'
        )
        for b, (label, color, vs, los, his) in enumerate(bars):
            v = vs[g]
            if not math.isfinite(v):
                continue
            bx = gx + b * width
            out.append(
                f'<rect x="{bx:.1f}" y="{sy(v):.1f}" width="{width * 0.9:.1f}" height="{y0 - sy(v):.1f}" '
                f'fill="{color}"><title>{escape(label)} {escape(name)}: {v:.4g} '
                f"[{los[g]:.4g}, {his[g]:.4g}]</title></rect>"
            )
            if math.isfinite(los[g]) and math.isfinite(his[g]):
                cx = bx + width * 0.45
                out.append(
                    f'<line x1="{cx:.1f}" y1="{sy(los[g]):.1f}" x2="{cx:.1f}" y2="{sy(his[g]):.1f}" '
                    f'stroke="#000" stroke-width="1.5"/>'
                )
                for yv in (los[g], his[g]):
                    out.append(
                        f'<line x1="{cx - 4:.1f}" y1="{sy(yv):.1f}" x2="{cx + 4:.1f}" y2="{sy(yv):.1f}" '
                        f'stroke="#000" stroke-width="1.5"/>'
                    )
    out += _legend([(label, color, "") for label, color, *_ in bars], x0 + 10, y1 + 8)
    out.append("</svg>")
    return "\n".join(out)


def timeline(rows: list[tuple[str, list[tuple[str, float, float]], float | None]], title: str) -> str:
    """`rows`: (label, [(phase, start_s, end_s)], ready_s); one horizontal bar per row."""
    ends = [e for _, phases, ready in rows for e in ([p[2] for p in phases] + ([ready] if ready else []))]
    if not ends:
        return empty_chart(title, "no set-up phases recorded (running endpoints)")
    height = M_TOP + M_BOTTOM + 30 * len(rows) + 14 * 3
    xt = nice_ticks(0.0, max(ends))
    left = 150
    x1 = W - M_RIGHT

    def sx(v: float) -> float:
        return left + v / xt[-1] * (x1 - left)

    out = _svg_open(title, height)
    base = M_TOP + 30 * len(rows)
    for t in xt:
        out.append(f'<line x1="{sx(t):.1f}" y1="{M_TOP}" x2="{sx(t):.1f}" y2="{base}" stroke="#e5e5e5"/>')
        out.append(f'<text x="{sx(t):.1f}" y="{base + 14}" text-anchor="middle">{fmt_tick(t)}</text>')
    out.append(f'<text x="{(left + x1) / 2}" y="{base + 30}" text-anchor="middle">seconds after spawn</text>')
    seen: dict[str, str] = {}
    for i, (label, phases, ready) in enumerate(rows):
        y = M_TOP + 30 * i + 6
        out.append(f'<text x="{left - 6}" y="{y + 13}" text-anchor="end">{escape(label)}</text>')
        for k, (name, start, end) in enumerate(phases):
            color = PHASE_COLORS.get(name, PALETTE[k % len(PALETTE)])
            seen.setdefault(name, color)
            out.append(
                f'<rect x="{sx(start):.1f}" y="{y}" width="{max(sx(end) - sx(start), 1):.1f}" height="18" '
                f'fill="{color}"><title>{escape(name)}: {end - start:.2f} s (ends {end:.2f} s)</title></rect>'
            )
        if ready:
            out.append(
                f'<line x1="{sx(ready):.1f}" y1="{y - 3}" x2="{sx(ready):.1f}" y2="{y + 21}" '
                f'stroke="#d62728" '
                f'stroke-width="2"><title>healthy at {ready:.2f} s</title></line>'
            )
    lx = left
    for j, (name, color) in enumerate([*seen.items(), ("healthy (measured)", "#d62728")]):
        x = lx + (j % 4) * 120
        y = base + 40 + (j // 4) * 14
        out.append(f'<rect x="{x}" y="{y - 8}" width="10" height="10" fill="{color}"/>')
        out.append(f'<text x="{x + 14}" y="{y + 1}">{escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def empty_chart(title: str, message: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="80" viewBox="0 0 {W} 80" role="img" '
        f'aria-label="{escape(title)}" font-family="sans-serif" font-size="12"><rect width="{W}" height="80" '
        f'fill="#fafafa"/><text x="{W / 2}" y="30" text-anchor="middle" font-weight="bold">'
        f"{escape(title)}</text>"
        f'<text x="{W / 2}" y="55" text-anchor="middle">{escape(message)}</text></svg>'
    )
