"""When requests are sent: closed loop at a concurrency, open loop at a rate, or a replayed trace.

Open-loop gaps are seeded: `constant` (1/rate), `poisson` (exponential gaps, mean 1/rate) or `gamma`
(shape = burstiness, mean 1/rate: burstiness < 1 is burstier than Poisson, > 1 smoother; 1 is Poisson).
Each open-loop point draws its own gaps: `point_seed(seed, index)` derives the point's seed from the run's
`--seed` and the point's place in the plan (or in the sweep's order), so no two points of a run share a draw
and a point's realised rate is not the same fraction of its nominal one at every rate. The derived seed is
the one `describe()` records.
A trace file holds one send time per line (seconds; or JSON lines with a `timestamp` field); times are
made relative to the first one and can be scaled.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

Arrival = Literal["constant", "poisson", "gamma"]


def point_seed(seed: int, index: int) -> int:
    """The arrival seed of the `index`-th open-loop point of a run seeded `seed`: independent streams for
    every (seed, index) pair (`numpy.random.SeedSequence`), as a 32-bit integer that a manifest can hold."""
    return int(np.random.SeedSequence([int(seed), int(index)]).generate_state(1)[0])


@dataclass(frozen=True)
class ClosedLoop:
    """`concurrency` requests in flight at all times: each worker sends its next request when its last
    ends."""

    concurrency: int

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")

    @property
    def label(self) -> str:
        return f"c={self.concurrency}"

    def describe(self) -> dict:
        return {"kind": "closed", **asdict(self)}


@dataclass(frozen=True)
class OpenLoop:
    """Requests sent at `rate` per second whatever the server does (`max_concurrency` caps those in flight;
    a request waiting for the cap is sent late and its lag says so)."""

    rate: float
    arrival: Arrival = "poisson"
    burstiness: float = 1.0
    seed: int = 0
    max_concurrency: int | None = None

    def __post_init__(self) -> None:
        if not self.rate > 0:
            raise ValueError(f"rate must be > 0 requests/s, got {self.rate}")
        if self.arrival not in ("constant", "poisson", "gamma"):
            raise ValueError(f"arrival must be constant, poisson or gamma, got {self.arrival!r}")
        if not self.burstiness > 0:
            raise ValueError(f"burstiness must be > 0, got {self.burstiness}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {self.max_concurrency}")

    @property
    def label(self) -> str:
        return f"r={self.rate:g}"

    def iter_offsets(self) -> Iterator[float]:
        """Send times in seconds after the start, without end; the first is at 0."""
        mean = 1.0 / self.rate
        rng = np.random.default_rng(self.seed)
        shape = 1.0 if self.arrival == "poisson" else self.burstiness
        t = 0.0
        yield t
        while True:
            gaps = (
                np.full(1024, mean)
                if self.arrival == "constant"
                else rng.gamma(shape, mean / shape, size=1024)
            )
            for gap in gaps.tolist():
                t += gap
                yield t

    def offsets(self, n: int) -> np.ndarray:
        """Send times of the first `n` requests (the same as the first `n` of `iter_offsets`)."""
        return np.fromiter(itertools.islice(self.iter_offsets(), n), dtype=float, count=max(n, 0))

    def describe(self) -> dict:
        return {"kind": "open", **asdict(self)}


@dataclass(frozen=True)
class TraceReplay:
    """Send times read from a trace, relative to its first entry, multiplied by `time_scale`."""

    times: tuple[float, ...] = field(repr=False)
    time_scale: float = 1.0
    source: str = ""
    max_concurrency: int | None = None

    def __post_init__(self) -> None:
        if not self.times:
            raise ValueError(f"trace {self.source or ''} has no send times")
        if any(b < a for a, b in itertools.pairwise(self.times)):
            raise ValueError(f"trace {self.source} send times are not in increasing order")
        if not self.time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {self.time_scale}")

    @classmethod
    def from_file(
        cls, path: str | Path, time_scale: float = 1.0, max_concurrency: int | None = None
    ) -> TraceReplay:
        times: list[float] = []
        for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            try:
                value = json.loads(line)
                times.append(float(value["timestamp"] if isinstance(value, dict) else value))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(
                    f'{path}:{number}: expected a number or {{"timestamp": ...}}, got {line!r}'
                ) from exc
        return cls(tuple(times), time_scale, str(path), max_concurrency)

    @property
    def label(self) -> str:
        return f"trace={Path(self.source).name or 'inline'}"

    @property
    def rate(self) -> float | None:
        span = (self.times[-1] - self.times[0]) * self.time_scale
        return (len(self.times) - 1) / span if span > 0 else None

    def iter_offsets(self) -> Iterator[float]:
        yield from self.offsets(len(self.times)).tolist()

    def offsets(self, n: int) -> np.ndarray:
        if n > len(self.times):
            raise ValueError(f"trace {self.source} has {len(self.times)} send times, {n} requests asked")
        t = np.asarray(self.times[:n], dtype=float)
        return (t - t[0]) * self.time_scale

    def describe(self) -> dict:
        return {
            "kind": "trace",
            "source": self.source,
            "time_scale": self.time_scale,
            "n": len(self.times),
            "max_concurrency": self.max_concurrency,
        }


Schedule = ClosedLoop | OpenLoop | TraceReplay
