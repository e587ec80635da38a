"""The rules that read a sweep's points (`compare run --sweep`): the facts of a measured point
(`PointFacts`), whether it shows a saturated backend, the knee, and the most served. The sweep applies them
as it runs to choose its next point (`compare/analysis/load_search.py`); the report applies them again from
the run directory alone (`sweep_of`).

An open-loop point is **saturated** (`saturation`) when any of the following holds. Each compares the point
with what it actually sent, never with the nominal rate alone (a point's own draw of arrivals can send at
0.7 x or 1.3 x its rate), and the two rate rules allow for the sampling error of the counts, at the one-sided
level `SATURATION_LEVEL`:
- the server completes clearly fewer requests than were sent: the completions, (ok - 1) over the span from
  the first end to the last, come at a rate below (1 - `RATE_SHORTFALL`) x that of the sends, (sent - 1) over
  the span from the first send to the last, by more than two Poisson counts over those spans can differ by
  chance (`completion_shortfall_p`: the conditional binomial test of two Poisson rates,
  `scipy.stats.binomtest`; counts of one point's sends and ends are not independent, which makes the test
  conservative: it does not call a server that keeps up saturated);
- the client could not keep to its schedule: the sends took more than 1 / (1 - `RATE_SHORTFALL`) x the span
  of their own intended send times (the same draw, so no sampling error): past this point the measurement,
  not the backend, is the limit;
- latency grows without bound: the TTFT p50 (from the intended send) exceeds `TTFT_GROWTH` x the
  synchronous TTFT p50 *and* rises within the point: the TTFTs of the later half of the requests (in send
  order) are larger than those of the earlier half (one-sided Mann-Whitney test at `SATURATION_LEVEL`): a
  queue that grows while the point runs;
- at least `FAILED_SHARE` of the requests failed.

The **knee** (`knee`) is the highest offered rate, below the first saturated point, whose TTFT p50 stays
within `KNEE_TTFT` x the synchronous TTFT p50: past it, requests start to wait on each other. The **saturation
point** is the first saturated rate; the saturating closed loop's throughput is the most the backend served
in a closed loop, and an open-loop point below the saturation may have served more (`most_served`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

RATE_SHORTFALL = 0.10  # saturated: completions below 90 % of the rate of sends, beyond chance
SATURATION_LEVEL = 0.01  # one-sided level of the saturation tests: how rarely one fires far below capacity
TTFT_GROWTH = 4.0  # saturated: TTFT p50 above 4 x the synchronous one, and rising within the point
KNEE_TTFT = 2.0  # knee: TTFT p50 within 2 x the synchronous one
FAILED_SHARE = 0.10  # saturated: a tenth of the requests failed
SLO_METRICS = ("ttft", "e2e", "tpot")  # what an SLO can name (`compare.plan.run_options.SLO_KEYS`)


@dataclass(frozen=True)
class PointFacts:
    """What the sweep rules read of one measured point."""

    label: str
    concurrency: int | None  # closed loop
    offered_rps: float | None  # open loop
    throughput_rps: float  # ok requests over the measured window (the summary's request_rps)
    ttft_p50_s: float  # from the intended send where the point has one
    ttft_early_s: float  # median TTFT of the earlier half of the requests, in send order
    ttft_late_s: float  # ... and of the later half
    failed_share: float
    sent: int = 0  # measured requests sent
    send_span_s: float = math.nan  # first send to last send
    intended_span_s: float = math.nan  # first to last intended send of the same requests (open loop)
    completed: int = 0  # ok requests
    end_span_s: float = math.nan  # first end to last end of the ok requests
    ttft_rise_p: float = math.nan  # one-sided p-value: the later half's TTFTs larger than the earlier half's
    failed: int = 0  # failed requests: each a miss of any SLO
    values: Mapping[str, np.ndarray] = field(default_factory=dict, repr=False)
    # SLO metric -> its values (s) over the ok requests: TTFT and E2E from the intended send at open loops
    row: Mapping[str, Any] = field(default_factory=dict, repr=False)  # the point's summary row

    @property
    def completed_rps(self) -> float:
        """(ok - 1) / (last end - first end): the pace of completions."""
        return (self.completed - 1) / self.end_span_s if self.end_span_s > 0 else math.nan

    @property
    def sent_rps(self) -> float:
        """(sent - 1) / (last send - first send): the achieved send rate."""
        return (self.sent - 1) / self.send_span_s if self.send_span_s > 0 else math.nan


def summary_row(row: pd.Series) -> dict[str, Any]:
    """A row of summary.csv as a dict (its columns are named by strings)."""
    return {str(name): value for name, value in row.items()}


def point_facts(row: Mapping[str, Any], requests: pd.DataFrame) -> PointFacts:
    """The facts of one point from its summary row and its measured requests (`metrics.request_table`)."""
    ok = requests[requests["status"] == "ok"].sort_values("send_s")
    intended = ok["ttft_intended_s"].notna().any()
    ttft = (ok["ttft_intended_s"] if intended else ok["ttft_s"]).dropna().to_numpy(dtype=float)
    half = len(ttft) // 2
    ends = np.sort(ok["end_s"].dropna().to_numpy(dtype=float))
    sent = requests[requests["send_s"].notna()]
    sends = np.sort(sent["send_s"].to_numpy(dtype=float))
    rate = row.get("rate")
    open_loop = rate is not None and np.isfinite(rate)
    planned = (
        sent["scheduled_s"].dropna().to_numpy(dtype=float)
        if open_loop and "scheduled_s" in sent
        else np.array([])
    )
    values = {}
    for key in SLO_METRICS:
        column = f"{key}_intended_s" if intended and key in ("ttft", "e2e") else f"{key}_s"
        if column in ok:
            values[key] = ok[column].to_numpy(dtype=float)
    rise = math.nan
    if half >= 2:
        rise = float(stats.mannwhitneyu(ttft[half:], ttft[:half], alternative="greater").pvalue)
    return PointFacts(
        label=str(row.get("load_point", "")),
        concurrency=_int_or_none(row.get("concurrency")),
        offered_rps=float(rate) if open_loop and rate is not None else None,
        throughput_rps=float(row.get("request_rps", math.nan)),
        ttft_p50_s=float(np.median(ttft)) if ttft.size else math.nan,
        ttft_early_s=float(np.median(ttft[:half])) if half else math.nan,
        ttft_late_s=float(np.median(ttft[half:])) if half else math.nan,
        failed_share=float(row.get("requests_failed", 0)) / max(1, int(row.get("requests", 0))),
        sent=int(sends.size),
        send_span_s=float(sends[-1] - sends[0]) if sends.size > 1 else math.nan,
        intended_span_s=float(planned.max() - planned.min()) if planned.size > 1 else math.nan,
        completed=int(ends.size),
        end_span_s=float(ends[-1] - ends[0]) if ends.size > 1 else math.nan,
        ttft_rise_p=rise,
        failed=int((requests["status"] == "failed").sum()),
        values=values,
        row=dict(row),
    )


def _int_or_none(value: Any) -> int | None:
    try:
        return None if value is None or not np.isfinite(value) else int(value)
    except TypeError:
        return None


def completion_shortfall_p(completed: int, end_span_s: float, sent: int, send_span_s: float) -> float:
    """One-sided p-value that completions came slower than (1 - `RATE_SHORTFALL`) x the sends: the
    conditional binomial test of two Poisson rates (the completions' count given both counts, over the spans
    as exposures). NaN when either count or span is too small to say."""
    k_end, k_send = completed - 1, sent - 1
    if k_end < 0 or k_send < 1 or not (end_span_s > 0 and send_span_s > 0):
        return math.nan
    exposure = (1 - RATE_SHORTFALL) * end_span_s
    return float(
        stats.binomtest(k_end, k_end + k_send, exposure / (exposure + send_span_s), alternative="less").pvalue
    )


def send_shortfall_p(sent: int, span_s: float, rate: float, arrival: str) -> float:
    """One-sided p-value that `sent` sends over `span_s` seconds came slower than `rate` allows: under Poisson
    arrivals at `rate` the span of n - 1 gaps is Gamma(n - 1, 1 / rate); constant arrivals have no sampling
    error (0 when the span is over 1 / (1 - `RATE_SHORTFALL`) x the scheduled one, else 1). Gamma arrivals of
    unknown burstiness are read as Poisson. NaN when there is nothing to test."""
    if sent < 2 or not span_s > 0 or not rate > 0:
        return math.nan
    if arrival == "constant":
        return 0.0 if span_s * (1 - RATE_SHORTFALL) > (sent - 1) / rate else 1.0
    return float(stats.gamma.sf(span_s, a=sent - 1, scale=1.0 / rate))


def saturation(point: PointFacts, sync: PointFacts) -> str:
    """Why `point` (an open loop) shows a saturated backend, or "" when it does not (rules: module doc)."""
    if point.failed_share >= FAILED_SHARE:
        return f"{point.failed_share:.0%} of the requests failed"
    if point.offered_rps is None:
        return ""
    shortfall = completion_shortfall_p(point.completed, point.end_span_s, point.sent, point.send_span_s)
    if shortfall < SATURATION_LEVEL:
        return (
            f"completed {point.completed_rps:.3g} requests/s of {point.sent_rps:.3g} sent "
            f"({point.offered_rps:.3g} offered; p = {shortfall:.2g})"
        )
    if point.intended_span_s > 0 and point.intended_span_s < (1 - RATE_SHORTFALL) * point.send_span_s:
        planned = (point.sent - 1) / point.intended_span_s
        return f"the client sent {point.sent_rps:.3g} requests/s of the {planned:.3g} its schedule asked"
    if point.ttft_p50_s > TTFT_GROWTH * sync.ttft_p50_s and point.ttft_rise_p < SATURATION_LEVEL:
        return (
            f"TTFT p50 {point.ttft_p50_s * 1e3:.0f} ms, {point.ttft_p50_s / sync.ttft_p50_s:.1f} x the "
            "synchronous one, and rising"
        )
    return ""


def knee(points: list[PointFacts], sync: PointFacts) -> PointFacts | None:
    """The highest offered rate before the first saturated point whose TTFT p50 stays within `KNEE_TTFT` x
    the synchronous one; None when no open-loop point does."""
    best = None
    for p in sorted((p for p in points if p.offered_rps is not None), key=lambda p: p.offered_rps or 0):
        if saturation(p, sync):
            break
        if p.ttft_p50_s <= KNEE_TTFT * sync.ttft_p50_s:
            best = p
    return best


def most_served(points: list[PointFacts]) -> PointFacts:
    """The point that served the most ok requests per second over its measured window, open loops included:
    a closed loop can read lower than an open-loop point below the saturation (a window's ramp and drain)."""
    return max(points, key=lambda p: p.throughput_rps if np.isfinite(p.throughput_rps) else -math.inf)


def first_saturated(points: list[PointFacts], sync: PointFacts) -> tuple[PointFacts, str] | None:
    for p in sorted((p for p in points if p.offered_rps is not None), key=lambda p: p.offered_rps or 0):
        reason = saturation(p, sync)
        if reason:
            return p, reason
    return None


def sweep_of(summary: pd.DataFrame, requests: pd.DataFrame) -> dict[tuple[str, str, str], list[PointFacts]]:
    """The facts of every point, per (backend, variant, workload): closed loops by concurrency (the
    synchronous point first), then open loops by rate. For the report, from the run directory alone."""
    out: dict[tuple[str, str, str], list[PointFacts]] = {}
    if summary.empty:
        return out
    measured = requests[~requests["warmup"]] if "warmup" in requests else requests
    for _, row in summary.iterrows():
        mine = measured[
            (measured["backend"] == row["backend"])
            & (measured["variant"].fillna("") == (row["variant"] if isinstance(row["variant"], str) else ""))
            & (measured["workload"] == row["workload"])
            & (measured["load_point"] == row["load_point"])
        ]
        key = (
            str(row["backend"]),
            str(row["variant"]) if isinstance(row["variant"], str) else "",
            str(row["workload"]),
        )
        out.setdefault(key, []).append(point_facts(summary_row(row), mine))
    for points in out.values():
        points.sort(key=lambda p: (p.offered_rps is not None, p.concurrency or 0, p.offered_rps or 0.0))
    return out
