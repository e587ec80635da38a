"""One timeline for records measured on several hosts.

Every interval of a request (TTFT, ITL, TPOT, E2E, client lag) is taken on the host that measured it; what
crosses hosts is only the placement of whole records on one timeline (the throughput window, the achieved
send rate, the common start). For that, the driver measures each host's monotonic clock against its own
the way NTP does: it notes its clock before and after asking the host for its clock, assumes the answer
was read half-way, keeps the exchange with the shortest round trip, and says how far off that can be
(half that round trip). Moving a record to the driver's clock adds one number to all of its times.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from workloads.records import ErrorKind, RequestRecord

_TIME_FIELDS = ("scheduled_s", "start_s", "send_s", "headers_s", "end_s")


@dataclass(frozen=True)
class ClockSample:
    """One exchange: the driver's monotonic clock when it asked and when the answer came, the host's
    monotonic clock when it answered, and both wall clocks (epoch ns) for the record."""

    sent: float
    received: float
    remote: float
    remote_wall_ns: int
    local_wall_ns: int

    @property
    def rtt(self) -> float:
        return self.received - self.sent


@dataclass(frozen=True)
class ClockOffset:
    """driver monotonic = host monotonic + `offset_s`, within +- `uncertainty_s`."""

    offset_s: float
    uncertainty_s: float
    rtt_s: float
    samples: int
    wall_offset_s: float  # driver wall clock minus host wall clock (NTP's business; for the record)

    def describe(self) -> dict:
        return asdict(self)


def estimate_offset(samples: Sequence[ClockSample]) -> ClockOffset:
    if not samples:
        raise ValueError("no clock samples")
    best = min(samples, key=lambda s: s.rtt)
    mid = (best.sent + best.received) / 2
    return ClockOffset(
        offset_s=mid - best.remote,
        uncertainty_s=best.rtt / 2,
        rtt_s=best.rtt,
        samples=len(samples),
        wall_offset_s=(best.local_wall_ns - best.remote_wall_ns) / 1e9,
    )


def to_driver_clock(record: RequestRecord, t0: float, offset_s: float, host: str) -> RequestRecord:
    """`record` with its times relative to `t0` on the driver's clock: one shift for all of its times, so
    intervals within it are unchanged."""
    shift = record.t0_monotonic + offset_s - t0
    update: dict = {f: (None if (v := getattr(record, f)) is None else v + shift) for f in _TIME_FIELDS}
    update["events"] = [(t + shift, n, c) for t, n, c in record.events]
    update |= {"t0_monotonic": t0, "clock_offset_s": offset_s, "host": host}
    return record.model_copy(update=update)


@dataclass(frozen=True)
class Started:
    """A request a load generator said it began (perf_counter seconds on its host)."""

    request_id: str
    scheduled: float
    start: float
    warmup: bool
    prompt_tokens: int
    wanted_output_tokens: int


@dataclass(frozen=True)
class RecordLabels:
    """What every record of one load point is labelled with, and whether the backend was made to produce
    exactly the wanted output length."""

    run_id: str
    backend: str
    variant: str
    load_point: str
    output_length_forced: bool


def lost_record(
    started: Started, labels: RecordLabels, *, t0: float, offset_s: float, host: str, reason: str
) -> RequestRecord:
    """The record of a request that was in flight on a load generator that died: what is known of it (when
    it was due and began, on the driver's clock) and why nothing more is."""
    return RequestRecord(
        run_id=labels.run_id,
        request_id=started.request_id,
        backend=labels.backend,
        variant=labels.variant,
        load_point=labels.load_point,
        warmup=started.warmup,
        t0_monotonic=t0,
        prompt_tokens=started.prompt_tokens,
        wanted_output_tokens=started.wanted_output_tokens,
        output_length_forced=labels.output_length_forced,
        scheduled_s=started.scheduled + offset_s - t0,
        start_s=started.start + offset_s - t0,
        error_kind=ErrorKind.CLIENT_LOST,
        error_message=reason,
        host=host,
        clock_offset_s=offset_s,
    )
