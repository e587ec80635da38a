"""What the GPU samples of a load point (`compare/measure/gpu_sampling.py`, telemetry.jsonl) say over its
measured window: summary.csv's GPU columns (energy, joules per output token, mean and highest power, peak
memory, mean utilisation) and the per-tick totals the report's power plots draw.

Energy is the counter's difference, interpolated at the window's ends; a GPU without a counter has its power
integrated by the trapezoid rule (`gpu_energy_source` says which). Energy, power and memory are summed over
the backend's GPUs, utilisation averaged; the runs of a point (`--repeats`) add up.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from compare.measure.gpu_sampling import COUNTER, INTEGRAL

GIB = 2**30
#: summary.csv's GPU columns, per (backend, variant, workload, load point); NaN without telemetry
COLUMNS = (
    "gpu_energy_j",
    "gpu_joules_per_out_token",
    "gpu_power_mean_w",
    "gpu_power_max_w",
    "gpu_mem_peak_gib",
    "gpu_util_mean_pct",
    "gpu_energy_source",
)


@dataclass(frozen=True)
class Window:
    """One run of a load point: its throughput window on the samples' clock, and the output tokens of its ok
    requests that the window counts (`compare.common.throughput_window.throughput_window`)."""

    run_id: str
    start: float
    end: float
    output_tokens: float


@dataclass
class _Totals:
    energy_j: float = 0.0
    seconds: float = 0.0
    tokens: float = 0.0
    sources: set[str] = field(default_factory=set)
    ticks: list[pd.DataFrame] = field(default_factory=list)


def window_columns(samples: pd.DataFrame | None, windows: Sequence[Window]) -> dict[str, Any]:
    """summary.csv's GPU columns of one load point from its runs' `windows`: energy over the measured
    windows, summed over the GPUs and the runs; joules per output token of those runs; mean power (that
    energy over the windows' length) and the highest power, summed over the GPUs; the highest memory in use,
    summed over the GPUs; GPU utilisation averaged over GPUs and samples. The samples from the one before
    each window to the one after it count for the highest and the mean. NaN without samples."""
    totals = _Totals()
    for w in windows:
        part = samples[samples["run_id"] == w.run_id] if samples is not None and len(samples) else None
        if part is None or part.empty or not w.end > w.start:  # NaN compares False: no window
            continue
        for _, one in part.groupby("gpu"):
            energy, source = gpu_energy_j(one.sort_values("t"), w.start, w.end)
            totals.energy_j += energy
            totals.sources.add(source)
        totals.seconds += w.end - w.start
        totals.tokens += w.output_tokens
        totals.ticks.append(_ticks_around(part, w.start, w.end))
    if not totals.ticks:
        return {c: np.nan for c in COLUMNS}
    ticks = pd.concat(totals.ticks)
    return {
        "gpu_energy_j": totals.energy_j,
        "gpu_joules_per_out_token": totals.energy_j / totals.tokens if totals.tokens else np.nan,
        "gpu_power_mean_w": totals.energy_j / totals.seconds,
        "gpu_power_max_w": float(ticks["power_w"].max()),
        "gpu_mem_peak_gib": float(ticks["mem_used_bytes"].max()) / GIB,
        "gpu_util_mean_pct": float(ticks["util_pct"].mean()),
        "gpu_energy_source": ", ".join(sorted(totals.sources)),
    }


def gpu_energy_j(samples: pd.DataFrame, start: float, end: float) -> tuple[float, str]:
    """One GPU's energy from `start` to `end` (samples in time order): the counter's difference, read at both
    ends by linear interpolation, where it covers the window; else the trapezoid integral of its power."""
    counter = samples.dropna(subset=["energy_j"])
    t, e = counter["t"].to_numpy(float), counter["energy_j"].to_numpy(float)
    if len(t) >= 2 and t[0] <= start and t[-1] >= end:
        used = float(np.interp(end, t, e) - np.interp(start, t, e))
        if used >= 0:  # a counter reset by a driver reload reads negative
            return used, COUNTER
    power = samples.dropna(subset=["power_w"])
    return integral(power["t"].to_numpy(float), power["power_w"].to_numpy(float), start, end), INTEGRAL


def integral(t: np.ndarray, y: np.ndarray, start: float, end: float) -> float:
    """The trapezoid integral of y(t) from `start` to `end`, its values there linearly interpolated (held
    constant beyond the first and last sample); NaN without samples."""
    if not len(t):
        return np.nan
    inner = (t > start) & (t < end)
    ts = np.concatenate([[start], t[inner], [end]])
    ys = np.concatenate([[np.interp(start, t, y)], y[inner], [np.interp(end, t, y)]])
    return float(np.sum((ys[1:] + ys[:-1]) / 2 * np.diff(ts)))


def tick_totals(samples: pd.DataFrame) -> pd.DataFrame:
    """One row per tick of one load point's samples, in time order: its time (the first GPU's read), power
    and memory summed over the GPUs (NaN where a GPU's read failed), utilisation averaged."""
    gpus = samples["gpu"].nunique()
    by_tick = samples.groupby("tick")
    ticks = by_tick.agg(t=("t", "min"))
    ticks["power_w"] = by_tick["power_w"].sum(min_count=gpus)
    ticks["mem_used_bytes"] = by_tick["mem_used_bytes"].sum(min_count=gpus)
    ticks["util_pct"] = by_tick["util_pct"].mean()
    return ticks.sort_values("t")


def _ticks_around(part: pd.DataFrame, start: float, end: float) -> pd.DataFrame:
    """`tick_totals` from the tick before `start` to the one after `end`."""
    ticks = tick_totals(part)
    before, after = ticks[ticks["t"] <= start]["t"], ticks[ticks["t"] >= end]["t"]
    lo = before.max() if len(before) else ticks["t"].min()
    hi = after.min() if len(after) else ticks["t"].max()
    return ticks[(ticks["t"] >= lo) & (ticks["t"] <= hi)]
