"""How far the load generator's measurements are from the truth the scripted server logged.

Both processes stamp with CLOCK_MONOTONIC, so a client arrival time and a server write time can be
subtracted directly (a record put on another host's clock is first taken back to its own). For each request
the client's events and the server's logged events line up one to one (both list every SSE data event in
order). Errors, in seconds:

- per event: client arrival minus server write (>= 0 by causality; loopback delivery plus client delay)
- TTFT: measured TTFT minus (server's first token write minus client send) = the first token event's error
- ITL: each measured per-event gap minus the server's gap between the same two writes
- TPOT: measured TPOT minus the TPOT of the server's write times, same output token count
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workloads import timing
from workloads.records import RequestRecord


@dataclass
class Errors:
    event: list[float] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)
    unmatched: list[str] = field(default_factory=list)  # requests whose event lists did not line up

    @property
    def n_requests(self) -> int:
        return len(self.ttft)

    def summary(self) -> dict[str, Any]:
        """p50/p99/max of the absolute errors in milliseconds, and the smallest signed event error."""
        out: dict[str, Any] = {
            "requests": self.n_requests,
            "events": len(self.event),
            "unmatched": len(self.unmatched),
        }
        for name in ("event", "ttft", "itl", "tpot"):
            values = np.abs(np.asarray(getattr(self, name), dtype=float)) * 1e3
            if values.size:
                out[f"{name}_p50_ms"] = float(np.percentile(values, 50))
                out[f"{name}_p99_ms"] = float(np.percentile(values, 99))
                out[f"{name}_max_ms"] = float(values.max())
        if self.event:
            out["event_min_signed_ms"] = float(min(self.event)) * 1e3
        return out


def compare(records: Iterable[RequestRecord], server_log: Mapping[str, Mapping[str, Any]]) -> Errors:
    """Errors of every successful record that has an entry in the server's event log."""
    errors = Errors()
    for record in records:
        entry = server_log.get(record.request_id)
        if entry is None or not record.ok or record.send_s is None:
            continue
        truth = entry["events"]
        counts_differ = any(c[1] != s[1] for c, s in zip(record.events, truth, strict=False))
        if len(truth) != len(record.events) or counts_differ:
            errors.unmatched.append(record.request_id)
            continue
        t0 = record.t0_monotonic - (record.clock_offset_s or 0.0)  # back on the measuring host's clock
        client = [t0 + t for t, _, _ in record.events]
        errors.event.extend(c - s[0] for c, s in zip(client, truth, strict=True))
        send = t0 + record.send_s
        token_true = [s[0] for s in truth if s[1] > 0]
        measured_ttft = timing.ttft(record)
        if not token_true or measured_ttft is None:
            continue
        errors.ttft.append(measured_ttft - (token_true[0] - send))
        true_gaps = np.diff(token_true)
        errors.itl.extend((np.asarray(timing.itl_per_event(record)) - true_gaps).tolist())
        measured_tpot = timing.tpot(record)
        if measured_tpot is not None and record.output_tokens > 1:
            errors.tpot.append(measured_tpot - (token_true[-1] - token_true[0]) / (record.output_tokens - 1))
    return errors
