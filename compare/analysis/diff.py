"""Two runs side by side: for each load point both measured, the change in each per-request latency median,
a bootstrap interval of the ratio B/A, a Mann-Whitney U test, and Holm's correction over all the tests (so
that many metrics x points do not turn noise into findings); output tokens/s with the interval of its ratio
from each rate's variation over its throughput window (`compare.analysis.statistics.throughput_ratio_ci`,
batch means), without a test.

Points are matched on (backend, variant, workload, load point); when the runs share no such key but each
holds one backend, they are matched on (workload, load point), which compares two backends or versions.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from compare.analysis.metrics import LATENCY, request_table, summarize, window_samples
from compare.analysis.statistics import holm, mann_whitney, ratio_ci, throughput_ratio_ci
from compare.common.datatypes import ARRIVAL_DRIVEN
from compare.measure.run_dir import RunDir

METRICS = tuple(m.name for m in LATENCY if m.diff)
INTENDED = frozenset(m.name for m in LATENCY if m.intended_of)  # empty at closed-loop points: not compared


def _tables(run: RunDir) -> tuple[pd.DataFrame, pd.DataFrame]:
    records = run.records()
    points = run.points()
    req = request_table([r for r in records if not r.warmup], points)
    req = req[req["status"] == "ok"]
    return req, summarize(records, points, n_boot=0)


def diff_runs(a: RunDir, b: RunDir, alpha: float = 0.05, seed: int = 0) -> pd.DataFrame:
    req_a, sum_a = _tables(a)
    req_b, sum_b = _tables(b)
    if sum_a.empty or sum_b.empty:
        raise ValueError("one of the runs has no measured requests")
    full = ["backend", "variant", "workload", "load_point"]
    keys = full
    merged = sum_a.merge(sum_b, on=keys, suffixes=("_a", "_b"))
    if merged.empty:
        keys = ["workload", "load_point"]
        if (
            sum_a[["backend", "variant"]].drop_duplicates().shape[0] > 1
            or sum_b[["backend", "variant"]].drop_duplicates().shape[0] > 1
        ):
            raise ValueError(
                "the runs share no (backend, variant, workload, load point), and one of them holds "
                "several backends: nothing to match"
            )
        merged = sum_a.merge(sum_b, on=keys, suffixes=("_a", "_b"))
        if merged.empty:
            raise ValueError("the runs share no (workload, load point)")
    rows = []
    for _, m in merged.iterrows():

        def name(side: str, m: pd.Series = m) -> str:
            backend = m["backend"] if "backend" in m else m[f"backend_{side}"]
            variant = m["variant"] if "variant" in m else m[f"variant_{side}"]
            return f"{backend}:{variant}" if variant else backend

        point = f"{name('a')} {m['workload']} {m['load_point']}".strip()
        if keys != full:
            point = f"{name('a')} -> {name('b')} {m['workload']} {m['load_point']}".strip()
        sel_a = _select(req_a, m, keys, "a")
        sel_b = _select(req_b, m, keys, "b")
        for metric in METRICS:
            x = sel_a[f"{metric}_s"].dropna().to_numpy(dtype=float)
            y = sel_b[f"{metric}_s"].dropna().to_numpy(dtype=float)
            if metric in INTENDED and not (x.size or y.size):
                continue
            ratio, lo, hi = ratio_ci(y, x, "p50", seed=seed)
            rows.append(
                {
                    "point": point,
                    "metric": f"{metric} p50 (ms)",
                    "a": np.median(x) * 1e3 if x.size else np.nan,
                    "b": np.median(y) * 1e3 if y.size else np.nan,
                    "n_a": int(x.size),
                    "n_b": int(y.size),
                    "change": ratio - 1 if np.isfinite(ratio) else np.nan,
                    "ratio_lo": lo,
                    "ratio_hi": hi,
                    "p": mann_whitney(x, y),
                    "higher_is_better": False,
                    "arrival_driven": False,
                }
            )
        rows.append(_throughput_row(point, m, sel_a, sel_b, seed))
    table = pd.DataFrame(rows)
    table["p_holm"] = holm(table["p"].tolist())
    table["verdict"] = [_verdict(r, alpha) for _, r in table.iterrows()]
    return table


def _throughput_row(point: str, m: pd.Series, sel_a: pd.DataFrame, sel_b: pd.DataFrame, seed: int) -> dict:
    """Output tokens/s of B against A with the interval of the ratio from batch means over each point's
    throughput windows (`compare.analysis.metrics.window_samples`); no test, so no p."""
    a, b = m["output_tok_s_a"], m["output_tok_s_b"]
    ratio = b / a if a else np.nan
    arrival_driven = m["mode_a"] in ARRIVAL_DRIVEN and m["mode_b"] in ARRIVAL_DRIVEN
    factor = (
        (np.nan, np.nan)
        if arrival_driven
        else throughput_ratio_ci(
            window_samples(sel_b),
            window_samples(sel_a),
            seed=seed,
        )
    )
    return {
        "point": point,
        "metric": "output tok/s",
        "a": a,
        "b": b,
        "n_a": int(m["requests_ok_a"]),
        "n_b": int(m["requests_ok_b"]),
        "change": ratio - 1 if np.isfinite(ratio) else np.nan,
        "ratio_lo": ratio * factor[0],
        "ratio_hi": ratio * factor[1],
        "p": np.nan,
        "higher_is_better": True,
        "arrival_driven": arrival_driven,
    }


def _select(req: pd.DataFrame, m: pd.Series, keys: list[str], side: str) -> pd.DataFrame:
    mask = np.ones(len(req), dtype=bool)
    for k in keys:
        mask &= (req[k] == m[k]).to_numpy()
    if "backend" not in keys:
        mask &= (
            (req["backend"] == m[f"backend_{side}"]) & (req["variant"] == m[f"variant_{side}"])
        ).to_numpy()
    return req[mask]


def _verdict(r: pd.Series, alpha: float) -> str:
    """A change only where the 95 % interval of B/A excludes 1 and, for a latency, the Holm-corrected test
    is significant too (a ratio whose interval holds 1 is not a change, whatever its p)."""
    if r.get("arrival_driven", False):
        return "no verdict (the offered load sets the rate)"
    if not np.isfinite(r["ratio_lo"]):
        return "too few requests"
    excludes_one = r["ratio_lo"] > 1 or r["ratio_hi"] < 1
    significant = not np.isfinite(r["p"]) or r["p_holm"] < alpha  # a rate has no test: its interval decides
    if not (excludes_one and significant):
        return "no established change"
    better = r["change"] > 0 if r["higher_is_better"] else r["change"] < 0
    return "B better" if better else "B worse"
