"""`compare run --capacity`: the highest request rate at which a backend meets `--slo`, judged from the points
measured (the search that chooses them: `compare/analysis/load_search.py`).

Each point gets a **verdict** (`point_verdict`): for every metric the SLO names, the `--capacity-percentile`
(p99 by default) of the population its requests were drawn from is judged by
`compare.analysis.statistics.slo_verdict` from the point's own requests (TTFT and E2E from the intended send,
so a late client cannot hide queueing): **holds** when the percentile's one-sided distribution-free 95 % upper
bound (an order statistic, `scipy.stats.quantile_test`) is within the limit, **misses** when its lower bound
is beyond it, else **undetermined**. A failed request counts as a value beyond every limit; a request with a
single output token has no TPOT and cannot miss it. The point holds when every metric holds, misses when any
misses or the backend was saturated there (`compare.analysis.sweep.saturation`: a rate it cannot keep up with
is not a rate it serves), and is undetermined otherwise. Fewer than `statistics.min_n_for_bound(q)` requests
(299 for p99, 59 for p95, 29 for p90) can never show that a percentile holds: such a point is at best
undetermined, and the search says so rather than guessing.

The **bracket** is [lo, hi): hi the lowest measured rate that misses the SLO, lo the highest rate below hi
at which it holds (0 when none does); undetermined rates in between are listed. The capacity is lo: a rate
at which the SLO was shown to hold with 95 % confidence.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from compare.analysis.statistics import CI_LEVEL, min_n_for_bound, quantile_ci, slo_verdict
from compare.analysis.sweep import PointFacts, saturation

FAILED_VALUE = 1e300  # a failed request's value of every SLO metric: beyond any limit (finite, so counted)
HOLDS, MISSES, UNDETERMINED = "holds", "misses", "undetermined"


def slo_columns(slo: Mapping[str, float], q: int, intended: bool) -> dict[str, str]:
    """The summary column of each SLO metric's percentile (ms): TTFT and E2E from the intended send at
    open-loop points."""
    named = {k: (f"{k}_intended" if intended and k in ("ttft", "e2e") else k) for k in slo}
    return {k: f"{name}_p{q}_ms" for k, name in named.items()}


def slo_values(point: PointFacts, key: str) -> np.ndarray:
    """The values (s) a point's SLO verdict on `key` rests on: its ok requests' (a TPOT-less single-token
    output as 0, which meets any limit) and one `FAILED_VALUE` per failed request."""
    values = np.asarray(point.values.get(key, np.array([])), dtype=float)
    values = np.nan_to_num(values, nan=0.0) if key == "tpot" else values[np.isfinite(values)]
    return np.concatenate([values, np.full(point.failed, FAILED_VALUE)])


def metric_verdicts(point: PointFacts, slo: Mapping[str, float], q: int) -> dict[str, str]:
    """Each SLO metric's verdict at `point` (rules: module doc)."""
    return {key: slo_verdict(slo_values(point, key), q / 100, limit) for key, limit in slo.items()}


def point_verdict(point: PointFacts, sync: PointFacts, slo: Mapping[str, float], q: int) -> str:
    """holds / misses / undetermined: the SLO at percentile `q` at `point` (rules: module doc)."""
    if point.offered_rps is not None and saturation(point, sync):
        return MISSES
    verdicts = set(metric_verdicts(point, slo, q).values())
    if MISSES in verdicts:
        return MISSES
    return HOLDS if verdicts <= {HOLDS} else UNDETERMINED


def bracket(verdicts: list[tuple[float, str]]) -> tuple[float, float | None]:
    """(lo, hi) from (rate, verdict) pairs; hi None when no rate missed the SLO."""
    misses = [rate for rate, v in verdicts if v == MISSES]
    hi = min(misses) if misses else None
    lo = max((rate for rate, v in verdicts if v == HOLDS and (hi is None or rate < hi)), default=0.0)
    return lo, hi


@dataclass
class Capacity:
    """One backend's capacity under the SLO in one workload."""

    lo: float  # requests/s: the highest rate at which the SLO held (0: none did)
    hi: float | None  # the lowest that missed it (None: no rate measured missed it)
    percentile: int
    sync_meets: bool = True  # the synchronous point did not miss it (if it did, no rate can)
    met_above: list[float] = field(default_factory=list)  # rates above hi that held: not monotone
    undetermined: list[float] = field(default_factory=list)  # rates above lo (below hi) not decided
    smallest_n: int = 0  # the fewest requests of an open-loop point
    intervals: dict[str, dict[str, tuple[float, float, float, int]]] = field(default_factory=dict)
    # "lo"/"hi" -> metric -> (percentile, distribution-free 95 % interval low, high, n) in ms

    @property
    def width(self) -> float:
        return math.nan if self.hi is None else self.hi - self.lo

    @property
    def needed_n(self) -> int:
        """The fewest requests a point needs before its percentile can be shown to hold."""
        return min_n_for_bound(self.percentile / 100)

    @property
    def decided(self) -> bool:
        """Whether some rate was shown to hold the SLO (else the capacity is undetermined, not 0)."""
        return self.lo > 0


def capacity_of(points: list[PointFacts], slo: Mapping[str, float], q: int) -> Capacity | None:
    """The bracket and its intervals from a sweep's measured points (first: the synchronous one); None
    without a synchronous point."""
    sync = next((p for p in points if p.concurrency == 1 and p.offered_rps is None), None)
    if sync is None:
        return None
    opened = [p for p in points if p.offered_rps is not None]
    verdicts = [(float(p.offered_rps), point_verdict(p, sync, slo, q)) for p in opened]  # type: ignore[arg-type]
    lo, hi = bracket(verdicts)
    out = Capacity(lo, hi, q, sync_meets=point_verdict(sync, sync, slo, q) != MISSES)
    out.met_above = sorted(r for r, v in verdicts if v == HOLDS and hi is not None and r > hi)
    out.undetermined = sorted(
        r for r, v in verdicts if v == UNDETERMINED and r > lo and (hi is None or r < hi)
    )
    out.smallest_n = min((p.sent for p in opened), default=0)
    for end, rate in (("lo", lo), ("hi", hi)):
        point = next((p for p in opened if rate and p.offered_rps == rate), None)
        if point is not None:
            out.intervals[end] = {k: _interval(slo_values(point, k), q) for k in slo}
    return out


def _interval(values: np.ndarray, q: int) -> tuple[float, float, float, int]:
    """The `q` percentile (ms) of `values` (s), its distribution-free 95 % interval and n."""
    if values.size == 0:
        return math.nan, math.nan, math.nan, 0
    lo, hi = quantile_ci(values, q / 100, CI_LEVEL)
    return float(np.percentile(values, q)) * 1e3, lo * 1e3, hi * 1e3, int(values.size)
