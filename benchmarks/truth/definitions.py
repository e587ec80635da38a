"""The truth a benchmark client should have measured, from the scripted server's event log, under each
client's own metric definitions and under ours (docs/design.md), and the client's errors against it.

Why per definition: the clients disagree on what TTFT, TPOT and ITL mean (role-only first chunk counted as
the first token or not, chunks with empty text counted or skipped, TPOT with or without TTFT, ITL per chunk
or per token). Measuring a client against *its own* definition isolates how exactly it times events; measuring
it against the declared definition shows what a user comparing its numbers with ours would see.

Every truth time is the server's: the request's start is the server's `received_s` (the kernel's receive stamp
of the read that completed the request, where the log's `received_clock` is `kernel`; before that change, the
time its handler started), each event's time the server's write time (both CLOCK_MONOTONIC). A client's TTFT
error therefore includes the loopback delivery both ways and whatever the client does between its own start
stamp and the bytes leaving, and, at the other end, between the bytes arriving and its stamp.

Definitions (read in each client's source; see benchmarks/truth/README.md):

- `ours` = docs/design.md: TTFT at the first event carrying >= 1 generated token (role-only chunks do not
  count, empty-text tokens do); TPOT = (last token event - first token event) / (tokens - 1); ITL per token
  (an event with k tokens gives k gaps of gap/k).
- `vllm` (`vllm bench serve`): TTFT at the first chunk with a non-empty `choices` list (the role-only chat
  chunk counts; empty-text chunks count); TPOT = (latency - TTFT) / (usage tokens - 1), latency at the last
  such chunk; ITL = gaps between those chunks.
- `aiperf`: TTFT at the first chunk with non-empty text (role-only and empty-text chunks are skipped); its
  "inter_token_latency" = (last content chunk - first content chunk) / (tokens - 1), which is a TPOT (with
  `--per-chunk-usage`, accepted on the chat endpoint only, the divisor is tokens minus the first content
  chunk's count; not used here); "inter_chunk_latency" = gaps between content chunks, used here as its ITL.
- `guidellm`: TTFT at the first chunk with non-empty text; its "time_per_output_token" = (last content chunk -
  request start) / tokens, TTFT included; its "inter_token_latency" = (last content chunk - first content
  chunk) / (tokens - 1), one value per request (it keeps no per-chunk times).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import numpy as np

from instruments.scripted_server import ScriptedSchedule, token_texts
from workloads import timing

DEFINITIONS = ("ours", "vllm", "aiperf", "guidellm")
METRICS = ("ttft", "tpot", "itl")


@dataclass(frozen=True, slots=True)
class Event:
    """One event the server wrote: its write time, generated tokens, kind, and whether its text was empty."""

    t: float
    tokens: int
    kind: str
    empty_text: bool


@dataclass
class Truth:
    """What the server did for one request."""

    request_id: str
    received: float
    events: list[Event]

    @property
    def output_tokens(self) -> int:
        return sum(e.tokens for e in self.events)


def truth_from_log(entry: Mapping[str, Any], schedule: ScriptedSchedule) -> Truth:
    """One event-log entry as a `Truth`. Whether a token event's text was empty is not logged, but follows
    deterministically from the schedule (the server renders texts with `token_texts`)."""
    raw = entry["events"]
    n_tokens = sum(n for _, n, kind in raw if kind == "token")
    texts = token_texts(n_tokens, schedule.empty_text_every)
    events, done = [], 0
    for t, n, kind in raw:
        empty = False
        if kind == "token":
            empty = "".join(texts[done : done + n]) == ""
            done += n
        events.append(Event(float(t), int(n), kind, empty))
    return Truth(entry["request_id"], float(entry["received_s"]), events)


def _counted(definition: str, event: Event) -> bool:
    """Whether an event marks a "token" time (TTFT, chunk gaps) under a definition."""
    if definition == "ours":
        return event.tokens > 0
    if definition == "vllm":
        return event.kind in ("role", "token")  # every chunk whose `choices` list is not empty
    if definition in ("aiperf", "guidellm"):
        return event.tokens > 0 and not event.empty_text
    raise ValueError(f"unknown definition {definition!r}")


def true_metrics(truth: Truth, definition: str) -> dict[str, Any] | None:
    """{"ttft": s, "tpot": s or None, "itl": [s, ...]} of one request under `definition` (None: no token)."""
    counted = [e for e in truth.events if _counted(definition, e)]
    tokens = [e for e in truth.events if e.tokens > 0]
    n = truth.output_tokens
    if not counted or not tokens:
        return None
    first, last = counted[0].t, counted[-1].t
    ttft = first - truth.received
    tpot: float | None
    itl: list[float]
    if definition == "ours":
        tpot = (tokens[-1].t - tokens[0].t) / (n - 1) if n > 1 else None
        # events at one time (one write) are one arrival, as in timing.itl
        itl = timing.per_token_gaps(timing.merge_arrivals((e.t, e.tokens) for e in tokens))
    elif definition in ("vllm", "aiperf"):  # they differ in which chunks count, not in the formulas
        tpot = (last - first) / (n - 1) if n > 1 else None
        itl = [b.t - a.t for a, b in pairwise(counted)]
    else:  # guidellm
        tpot = (last - truth.received) / n
        itl = [(last - first) / (n - 1)] if n > 1 else []
    return {"ttft": ttft, "tpot": tpot, "itl": itl}


@dataclass
class Measured:
    """One request as a client reported it, in seconds, under the client's own definitions."""

    request_id: str
    ttft: float | None
    tpot: float | None
    itl: list[float] = field(default_factory=list)


@dataclass
class PointErrors:
    """A client's errors at one point (schedule x concurrency), in seconds."""

    own: dict[str, list[float]] = field(default_factory=lambda: {m: [] for m in METRICS})
    declared: dict[str, list[float]] = field(default_factory=lambda: {m: [] for m in METRICS})
    values: dict[str, list[float]] = field(default_factory=lambda: {m: [] for m in METRICS})
    truth_declared: dict[str, list[float]] = field(default_factory=lambda: {m: [] for m in METRICS})
    matched: int = 0
    missing: list[str] = field(default_factory=list)  # reported by the client, not in the server log
    itl_mismatch: int = 0  # requests whose gap count differs from the truth's under the same definition

    def summary(self) -> dict[str, Any]:
        """p50/p99/max |error| in ms (own definition: paired per request or per gap), and against the declared
        definition: paired p99 where the pairing exists, and the difference of the reported distribution's
        p50/p99 from the declared truth's."""
        out: dict[str, Any] = {
            "requests": self.matched,
            "missing": len(self.missing),
            "itl_mismatch": self.itl_mismatch,
        }
        for m in METRICS:
            own = np.abs(np.asarray(self.own[m], dtype=float)) * 1e3
            if own.size:
                out[f"{m}_p50_ms"] = float(np.percentile(own, 50))
                out[f"{m}_p99_ms"] = float(np.percentile(own, 99))
                out[f"{m}_max_ms"] = float(own.max())
                out[f"{m}_n"] = int(own.size)
            dec = np.abs(np.asarray(self.declared[m], dtype=float)) * 1e3
            if dec.size:
                out[f"{m}_declared_paired_p99_ms"] = float(np.percentile(dec, 99))
            vals = np.asarray(self.values[m], dtype=float) * 1e3
            true = np.asarray(self.truth_declared[m], dtype=float) * 1e3
            if vals.size and true.size:
                for q in (50, 99):
                    out[f"{m}_declared_p{q}_diff_ms"] = float(np.percentile(vals, q) - np.percentile(true, q))
                out[f"{m}_declared_mean_diff_ms"] = float(vals.mean() - true.mean())
        return out


def compare(measured: Iterable[Measured], truths: Mapping[str, Truth], definition: str) -> PointErrors:
    """Pair each measured request with the server's truth (by request id) and collect the errors."""
    errors = PointErrors()
    for m in measured:
        truth = truths.get(m.request_id)
        if truth is None:
            errors.missing.append(m.request_id)
            continue
        own = true_metrics(truth, definition)
        declared = true_metrics(truth, "ours")
        if own is None or declared is None:
            errors.missing.append(m.request_id)
            continue
        errors.matched += 1
        for name, value in (("ttft", m.ttft), ("tpot", m.tpot)):
            if value is None:
                continue
            errors.values[name].append(value)
            if own[name] is not None:
                errors.own[name].append(value - own[name])
            if declared[name] is not None:
                errors.declared[name].append(value - declared[name])
        if declared["ttft"] is not None:
            errors.truth_declared["ttft"].append(declared["ttft"])
        if declared["tpot"] is not None:
            errors.truth_declared["tpot"].append(declared["tpot"])
        errors.truth_declared["itl"].extend(declared["itl"])
        errors.values["itl"].extend(m.itl)
        if len(m.itl) == len(own["itl"]):
            errors.own["itl"].extend(_diff(m.itl, own["itl"]))
        else:
            errors.itl_mismatch += 1
        if len(m.itl) == len(declared["itl"]):
            errors.declared["itl"].extend(_diff(m.itl, declared["itl"]))
    return errors


def _diff(a: Sequence[float], b: Sequence[float]) -> list[float]:
    return (np.asarray(a, dtype=float) - np.asarray(b, dtype=float)).tolist()
