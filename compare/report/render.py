"""The report's blocks rendered: Markdown (report.md), which leaves the plots out and points to the HTML, and
a self-contained HTML page (report.html) with the plots inline."""

from __future__ import annotations

import html
import re

from compare.report.blocks import Block
from compare.report.charts import POWER_TITLE


def to_markdown(blocks: list[Block]) -> str:
    out: list[str] = []
    svg_noted = False
    for kind, content in blocks:
        if kind == "h1":
            out.append(f"# {content}\n")
        elif kind == "h2":
            out.append(f"## {content}\n")
        elif kind == "p":
            out.append(f"{content}\n")
        elif kind == "ul":
            out.append("\n".join(f"- {item}" for item in content) + "\n")
        elif kind == "table":
            header, rows = content
            lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
            out.append("\n".join(lines) + "\n")
        elif kind == "svg" and not svg_noted:
            power = any(k == "svg" and POWER_TITLE in c for k, c in blocks)
            out.append(
                "The plots (latency against throughput, TTFT and TPOT CDFs, bars with intervals, set-up "
                f"timeline{', GPU power over time' if power else ''}) are in report.html.\n"
            )
            svg_noted = True
    return "\n".join(out)


_BOLD = re.compile(r"\*\*(.+?)\*\*")


_CODE = re.compile(r"`([^`]+)`")


def _inline(text: str) -> str:
    text = html.escape(str(text))
    text = _BOLD.sub(r"<strong>\1</strong>", text)
    return _CODE.sub(r"<code>\1</code>", text)


# Plots: one column, two from 1280 px; each svg scales to its column (they all have a viewBox). Tables
# scroll sideways inside their own box rather than widening the page.
CSS = """
body { font-family: -apple-system, "Segoe UI", Roboto, sans-serif; margin: 2em auto; max-width: 1800px;
       color: #222; line-height: 1.45; padding: 0 1em; overflow-wrap: anywhere; }
.scroll { overflow-x: auto; max-width: 100%; margin: 0.5em 0 1em; }
table { border-collapse: collapse; font-size: 12px; overflow-wrap: normal; }
th, td { border: 1px solid #ccc; padding: 3px 6px; text-align: right; }
th { background: #f3f3f3; } td:first-child, th:first-child { text-align: left; }
code { background: #f4f4f4; padding: 0 3px; }
.plots { display: grid; grid-template-columns: minmax(0, 1fr); gap: 12px; }
@media (min-width: 1280px) { .plots { grid-template-columns: repeat(2, minmax(0, 1fr)); } }
.plots svg { border: 1px solid #ddd; width: 100%; height: auto; box-sizing: border-box; }
"""


def to_html(blocks: list[Block], title: str) -> str:
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>llm-compare report {html.escape(title)}</title>",
        f"<style>{CSS}</style></head><body>",
    ]
    in_plots = False
    for kind, content in blocks:
        if kind == "svg":
            if not in_plots:
                out.append('<div class="plots">')
                in_plots = True
            out.append(content)
            continue
        if in_plots:
            out.append("</div>")
            in_plots = False
        if kind in ("h1", "h2"):
            out.append(f"<{kind}>{_inline(content)}</{kind}>")
        elif kind == "p":
            out.append(f"<p>{_inline(content)}</p>")
        elif kind == "ul":
            out.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in content) + "</ul>")
        elif kind == "table":
            header, rows = content
            out.append(
                '<div class="scroll"><table><thead><tr>'
                + "".join(f"<th>{_inline(h)}</th>" for h in header)
                + "</tr></thead><tbody>"
            )
            out += ["<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in row) + "</tr>" for row in rows]
            out.append("</tbody></table></div>")
    if in_plots:
        out.append("</div>")
    out.append("</body></html>")
    return "\n".join(out)
