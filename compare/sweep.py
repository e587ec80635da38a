"""`compare run --sweep`: the load points of one backend chosen from its own measurements, and the rules that
read a sweep (saturation, knee).

A sweep starts with two closed loops: concurrency 1 (the synchronous point, the latency of an idle server)
and `--sweep-concurrency` (the saturating point: more requests in flight than the backend can batch, so its
throughput is the most the backend serves). A closed loop is chosen over an unbounded open-loop rate because
it measures that maximum without building a queue that grows with the point's length. From their request
throughputs (ok requests over the measured window) come `--sweep-points` open-loop rates, spaced
geometrically or linearly from the synchronous throughput to `BEYOND` x the saturating one, so the last rate
offers more than the backend served. They are run in increasing order; the first point at which the backend
is saturated ends the sweep. Should none be, up to `MAX_EXTRA` more rates, each `EXTRA_STEP` x the last, are
tried, so a sweep ends at a saturated point unless the saturating closed loop underestimated the backend.

An open-loop point is **saturated** (`saturation`) when any of:
- the server completes clearly fewer requests than offered: the completion rate, requests/s over the point's
  throughput window as the summary counts them (`compare.metrics.window_rate`), is below
  (1 - `RATE_SHORTFALL`) x the offered rate;
- the client could not send at the offered rate (the achieved send rate is that far below it): past this
  point the measurement, not the backend, is the limit;
- latency grows without bound: the TTFT p50 (from the intended send) exceeds `TTFT_GROWTH` x the
  synchronous TTFT p50 *and* rises within the point, the median TTFT of the later half of the requests (in
  send order) above that of the earlier half: a queue that grows while the point runs;
- at least `FAILED_SHARE` of the requests failed.

The **knee** (`knee`) is the highest offered rate, below the first saturated point, whose TTFT p50 stays
within `KNEE_TTFT` x the synchronous TTFT p50: past it, requests start to wait on each other. The **saturation
point** is the first saturated rate; the saturating closed loop's throughput is the most the backend served.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from compare.metrics import window_rate
from workloads.schedule import ClosedLoop, OpenLoop, Schedule

RATE_SHORTFALL = 0.10  # saturated: completions below 90 % of the offered rate
TTFT_GROWTH = 4.0  # saturated: TTFT p50 above 4 x the synchronous one, and rising within the point
KNEE_TTFT = 2.0  # knee: TTFT p50 within 2 x the synchronous one
FAILED_SHARE = 0.10  # saturated: a tenth of the requests failed
BEYOND = 1.25  # the last planned rate: 1.25 x the saturating closed loop's throughput
EXTRA_STEP = 1.5  # no saturation by then: each further rate 1.5 x the last ...
MAX_EXTRA = 3  # ... at most this many


@dataclass(frozen=True)
class PointFacts:
    """What the sweep rules read of one measured point."""

    label: str
    concurrency: int | None  # closed loop
    offered_rps: float | None  # open loop
    throughput_rps: float  # ok requests over the throughput window (the summary's request_rps)
    completed_rps: float  # ok requests/s over this run's throughput window (`metrics.window_rate`)
    sent_rps: float  # achieved send rate
    ttft_p50_s: float  # from the intended send where the point has one
    ttft_early_s: float  # median TTFT of the earlier half of the requests, in send order
    ttft_late_s: float  # ... and of the later half
    failed_share: float
    row: Mapping[str, Any] = field(default_factory=dict, repr=False)  # the point's summary row


def point_facts(row: Mapping[str, Any], requests: pd.DataFrame) -> PointFacts:
    """The facts of one point from its summary row and its measured requests (`metrics.request_table`)."""
    ok = requests[requests["status"] == "ok"].sort_values("send_s")
    ttft = ok["ttft_intended_s"] if ok["ttft_intended_s"].notna().any() else ok["ttft_s"]
    ttft = ttft.dropna().to_numpy(dtype=float)
    half = len(ttft) // 2
    sends = np.sort(requests["send_s"].dropna().to_numpy(dtype=float))
    send_span = sends[-1] - sends[0] if sends.size > 1 else 0.0
    rate = row.get("rate")
    return PointFacts(
        label=str(row.get("load_point", "")),
        concurrency=_int_or_none(row.get("concurrency")),
        offered_rps=None if rate is None or not np.isfinite(rate) else float(rate),
        throughput_rps=float(row.get("request_rps", math.nan)),
        completed_rps=window_rate(requests, None) if len(requests) else math.nan,
        sent_rps=(sends.size - 1) / send_span if send_span > 0 else math.nan,
        ttft_p50_s=float(np.median(ttft)) if ttft.size else math.nan,
        ttft_early_s=float(np.median(ttft[:half])) if half else math.nan,
        ttft_late_s=float(np.median(ttft[half:])) if half else math.nan,
        failed_share=float(row.get("requests_failed", 0)) / max(1, int(row.get("requests", 0))),
        row=dict(row),
    )


def _int_or_none(value: Any) -> int | None:
    try:
        return None if value is None or not np.isfinite(value) else int(value)
    except TypeError:
        return None


def saturation(point: PointFacts, sync: PointFacts) -> str:
    """Why `point` (an open loop) shows a saturated backend, or "" when it does not (rules: module doc)."""
    if point.failed_share >= FAILED_SHARE:
        return f"{point.failed_share:.0%} of the requests failed"
    if point.offered_rps is None:
        return ""
    offered = point.offered_rps
    if point.completed_rps < (1 - RATE_SHORTFALL) * offered:
        return f"completed {point.completed_rps:.3g} requests/s of {offered:.3g} offered"
    if point.sent_rps < (1 - RATE_SHORTFALL) * offered:
        return f"the client sent {point.sent_rps:.3g} requests/s of {offered:.3g} offered"
    if point.ttft_p50_s > TTFT_GROWTH * sync.ttft_p50_s and point.ttft_late_s > point.ttft_early_s:
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


def first_saturated(points: list[PointFacts], sync: PointFacts) -> tuple[PointFacts, str] | None:
    for p in sorted((p for p in points if p.offered_rps is not None), key=lambda p: p.offered_rps or 0):
        reason = saturation(p, sync)
        if reason:
            return p, reason
    return None


def sweep_rates(sync_rps: float, saturating_rps: float, n: int, spacing: str) -> list[float]:
    """`n` rates above the synchronous throughput, the last `BEYOND` x the saturating one. A backend that
    serves no more at high concurrency than at one (nothing to sweep between) gets rates from half its
    throughput up."""
    hi = BEYOND * max(saturating_rps, sync_rps)
    lo = sync_rps if saturating_rps > 1.1 * sync_rps else hi / 2
    if spacing == "linear":
        return [lo + (hi - lo) * i / n for i in range(1, n + 1)]
    return [lo * (hi / lo) ** (i / n) for i in range(1, n + 1)]


@dataclass
class Sweep:
    """The adaptive sweep of one backend and workload: `run(measure)` measures each point it chooses with
    `measure(schedule) -> PointFacts` and returns them in the order run."""

    points: int
    spacing: str
    concurrency: int
    template: OpenLoop  # arrival, burstiness, seed, max_concurrency of the open-loop points
    measured: list[PointFacts] = field(default_factory=list)

    def run(self, measure: Callable[[Schedule], PointFacts]) -> list[PointFacts]:
        sync = self._do(measure, ClosedLoop(1))
        top = self._do(measure, ClosedLoop(self.concurrency))
        if not sync.throughput_rps > 0:  # nothing served one at a time (every request failed): no rates
            return self.measured
        most = top.throughput_rps if top.throughput_rps > 0 else sync.throughput_rps
        rates = sweep_rates(sync.throughput_rps, most, self.points, self.spacing)
        extra = 0
        while rates:
            point = self._do(measure, self.open_loop(rates.pop(0)))
            if saturation(point, sync):
                break
            if not rates and extra < MAX_EXTRA:
                extra += 1
                rates.append(EXTRA_STEP * (point.offered_rps or 0.0))
        return self.measured

    def open_loop(self, rate: float) -> OpenLoop:
        return replace(self.template, rate=float(f"{rate:.4g}"))  # a short label, r=12.35

    def _do(self, measure: Callable[[Schedule], PointFacts], schedule: Schedule) -> PointFacts:
        facts = measure(schedule)
        self.measured.append(facts)
        return facts


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
        key = (str(row["backend"]), str(row["variant"]) if isinstance(row["variant"], str) else "",
               str(row["workload"]))
        out.setdefault(key, []).append(point_facts(row.to_dict(), mine))
    for points in out.values():
        points.sort(key=lambda p: (p.offered_rps is not None, p.concurrency or 0, p.offered_rps or 0.0))
    return out
