"""Splitting one load point over several load generators, so that together they send what one would.

- Closed loop at concurrency N over k generators: generator i runs N_i workers, the N_i summing to N
  (k is cut to N if larger). The measured requests are dealt out by weighted round robin (in every round
  of N requests, generator i takes N_i), so each generator's share of the count follows its share of the
  concurrency. The total count is exact; what a single host does better is the tail: its workers share one
  queue, whereas a generator whose share is done stops while others still run.
- Open loop (any arrival) or trace: the driver draws the one arrival sequence a single host would use
  (same seed, same count, cut at the duration), pairs arrival j with request j as a single host does, and
  deals arrivals round robin: generator i sends arrivals i, i+k, i+2k, ... at their original times (a
  `TraceReplay` of its own send times, started `start_offset_s` after the common start). The union is
  exactly the single-host sequence, for constant, Poisson and gamma arrivals alike; each generator on its
  own sees a smoother process (every k-th arrival of a Poisson process is Erlang-k), which does not matter
  to the server. `max_concurrency` becomes a cap of ceil(cap / k) per generator: the sum can exceed the cap
  by up to k - 1.
- Warm-up: each generator warms up with its share of the warm-up requests (at least one when there are
  any), before the common start.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from adapters.request_spec import RequestSpec, lap_id
from workloads.schedule import ClosedLoop, OpenLoop, Schedule, TraceReplay

DEFAULT_WARMUP_CONCURRENCY = 8


@dataclass(frozen=True)
class Share:
    """What one load generator sends at one load point."""

    index: int
    of: int
    specs: tuple[RequestSpec, ...]  # measured requests, in the order it sends them
    warmup_specs: tuple[RequestSpec, ...]
    warmup_concurrency: int
    schedule: Schedule  # ClosedLoop(N_i), or a TraceReplay of its own send times
    start_offset_s: float  # its schedule starts this long after the common start
    max_requests: int | None  # None: cycle its specs until max_duration_s
    max_duration_s: float | None

    def describe(self) -> dict:
        sched = self.schedule
        return {
            "index": self.index,
            "requests": len(self.specs) if self.max_requests is not None else None,
            "warmup": len(self.warmup_specs),
            "concurrency": sched.concurrency if isinstance(sched, ClosedLoop) else None,
            "arrivals": len(sched.times) if isinstance(sched, TraceReplay) else None,
            "max_concurrency": None if isinstance(sched, ClosedLoop) else sched.max_concurrency,
            "start_offset_s": self.start_offset_s,
        }


def expand_specs(specs: Sequence[RequestSpec], count: int) -> list[RequestSpec]:
    """`count` requests from `specs`, cycled with `~lap` id suffixes, as one load generator names them."""
    out: list[RequestSpec] = []
    for lap in itertools.count():
        for spec in specs:
            if len(out) >= count:
                return out
            out.append(dataclasses.replace(spec, request_id=lap_id(spec.request_id, lap)) if lap else spec)
        if not specs:
            return out
    return out


def split_point(
    specs: Sequence[RequestSpec],
    warmup_specs: Sequence[RequestSpec],
    schedule: Schedule,
    generators: int,
    *,
    max_requests: int | None,
    max_duration_s: float | None,
    warmup_concurrency: int | None = None,
) -> list[Share]:
    """Shares of one load point for up to `generators` load generators (fewer when there is less work)."""
    if generators < 1:
        raise ValueError(f"need at least one load generator, got {generators}")
    if not specs:
        raise ValueError("no request specs to send")
    count = max_requests if max_requests is not None else (None if max_duration_s is not None else len(specs))
    if isinstance(schedule, ClosedLoop):
        return _split_closed(specs, warmup_specs, schedule, generators, count, max_duration_s)
    return _split_open(specs, warmup_specs, schedule, generators, count, max_duration_s, warmup_concurrency)


def _split_closed(
    specs: Sequence[RequestSpec],
    warmup_specs: Sequence[RequestSpec],
    schedule: ClosedLoop,
    generators: int,
    count: int | None,
    max_duration_s: float | None,
) -> list[Share]:
    k = min(generators, schedule.concurrency, count if count is not None else len(specs))
    conc = [schedule.concurrency // k + (i < schedule.concurrency % k) for i in range(k)]
    slots = [i for r in range(max(conc)) for i in range(k) if conc[i] > r]  # one round: N slots
    measured = expand_specs(specs, count) if count is not None else list(specs)
    mine = _deal(measured, slots, k)
    warm = _deal(list(warmup_specs), slots, k)
    warm = _at_least_one(warm, list(warmup_specs))
    return [
        Share(
            i,
            k,
            tuple(mine[i]),
            tuple(warm[i]),
            max(1, min(conc[i], len(warm[i]))),
            ClosedLoop(conc[i]),
            0.0,
            len(mine[i]) if count is not None else None,
            max_duration_s,
        )
        for i in range(k)
    ]


def _split_open(
    specs: Sequence[RequestSpec],
    warmup_specs: Sequence[RequestSpec],
    schedule: OpenLoop | TraceReplay,
    generators: int,
    count: int | None,
    max_duration_s: float | None,
    warmup_concurrency: int | None,
) -> list[Share]:
    offsets = _arrivals(schedule, count, max_duration_s)
    if not offsets:
        raise ValueError(f"{schedule.label}: no arrival within {max_duration_s} s")
    k = min(generators, len(offsets))
    measured = expand_specs(specs, len(offsets))
    slots = list(range(k))
    mine, times = _deal(measured, slots, k), _deal(offsets, slots, k)
    warm = _at_least_one(_deal(list(warmup_specs), slots, k), list(warmup_specs))
    cap = schedule.max_concurrency
    per_cap = math.ceil(cap / k) if cap else None
    wc = warmup_concurrency or DEFAULT_WARMUP_CONCURRENCY
    return [
        Share(
            i,
            k,
            tuple(mine[i]),
            tuple(warm[i]),
            max(1, min(len(warm[i]), wc)),
            TraceReplay(tuple(times[i]), 1.0, f"{schedule.label} share {i + 1}/{k}", per_cap),
            times[i][0],
            len(mine[i]),
            None,  # the arrivals were already cut at the duration
        )
        for i in range(k)
    ]


def _arrivals(
    schedule: OpenLoop | TraceReplay, count: int | None, max_duration_s: float | None
) -> list[float]:
    """Send times of the whole point, as one load generator would draw them."""
    source = schedule.iter_offsets()
    if isinstance(schedule, TraceReplay):
        count = len(schedule.times) if count is None else min(count, len(schedule.times))
    out: list[float] = []
    for offset in source:
        if (count is not None and len(out) >= count) or (
            max_duration_s is not None and offset >= max_duration_s
        ):
            break
        out.append(float(offset))
    return out


def _deal(items: Sequence, slots: Sequence[int], k: int) -> list[list]:
    out: list[list] = [[] for _ in range(k)]
    for j, item in enumerate(items):
        out[slots[j % len(slots)]].append(item)
    return out


def _at_least_one(shares: list[list[RequestSpec]], pool: list[RequestSpec]) -> list[list[RequestSpec]]:
    """Every generator warms its own connections: one with no warm-up request gets a renamed copy."""
    if not pool:
        return shares
    return [
        s or [dataclasses.replace(pool[i % len(pool)], request_id=f"{pool[i % len(pool)].request_id}@{i}")]
        for i, s in enumerate(shares)
    ]
