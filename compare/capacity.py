"""`compare run --capacity`: the highest request rate at which a backend meets `--slo`, found by bisection
over open-loop rates, reusing the points its sweep measured.

An open-loop point **meets the SLO** when, for every metric the SLO names, the `--capacity-percentile`
(p99 by default) of its ok requests is within the limit (TTFT and E2E from the intended send, so a late
client cannot hide queueing), no more than (100 - percentile) % of its requests failed, and the backend was
not saturated there (`compare.sweep.saturation`: a rate it cannot keep up with is not a rate it serves).

The **bracket** is [lo, hi): hi the lowest measured rate that misses the SLO, lo the highest rate below hi
that meets it (0 when none does). Its midpoint is measured next, until hi - lo <= `--capacity-precision` x hi
or `MAX_BISECTIONS` points were added. The capacity is lo, with the bracket width as its precision. Its
confidence: the 95 % bootstrap interval (`compare.statistics`, the summary's `_lo`/`_hi` columns) of each
SLO percentile at lo and at hi; the SLO **holds with confidence** at lo when every interval's upper end is
within its limit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from compare.sweep import PointFacts, Sweep, saturation

MAX_BISECTIONS = 6  # points a search adds after the sweep


def slo_columns(slo: Mapping[str, float], q: int, intended: bool) -> dict[str, str]:
    """The summary column of each SLO metric's percentile (ms): TTFT and E2E from the intended send at
    open-loop points."""
    named = {k: (f"{k}_intended" if intended and k in ("ttft", "e2e") else k) for k in slo}
    return {k: f"{name}_p{q}_ms" for k, name in named.items()}


def meets(point: PointFacts, sync: PointFacts, slo: Mapping[str, float], q: int) -> bool:
    """Whether `point` meets the SLO at percentile `q` (rules: module doc)."""
    row = point.row
    if saturation(point, sync) or point.failed_share > (100 - q) / 100:
        return False
    for key, column in slo_columns(slo, q, point.offered_rps is not None).items():
        value = row.get(column, math.nan)
        if key == "tpot" and not _finite(value):
            continue  # single-token outputs have no TPOT and cannot miss it
        if not _finite(value) or value > slo[key] * 1e3:
            return False
    return True


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def bracket(verdicts: list[tuple[float, bool]]) -> tuple[float, float | None]:
    """(lo, hi) from (rate, meets) pairs; hi None when every rate meets it."""
    misses = [rate for rate, ok in verdicts if not ok]
    hi = min(misses) if misses else None
    lo = max((rate for rate, ok in verdicts if ok and (hi is None or rate < hi)), default=0.0)
    return lo, hi


def next_rate(verdicts: list[tuple[float, bool]], precision: float) -> float | None:
    """The rate to measure next, or None when the bracket is narrow enough or open above."""
    lo, hi = bracket(verdicts)
    if hi is None or hi - lo <= precision * hi:
        return None
    return (lo + hi) / 2


@dataclass
class Capacity:
    """One backend's capacity under the SLO in one workload."""

    lo: float  # requests/s: the highest rate that met the SLO (0: none did)
    hi: float | None  # the lowest that missed it (None: every rate measured met it)
    percentile: int
    sync_meets: bool = True  # the synchronous point met it (if not, no rate can)
    met_above: list[float] = field(default_factory=list)  # rates above hi that met it: noise, not monotone
    intervals: dict[str, dict[str, tuple[float, float, float]]] = field(default_factory=dict)
    # "lo"/"hi" -> metric -> (percentile, interval low, interval high) in ms

    @property
    def width(self) -> float:
        return math.nan if self.hi is None else self.hi - self.lo

    def confident(self, slo: Mapping[str, float]) -> bool | None:
        """Whether the SLO holds with confidence at lo (every interval's upper end within its limit)."""
        at_lo = self.intervals.get("lo")
        if not at_lo:
            return None
        return all(math.isfinite(v[2]) and v[2] <= slo[k] * 1e3 for k, v in at_lo.items())

    def missed_confidently(self, slo: Mapping[str, float]) -> bool | None:
        """Whether the SLO is missed with confidence at hi (some interval's lower end beyond its limit)."""
        at_hi = self.intervals.get("hi")
        if not at_hi:
            return None
        return any(math.isfinite(v[1]) and v[1] > slo[k] * 1e3 for k, v in at_hi.items())


def capacity_of(points: list[PointFacts], slo: Mapping[str, float], q: int) -> Capacity | None:
    """The bracket and its intervals from a sweep's measured points (first: the synchronous one); None
    without a synchronous point."""
    sync = next((p for p in points if p.concurrency == 1 and p.offered_rps is None), None)
    if sync is None:
        return None
    verdicts = [(p.offered_rps, meets(p, sync, slo, q)) for p in points if p.offered_rps is not None]
    lo, hi = bracket(verdicts)  # type: ignore[arg-type]
    out = Capacity(lo, hi, q, sync_meets=meets(sync, sync, slo, q))
    out.met_above = sorted(r for r, ok in verdicts if ok and hi is not None and r > hi)  # type: ignore[misc]
    for end, rate in (("lo", lo), ("hi", hi)):
        point = next((p for p in points if rate and p.offered_rps == rate), None)
        if point is not None:
            cols = slo_columns(slo, q, True)
            out.intervals[end] = {
                k: (
                    float(point.row.get(c, math.nan)),
                    float(point.row.get(c + "_lo", math.nan)),
                    float(point.row.get(c + "_hi", math.nan)),
                )
                for k, c in cols.items()
            }
    return out


def search(
    sweep: Sweep, measure: Callable, slo: Mapping[str, float], q: int, precision: float
) -> list[PointFacts]:
    """Bisect after `sweep` has run: measure midpoints of the bracket with `measure` until it is narrow
    enough; the sweep's and the search's points."""
    points = sweep.measured
    sync = next((p for p in points if p.concurrency == 1 and p.offered_rps is None), None)
    if sync is None or not meets(sync, sync, slo, q):
        return points  # the SLO fails with one request at a time: no rate meets it
    done = {p.offered_rps for p in points}
    for _ in range(MAX_BISECTIONS):
        verdicts = [(p.offered_rps, meets(p, sync, slo, q)) for p in points if p.offered_rps is not None]
        rate = next_rate(verdicts, precision)  # type: ignore[arg-type]
        if rate is None:
            break
        schedule = sweep.open_loop(rate)
        if schedule.rate in done:  # rounding met a rate already measured: the bracket is as narrow as labels
            break
        done.add(schedule.rate)
        points.append(measure(schedule))
    return points
