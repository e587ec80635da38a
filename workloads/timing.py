"""The declared metric definitions for one request, as pure functions of its record (docs/design.md,
Metric definitions).

- TTFT: first event that carries >= 1 generated token, minus the send time (role-only, empty and
  keep-alive events do not count; a token that decodes to empty text does).
- E2E: last token event minus the send time.
- TPOT: (E2E - TTFT) / (output tokens - 1), output tokens as chosen in the record (usage, else events).
- ITL: the gaps between consecutive token arrivals; an arrival carrying k tokens contributes k gaps of
  gap/k (`itl`). An arrival is one token event, or several read together (the same receive time): k tokens
  that reach the client at once count alike whether the server framed them as one SSE event (vLLM's front end
  when it falls behind) or as k events in one write (ours), or split across TCP segments read at once. The
  per-event view keeps one gap per event (`itl_per_event`).
- client lag: send time minus scheduled time.
- TTFT and E2E from the intended send (`ttft_intended`, `e2e_intended`): the same first and last token
  events minus the *scheduled* time, when the schedule meant the request to be sent, rather than when the
  client sent it. They equal TTFT and E2E plus the client lag, so a client that sends late (it could not
  keep up, or `max_concurrency` held the request back) cannot hide the wait it imposed (coordinated
  omission). Only an open-loop or trace schedule has intended times of its own; the comparator leaves
  these empty for closed-loop points, where a request is sent when a previous one ends.

All return seconds, or None (empty list for ITL) when the record has no such time (failed before the
first token, single-token output, never sent). They do not look at `error_kind`: whether failed requests
count is the comparator's decision.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import pairwise

from workloads.records import RequestRecord


def token_events(record: RequestRecord) -> list[tuple[float, int]]:
    """(arrival_s, n_tokens) of the events that carried at least one generated token."""
    return [(t, n) for t, n, _ in record.events if n > 0]


def first_token_s(record: RequestRecord) -> float | None:
    """Arrival of the first event carrying >= 1 generated token (None: no such event, or never sent)."""
    if record.send_s is None:
        return None
    return next((t for t, n, _ in record.events if n > 0), None)


def last_token_s(record: RequestRecord) -> float | None:
    """Arrival of the last event carrying >= 1 generated token (None: no such event, or never sent)."""
    if record.send_s is None:
        return None
    return next((t for t, n, _ in reversed(record.events) if n > 0), None)


def ttft(record: RequestRecord) -> float | None:
    first = first_token_s(record)
    return None if first is None or record.send_s is None else first - record.send_s


def e2e(record: RequestRecord) -> float | None:
    last = last_token_s(record)
    return None if last is None or record.send_s is None else last - record.send_s


def ttft_intended(record: RequestRecord) -> float | None:
    """TTFT as a user arriving at the scheduled time waits it: first token minus the scheduled send."""
    first = first_token_s(record)
    return None if first is None else first - record.scheduled_s


def e2e_intended(record: RequestRecord) -> float | None:
    """E2E from the scheduled send: last token minus the time the schedule meant the request to go."""
    last = last_token_s(record)
    return None if last is None else last - record.scheduled_s


def tpot(record: RequestRecord) -> float | None:
    first, last = ttft(record), e2e(record)
    if first is None or last is None or record.output_tokens < 2:
        return None
    return (last - first) / (record.output_tokens - 1)


def itl_per_event(record: RequestRecord) -> list[float]:
    """One gap per token event after the first: its arrival minus the previous token event's arrival."""
    times = [t for t, _ in token_events(record)]
    return [b - a for a, b in pairwise(times)]


def token_arrivals(record: RequestRecord) -> list[tuple[float, int]]:
    """(arrival_s, n_tokens) of the token events, those with the same arrival time (read together) merged."""
    return merge_arrivals(token_events(record))


def merge_arrivals(events: Iterable[tuple[float, int]]) -> list[tuple[float, int]]:
    """(time, n_tokens) pairs in time order, consecutive ones at the same time merged into one."""
    arrivals: list[tuple[float, int]] = []
    for t, n in events:
        if arrivals and arrivals[-1][0] == t:
            arrivals[-1] = (t, arrivals[-1][1] + n)
        else:
            arrivals.append((t, n))
    return arrivals


def per_token_gaps(arrivals: Sequence[tuple[float, int]]) -> list[float]:
    """An arrival of k tokens contributes k gaps of (its time minus the previous arrival's)/k."""
    gaps: list[float] = []
    for (t_prev, _), (t, n) in pairwise(arrivals):
        gaps.extend([(t - t_prev) / n] * n)
    return gaps


def itl(record: RequestRecord) -> list[float]:
    """Per-token gaps: an arrival with k tokens contributes k gaps of (its gap)/k."""
    return per_token_gaps(token_arrivals(record))


def client_lag(record: RequestRecord) -> float | None:
    if record.send_s is None:
        return None
    return record.send_s - record.scheduled_s
