"""`compare run --sweep` and `--capacity`: the load points of one backend in one workload, each chosen from
the facts of those measured before it (the rules that read a point: `compare/analysis/sweep.py`,
`compare/analysis/capacity.py`).

A sweep starts with two closed loops: concurrency 1 (the synchronous point, the latency of an idle server)
and `--sweep-concurrency` (the saturating point: more requests in flight than the backend can batch, so its
throughput is the most the backend serves). A closed loop is chosen over an unbounded open-loop rate because
it measures that maximum without building a queue that grows with the point's length. From their request
throughputs (ok requests over the measured window) come `--sweep-points` open-loop rates, spaced
geometrically or linearly from the synchronous throughput to `BEYOND` x the saturating one, so the last rate
offers more than the backend served. They are run in increasing order; the first point at which the backend
is saturated ends the sweep. Should none be, up to `MAX_EXTRA` more rates, each `EXTRA_STEP` x the last, are
tried, so a sweep ends at a saturated point unless the saturating closed loop underestimated the backend.

With `--capacity` the search goes on from the sweep's points: the next rate measured is the midpoint of the
widest gap between the bracket's ends and the undetermined rates inside it (`next_rate`), until every gap
is <= `--capacity-precision` x hi or `MAX_BISECTIONS` points were added; without points large enough to show
a hold there is nothing to bisect. Every open-loop point of a capacity search is sized so that its
percentile can be decided (`statistics.min_n_for_bound`).

`Sweep` and `CapacitySearch` propose schedules from `PointFacts` (`run(measure)` drives them with a function,
as the simulations do); `SweepPoints` is the measuring loop's `PointSource`, which turns each measured
point's records, kept in memory, into its facts.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Generator, Mapping
from dataclasses import replace

from compare.analysis.capacity import MISSES, UNDETERMINED, bracket, point_verdict
from compare.analysis.metrics import request_table, summarize
from compare.analysis.statistics import min_n_for_bound
from compare.analysis.sweep import PointFacts, first_saturated, knee, point_facts, saturation, summary_row
from compare.measure.load_points import FixedPoints, MeasuredPoint, NextPoint, PointSource
from compare.plan.run_options import RunPlan
from workloads.schedule import ClosedLoop, OpenLoop, Schedule, point_seed

BEYOND = 1.25  # the last planned rate: 1.25 x the saturating closed loop's throughput
EXTRA_STEP = 1.5  # no saturation by then: each further rate 1.5 x the last ...
MAX_EXTRA = 3  # ... at most this many
MAX_BISECTIONS = 6  # points a capacity search adds after the sweep

#: what a proposer yields (the next schedule) and is sent back (that point's facts)
Proposals = Generator[Schedule, PointFacts, None]


def sweep_rates(sync_rps: float, saturating_rps: float, n: int, spacing: str) -> list[float]:
    """`n` rates above the synchronous throughput, the last `BEYOND` x the saturating one. A backend that
    serves no more at high concurrency than at one (nothing to sweep between) gets rates from half its
    throughput up."""
    hi = BEYOND * max(saturating_rps, sync_rps)
    lo = sync_rps if saturating_rps > 1.1 * sync_rps else hi / 2
    if spacing == "linear":
        return [lo + (hi - lo) * i / n for i in range(1, n + 1)]
    return [lo * (hi / lo) ** (i / n) for i in range(1, n + 1)]


def next_rate(verdicts: list[tuple[float, str]], precision: float) -> float | None:
    """The rate to measure next: the midpoint of the widest gap between the bracket's ends and the rates left
    undetermined inside it (the higher gap on a tie); None when every gap is narrow enough
    (<= `precision` x hi) or the bracket is open above."""
    lo, hi = bracket(verdicts)
    if hi is None:
        return None
    inside = sorted({lo, hi, *(rate for rate, v in verdicts if v == UNDETERMINED and lo < rate < hi)})
    width, start = max((b - a, a) for a, b in itertools.pairwise(inside))
    if width <= precision * hi:
        return None
    return start + width / 2


class _Proposer:
    """Proposes schedules one at a time from the facts of those measured (`_proposals`, a generator that
    yields each schedule and is sent its facts); `measured` keeps the facts in the order run."""

    def __init__(self, measured: list[PointFacts]) -> None:
        self.measured = measured
        self._proposals: Proposals | None = None
        self._next: Schedule | None = None

    def next_schedule(self) -> Schedule | None:
        """The schedule to measure next; None when done. The first call starts the proposer, so that it
        reads what was measured before it (a search reads the sweep's points)."""
        if self._proposals is None:
            self._proposals = self._propose()
            self._next = next(self._proposals, None)
        return self._next

    def add(self, facts: PointFacts) -> None:
        """The facts of the schedule last proposed."""
        assert self._proposals is not None and self._next is not None, "add() before next_schedule()"
        self.measured.append(facts)
        try:
            self._next = self._proposals.send(facts)
        except StopIteration:
            self._next = None

    def run(self, measure: Callable[[Schedule], PointFacts]) -> list[PointFacts]:
        """Measure each schedule proposed with `measure(schedule) -> PointFacts` until none is left; every
        point measured, in the order run."""
        while (schedule := self.next_schedule()) is not None:
            self.add(measure(schedule))
        return self.measured

    def _propose(self) -> Proposals:
        raise NotImplementedError


class Sweep(_Proposer):
    """The adaptive sweep of one backend and workload (module doc)."""

    def __init__(self, points: int, spacing: str, concurrency: int, template: OpenLoop) -> None:
        super().__init__([])
        self.points, self.spacing, self.concurrency = points, spacing, concurrency
        self.template = template  # arrival, burstiness, seed, max_concurrency of the open-loop points

    def open_loop(self, rate: float) -> OpenLoop:
        """The next point at `rate` (a short label, r=12.35), its arrivals a draw of their own: seeded from
        the template's (the run's) seed and the point's place in the sweep's order."""
        return replace(
            self.template, rate=float(f"{rate:.4g}"), seed=point_seed(self.template.seed, len(self.measured))
        )

    def _propose(self) -> Proposals:
        sync = yield ClosedLoop(1)
        top = yield ClosedLoop(self.concurrency)
        if not sync.throughput_rps > 0:  # nothing served one at a time (every request failed): no rates
            return
        most = top.throughput_rps if top.throughput_rps > 0 else sync.throughput_rps
        rates = sweep_rates(sync.throughput_rps, most, self.points, self.spacing)
        extra = 0
        while rates:
            point = yield self.open_loop(rates.pop(0))
            if saturation(point, sync):
                break
            if not rates and extra < MAX_EXTRA:
                extra += 1
                rates.append(EXTRA_STEP * (point.offered_rps or 0.0))


class CapacitySearch(_Proposer):
    """The bisection after a sweep has run: midpoints of the SLO's bracket until it is narrow enough (module
    doc). Its points join the sweep's (`measured` is the sweep's list)."""

    def __init__(self, sweep: Sweep, slo: Mapping[str, float], percentile: int, precision: float) -> None:
        super().__init__(sweep.measured)
        self.sweep, self.slo, self.percentile, self.precision = sweep, dict(slo), percentile, precision

    def _propose(self) -> Proposals:
        points, slo, q = self.measured, self.slo, self.percentile
        sync = next((p for p in points if p.concurrency == 1 and p.offered_rps is None), None)
        if sync is None or point_verdict(sync, sync, slo, q) == MISSES:
            return  # the SLO fails with one request at a time: no rate meets it
        done = {p.offered_rps for p in points}
        for _ in range(MAX_BISECTIONS):
            opened = [p for p in points if p.offered_rps is not None]
            if not any(p.sent >= min_n_for_bound(q / 100) for p in opened):
                return  # no point is large enough to show the SLO holds: bisecting cannot narrow anything
            verdicts = [(float(p.offered_rps or 0.0), point_verdict(p, sync, slo, q)) for p in opened]
            rate = next_rate(verdicts, self.precision)
            if rate is None:
                return
            schedule = self.sweep.open_loop(rate)
            if schedule.rate in done:  # rounding met a rate already measured: as narrow as labels allow
                return
            done.add(schedule.rate)
            yield schedule


class SweepPoints:
    """The measuring loop's `PointSource` of a swept run: the sweep's points, then with `--capacity` the
    search's, each open-loop point of a search sized so that its percentile can be decided."""

    def __init__(self, plan: RunPlan) -> None:
        assert plan.sweep_open is not None
        self.slo = dict(plan.slo or {})
        self.sweep = Sweep(plan.sweep_points, plan.sweep_spacing, plan.sweep_concurrency, plan.sweep_open)
        self.search = (
            CapacitySearch(self.sweep, self.slo, plan.capacity_percentile, plan.capacity_precision)
            if plan.capacity
            else None
        )
        # a capacity search decides each rate by the percentile's one-sided bound, which needs this many
        self.needed = min_n_for_bound(plan.capacity_percentile / 100) if plan.capacity else None
        self.current: _Proposer = self.sweep

    @classmethod
    def most_points(cls, plan: RunPlan) -> int:
        return 2 + plan.sweep_points + MAX_EXTRA + (MAX_BISECTIONS if plan.capacity else 0)

    def next_point(self) -> NextPoint | None:
        schedule = self.current.next_schedule()
        if schedule is None and self.current is self.sweep and self.search is not None:
            self.current = self.search  # the sweep has ended: the search starts from its points
            schedule = self.current.next_schedule()
        if schedule is None:
            return None
        return NextPoint(schedule, self.needed if isinstance(schedule, OpenLoop) else None)

    def measured(self, point: MeasuredPoint) -> None:
        self.current.add(facts_of(point, self.slo))

    def conclusion(self) -> str:
        points = self.sweep.measured
        if not points:
            return ""
        sync = points[0]
        bend, saturated = knee(points, sync), first_saturated(points, sync)
        return f"knee {'none' if bend is None else bend.label}, saturated " + (
            "not reached" if saturated is None else f"at {saturated[0].label} ({saturated[1]})"
        )


def facts_of(point: MeasuredPoint, slo: Mapping[str, float]) -> PointFacts:
    """The sweep's facts of one measured point, from its records in memory: its summary row without
    intervals and its request table."""
    points = {point.run_id: point.info}
    summary = summarize(point.records, points, slo, n_boot=0)
    row = summary_row(summary.iloc[0]) if not summary.empty else {}
    return point_facts(row, request_table(point.records, points))


def point_source(plan: RunPlan) -> type[PointSource]:
    """Where the plan's load points come from: chosen as the run goes (a sweep), or its own list."""
    return SweepPoints if plan.sweep else FixedPoints
