"""From the captured pieces of a response body (`workloads/body_capture.py`) to what it said: events,
per-event token counts, usage, finish reason and what went wrong, the same way for the load generator and
for anything reading recorded bytes.
The event framing is `workloads/sse_decoder.py`; the protocol's meaning is the adapter's.

`read_stream(adapter, chunks)` does it in one go. The load generator drives `reading_steps` instead, a
generator that pauses (yields) every ~0.1 ms of work so that reading a finished response does not hold up
the event loop while other streams are still arriving.
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from time import perf_counter

from adapters.base import Adapter, MalformedEvent, StreamEvent
from workloads.records import ErrorKind
from workloads.sse_decoder import SSEDecoder

log = logging.getLogger(__name__)

SLICE_S = 1e-4

Problem = tuple[ErrorKind, str]


@dataclass
class StreamReading:
    """Events in arrival order with their read times and token counts, plus what they add up to."""

    events: list[StreamEvent] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    problem: Problem | None = None
    usage_prompt_tokens: int | None = None
    usage_completion_tokens: int | None = None
    finish_reason: str | None = None
    server_timings: dict[str, float] | None = None  # the last the server's events gave

    @property
    def text(self) -> str:
        return "".join(e.text for e in self.events)

    @property
    def event_tokens(self) -> int:
        return sum(self.counts)


def read_stream(
    adapter: Adapter, chunks: Sequence[tuple[float, bytes]], streaming: bool = True
) -> StreamReading:
    """Read a whole body given as `(read_time, bytes)` pairs; a body that is not an event stream
    (`streaming=False`) is read as one JSON response."""
    return run_to_end(reading_steps(adapter, chunks, streaming, pause_every_s=None))


def run_to_end(steps: Generator[None, None, StreamReading]) -> StreamReading:
    """Finish a `reading_steps` generator without pausing."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def reading_steps(
    adapter: Adapter,
    chunks: Sequence[tuple[float, bytes]],
    streaming: bool,
    pause_every_s: float | None = SLICE_S,
) -> Generator[None, None, StreamReading]:
    """`read_stream`, pausing every `pause_every_s` of work; returns the `StreamReading`."""
    out = StreamReading()
    malformed: str | None = None
    leftover = False
    try:
        if streaming:
            decoder = SSEDecoder()
            parse = adapter.parse_event
            slice_start = perf_counter()
            last = len(chunks) - 1
            for i, (t, data) in enumerate(chunks):
                batch = decoder.feed(data)
                if i == last:
                    tail, leftover = decoder.finish()
                    batch.extend(tail)
                for sse in batch:
                    try:
                        event = parse(sse.data)
                        if sse.event == b"error" and event.error is None:
                            event.error = sse.data.decode("utf-8", "replace")[:500]
                    except MalformedEvent as exc:
                        event = StreamEvent()
                        malformed = malformed or str(exc)
                    out.events.append(event)
                    out.times.append(t)
                if pause_every_s is not None and perf_counter() - slice_start > pause_every_s:
                    yield
                    slice_start = perf_counter()
        elif chunks:
            try:
                out.events.append(adapter.parse_response(b"".join(d for _, d in chunks)))
                out.times.append(chunks[-1][0])
            except MalformedEvent as exc:
                malformed = str(exc)
    except Exception as exc:  # a bug in reading must not lose the record
        log.exception("reading a response body failed")
        del out.events[len(out.times) :]
        out.problem = (ErrorKind.CLIENT_ERROR, f"reading the response failed: {exc!r}")

    out.counts = adapter.count_tokens(out.events) if out.events else []
    for event in out.events:
        if event.usage is not None:
            if event.usage.prompt_tokens is not None:
                out.usage_prompt_tokens = event.usage.prompt_tokens
            if event.usage.completion_tokens is not None:
                out.usage_completion_tokens = event.usage.completion_tokens
        out.finish_reason = event.finish_reason or out.finish_reason
        out.server_timings = event.server_timings or out.server_timings
    if out.problem is None:
        stream_error = next((e.error for e in out.events if e.error is not None), None)
        if stream_error is not None:
            out.problem = (ErrorKind.STREAM_ERROR, stream_error)
        elif malformed is not None:
            out.problem = (ErrorKind.MALFORMED_EVENT, malformed)
        elif leftover:
            out.problem = (ErrorKind.INCOMPLETE_STREAM, "the body ended in the middle of an event")
        elif not adapter.is_complete(out.events):
            out.problem = (
                ErrorKind.INCOMPLETE_STREAM,
                f"the stream ended without its final event "
                f"({adapter.final_event}) after {len(out.events)} events",
            )
    return out
