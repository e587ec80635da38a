"""`compare diff --out FILE`: the comparison of two runs (`compare.analysis.diff.diff_runs`) as Markdown."""

from __future__ import annotations

import numpy as np
import pandas as pd


def to_markdown(table: pd.DataFrame, name_a: str, name_b: str) -> str:
    lines = [
        f"# llm-compare diff: {name_a} -> {name_b}",
        "",
        "Medians in ms over ok requests; change = B/A - 1; p: Mann-Whitney U, Holm-corrected. A verdict "
        "(B better / worse) only where p < alpha and the 95% interval of B/A excludes 1.",
        "",
        "| point | metric | A | B | n A/B | change | 95% CI of B/A | p (Holm) | verdict |",
        "|" + "---|" * 9,
    ]
    for _, r in table.iterrows():
        ci = f"{r['ratio_lo']:.3f}-{r['ratio_hi']:.3f}" if np.isfinite(r["ratio_lo"]) else "–"
        p = f"{r['p_holm']:.3g}" if np.isfinite(r["p_holm"]) else "–"
        change = f"{r['change']:+.1%}" if np.isfinite(r["change"]) else "–"
        lines.append(
            f"| {r['point']} | {r['metric']} | {r['a']:.2f} | {r['b']:.2f} | {r['n_a']}/{r['n_b']} "
            f"| {change} "
            f"| {ci} | {p} | {r['verdict']} |"
        )
    return "\n".join(lines) + "\n"
