"""Latency by turn of multi-turn sessions (`--dataset multi-turn`, `sharegpt-turns`): turn k's prompt carries
the whole conversation so far, so without a prefix cache its TTFT grows with the conversation, and with one
it stays near the first turn's. One row per backend x variant x workload x load point x turn, written as
`turns.csv` beside summary.csv (a turn is a finer grain than summary.csv's load point) and shown in the
report's "TTFT by turn".

Turns are numbered from 1 in both (`turn_number`, 1 = a session's first turn), as a reader counts them; the
records' own `turn` field (and request ids `...-t0`) count from 0, as the load generator indexes them.
"""

from __future__ import annotations

import numbers
from pathlib import Path

import numpy as np
import pandas as pd

from compare.analysis.metrics import GROUP_KEYS

TURNS_CSV = "turns.csv"
TURN = "turn_number"  # 1-based: 1 is a session's first turn
COLUMNS = [
    *GROUP_KEYS,
    TURN,
    "n",
    "prompt_tokens_mean",
    "ttft_p50_ms",
    "ttft_p90_ms",
    "ttft_mean_ms",
    "e2e_p50_ms",
]


def turn_table(requests: pd.DataFrame) -> pd.DataFrame:
    """Per turn, over the measured ok requests of sessions (`compare.analysis.metrics.request_table`'s rows):
    how many, their mean prompt tokens, TTFT p50/p90/mean and E2E p50 in ms. Empty when no request belongs to
    a session (every run before sessions existed)."""
    if requests.empty or "turn" not in requests:
        return pd.DataFrame(columns=COLUMNS)
    rows = requests[(requests["status"] == "ok") & requests["turn"].notna()]
    out: list[dict[str, object]] = []
    for key, group in rows.groupby([*GROUP_KEYS, "turn"], sort=True, dropna=False):
        turn = key[-1]
        assert isinstance(turn, numbers.Real)  # the turn column's numbers (its empty rows dropped)
        ttft = group["ttft_s"].dropna().to_numpy() * 1e3
        e2e = group["e2e_s"].dropna().to_numpy() * 1e3
        out.append(
            {
                **dict(zip(GROUP_KEYS, key[:-1], strict=True)),
                TURN: int(turn) + 1,
                "n": len(group),
                "prompt_tokens_mean": float(group["prompt_tokens"].mean()),
                "ttft_p50_ms": _percentile(ttft, 50),
                "ttft_p90_ms": _percentile(ttft, 90),
                "ttft_mean_ms": float(ttft.mean()) if ttft.size else np.nan,
                "e2e_p50_ms": _percentile(e2e, 50),
            }
        )
    table = pd.DataFrame(out, columns=COLUMNS)
    return table.astype({TURN: int}) if not table.empty else table


def _percentile(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if values.size else np.nan


def write_turns(run_path: Path, table: pd.DataFrame) -> None:
    """`turns.csv` in the run directory, when the run had sessions."""
    if not table.empty:
        table.to_csv(run_path / TURNS_CSV, index=False, float_format="%.6g")
