"""Where the load points of a launch come from: one path through the measuring loop for every way of
choosing them. A `PointSource` proposes the next point from those measured so far (`next_point`), hears
what each measured (`measured`), and says what it concluded (`conclusion`); the loop runs what it proposes
until it proposes nothing. `FixedPoints` is the plan's list, whatever was measured; the sweep and the
capacity search (`compare/analysis/load_search.py`) read each point's records to choose the next, and are
handed to `measure` by the runner, so that this stage imports no analysis.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from compare.common.datatypes import PointInfo
from compare.plan.run_options import RunPlan
from workloads.records import RequestRecord
from workloads.schedule import Schedule


@dataclass(frozen=True)
class NextPoint:
    """A load point to measure: its schedule, and the fewest requests it must measure (a capacity search's
    percentile needs that many to be decided; None: the plan's bounds)."""

    schedule: Schedule
    min_requests: int | None = None


@dataclass(frozen=True)
class MeasuredPoint:
    """What one load point measured, kept in memory for the source that proposed it: its run id, what the
    run directory knows of it, its measured records (warm-up excluded) and whether it was interrupted."""

    run_id: str
    info: PointInfo
    records: list[RequestRecord]
    interrupted: bool = False


class PointSource(Protocol):
    """The load points of one launch in one workload, proposed one at a time."""

    def __init__(self, plan: RunPlan) -> None: ...

    @classmethod
    def most_points(cls, plan: RunPlan) -> int:
        """The most points one launch may measure in one workload: each gets prompts of its own, sliced
        before the run starts."""
        ...

    def next_point(self) -> NextPoint | None:
        """The point to measure next; None when there is none."""
        ...

    def measured(self, point: MeasuredPoint) -> None:
        """What the point last proposed measured."""
        ...

    def conclusion(self) -> str:
        """What the source found, for the watcher once it proposes nothing more ("": nothing to say)."""
        ...


class FixedPoints:
    """The plan's load points, in order, whatever each measured."""

    def __init__(self, plan: RunPlan) -> None:
        if plan.sweep:
            raise ValueError(
                "a sweep chooses its points as it measures them: give measure its PointSource "
                "(compare.analysis.load_search.SweepPoints)"
            )
        self.left = list(plan.load_points)

    @classmethod
    def most_points(cls, plan: RunPlan) -> int:
        return len(plan.load_points)

    def next_point(self) -> NextPoint | None:
        return NextPoint(self.left.pop(0)) if self.left else None

    def measured(self, point: MeasuredPoint) -> None:
        pass

    def conclusion(self) -> str:
        return ""
