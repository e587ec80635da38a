"""What the report is made of: blocks (headings, paragraphs, lists, tables, SVG plots), which both report.md
and report.html render, and the cell formats every section uses."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

Block = tuple[str, Any]  # (kind, content): h1, h2, h3, p, ul, table, svg


def number(value: object, digits: int = 1) -> str:
    """A table cell: a float with `digits` decimals and thousands separators, "–" for None or a non-finite
    float, anything else as written."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def with_interval(row: pd.Series, col: str) -> str:
    v, lo, hi = row.get(col), row.get(col + "_lo"), row.get(col + "_hi")
    if v is None or not np.isfinite(v):
        return "–"
    if lo is None or hi is None or np.isnan(lo) or np.isnan(hi):
        return f"{v:,.1f}"
    if not (np.isfinite(lo) or np.isfinite(hi)):
        return f"{v:,.1f} [unbounded]"  # too few values to bound this percentile either way
    low = f"{lo:,.1f}" if np.isfinite(lo) else "unbounded"
    return f"{v:,.1f} [{low}–{hi:,.1f}]" if np.isfinite(hi) else f"{v:,.1f} [{low}–unbounded]"
