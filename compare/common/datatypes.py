"""The data types the comparator's stages hand each other: what a launch cost (`SetupReport`), what a load
point was (`PointInfo`), and what the selection decided (`Pick`).

They live apart from the code that makes them so that the analysis modules (store, metrics, report,
selection, diff) read a run directory without importing the launchers (subprocesses, signals).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from compare.analysis.confidence import Qualifier

GIB = 2**30
ARRIVAL_DRIVEN = ("open", "trace")  # load point modes whose send times are scheduled, not closed-loop


def key_of(backend: str, variant: str) -> str:
    """The name a candidate goes by in reports: `backend:variant`, or the backend alone."""
    return f"{backend}:{variant}" if variant else backend


@dataclass
class Phase:
    """One start-up phase: `seconds` long, ending `end_s` after the spawn (None: unknown, laid end to end)."""

    name: str
    seconds: float
    end_s: float | None = None
    detail: str = ""

    def overlap_s(self, other: Phase) -> float:
        """Seconds both ran at once (0 where either has no clock)."""
        if self.end_s is None or other.end_s is None:
            return 0.0
        start = max(self.end_s - self.seconds, other.end_s - other.seconds)
        return max(0.0, min(self.end_s, other.end_s) - start)


OVERLAP_S = 0.25  # phases that ran at once for longer than this are said to run beside each other


def describe_phases(phases: list[Phase], digits: int = 1, unit: str = " s") -> str:
    """`name seconds` of each phase in order; a phase that ran beside later ones (a server loading its
    tokenizer while its engine starts) says so, so that the list does not read as a sum."""
    parts = []
    for k, p in enumerate(phases):
        beside = [q.name for q in phases[k + 1 :] if p.overlap_s(q) > OVERLAP_S]
        text = f"{p.name} {p.seconds:.{digits}f}{unit}"
        parts.append(text + (f" (beside {', '.join(beside)})" if beside else ""))
    return ", ".join(parts)


@dataclass
class SetupReport:
    """What it cost to get a backend ready to serve; `memory` in bytes (weights, kv_cache, graph_pool,
    peak_rss: the server's processes' peak resident memory, summed; device_used: GPU memory the launch
    added), `kv_tokens` where the backend says how many tokens its KV cache holds."""

    backend: str
    variant: str
    launcher: str  # process | docker | endpoint
    url: str
    command: list[str] = field(default_factory=list)
    log_path: str | None = None
    spawned_at: float | None = None  # epoch seconds
    ready_s: float | None = None  # spawn to the first healthy answer, measured by us
    server_ready_s: float | None = None
    cold_first_token_s: float | None = None  # ready to the first token of the first request
    phases: list[Phase] = field(default_factory=list)
    memory: dict[str, float] = field(default_factory=dict)
    device: str | None = None
    dtype: str | None = None
    notes: list[str] = field(default_factory=list)
    exit_code: int | None = None
    pinned_cpus: list[int] | None = None
    pid: int | None = None
    image: str | None = None
    container_id: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    repeat: int = 0  # which launch of this backend (--repeats)
    ready_runs: list[float] = field(default_factory=list)  # every launch's ready_s, when combined
    # what the backend declares of itself, for the parity audit (compare/launch/declared.py): its start-up
    # log's configuration line as written, its `GET /v1/models` answer, and the identity of its tokenizer
    log_settings: dict[str, str] = field(default_factory=dict)
    models_route: dict[str, Any] | None = None
    tokenizer_id: str | None = None
    metrics_settings: dict[str, str] = field(default_factory=dict)  # from its /metrics info gauges' labels
    props_settings: dict[str, str] = field(default_factory=dict)  # from its settings route (llama.cpp /props)

    @property
    def key(self) -> str:
        return key_of(self.backend, self.variant)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SetupReport:
        data = dict(data)
        data["phases"] = [Phase(**p) for p in data.get("phases", [])]
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class PointInfo:
    """What the comparator knows about one load point run (a `run_id`) beyond its records."""

    workload: str = ""
    mode: str = ""  # closed | open | trace | imported
    concurrency: int | None = None
    rate: float | None = None  # offered requests/s (open loop, trace)
    arrival: str | None = None
    duration_s: float | None = None  # imported results: the other tool's own benchmark duration
    lag_measured: bool = True  # imported results may have no scheduled times
    interrupted: bool = False
    source: str = "llm-compare"
    repeat: int = 0  # which launch of the backend (--repeats)

    @property
    def intended_sends(self) -> bool:
        """Whether each request had a send time of its own that the schedule intended (open loop, trace):
        a closed loop sends when a previous request ends, and imported results may have no schedule."""
        return self.mode in ARRIVAL_DRIVEN and self.lag_measured


def point_info_from_label(label: str) -> PointInfo:
    """Fallback when a run has no summary: read the load point label (`c=8`, `r=2`, `wl/c=8`)."""
    workload, _, sched = label.rpartition("/")
    if sched.startswith("c="):
        return PointInfo(workload, "closed", concurrency=int(float(sched[2:])))
    if sched.startswith("r="):
        return PointInfo(workload, "open", rate=float(sched[2:]))
    return PointInfo(workload)


@dataclass
class Pick:
    """The selection's verdict for one SLO class and workload, with the sentences that explain it."""

    slo_class: str  # interactive | throughput
    workload: str
    winner: str | None = None
    runner_up: str | None = None
    load_point: str | None = None
    value: float = math.nan
    runner_value: float = math.nan
    ratio: float = math.nan  # how many times better the winner is (>= 1)
    ratio_lo: float = math.nan
    ratio_hi: float = math.nan
    p_value: float = math.nan
    confidence: str = ""
    decisive: bool = False  # the difference is significant (and held in every launch, when repeated)
    metric: str = ""  # the summary column ranked on
    sentences: list[str] = field(default_factory=list)
    ranking: list[dict[str, Any]] = field(default_factory=list)
    level: str = ""  # the confidence word alone (compare.analysis.confidence.Confidence's value)
    qualifiers: list[Qualifier] = field(default_factory=list)  # what qualifies it
