"""One record per request, appended to `requests.jsonl` as each request ends; one summary per run.

Clock: every `*_s` time is seconds on the monotonic clock (`time.perf_counter()`, CLOCK_MONOTONIC on
Linux, the same clock in every process of the machine) *relative to the run start stamp* `t0_monotonic`,
which each record carries. `t0_monotonic + send_s` is therefore an absolute monotonic time that can be
compared with times logged by another process on the same machine (the scripted server does this).

Records measured on several hosts (`compare run --ray`) are put on the driver's clock: all times of one
record are shifted by the same amount, so every interval within a record (TTFT, ITL, TPOT, E2E, lag) is
the one its own host measured, and only comparisons between records (throughput windows, achieved rate)
rely on the measured clock offset. Such a record says where it was measured (`host`) and the offset
that was added (`clock_offset_s`: driver clock = host clock + offset), so `t0_monotonic + send_s -
clock_offset_s` is again a time on the measuring host's own monotonic clock.

Token counts follow docs/design.md (Metric definitions): `output_tokens` is the server's usage when the
server gave it, else the sum of the per-event counts; the per-event counts, the usage and the client's
re-tokenisation of the text are all kept, and `token_count_mismatch` says whether any two of them that are
known disagree.
"""

from __future__ import annotations

import json
import logging
import lzma
from collections.abc import Iterable
from enum import StrEnum
from pathlib import Path
from typing import IO, Literal

from pydantic import BaseModel, ConfigDict

log = logging.getLogger(__name__)

#: 2: `session_id` and `turn` (multi-turn sessions); version 1 files read as records without sessions
SCHEMA_VERSION = 2


class ErrorKind(StrEnum):
    """Why a request failed. Every failure is one of these; a failed request is a record, not a crash."""

    CONNECTION_REFUSED = "connection_refused"  # nothing listens at the address
    CONNECT_FAILED = "connect_failed"  # other failures to open the connection (DNS, unreachable, ...)
    CONNECT_TIMEOUT = "connect_timeout"  # the connection did not open in time
    CONNECTION_RESET = "connection_reset"  # the peer reset the connection (RST)
    SERVER_DISCONNECTED = "server_disconnected"  # the peer closed the connection before the response ended
    HTTP_STATUS = "http_status"  # a response status other than 200 (body in error_message)
    HEADERS_TIMEOUT = "headers_timeout"  # no response headers within the read timeout
    STALL = "stall"  # the body went silent for longer than the read timeout
    TIMEOUT = "timeout"  # the whole request took longer than the per-request timeout
    MALFORMED_EVENT = "malformed_event"  # an event whose data could not be read (bad JSON, wrong shape)
    STREAM_ERROR = "stream_error"  # the server reported an error inside the stream
    INCOMPLETE_STREAM = "incomplete_stream"  # the body ended cleanly but without the protocol's final event
    CANCELLED = "cancelled"  # the run was stopped (Ctrl-C) while the request was in flight
    CLIENT_LOST = "client_lost"  # the load generator measuring it (a Ray actor, or its node) died mid-request
    CLIENT_ERROR = "client_error"  # an unexpected error in the client itself (a bug: please report)


class RequestRecord(BaseModel):
    """The raw facts about one request; every metric is computed from these (see `workloads.timing`).

    `events` holds every server-sent event that carried data, in arrival order, as
    `(arrival_s, n_tokens, n_chars)`: arrival time of the read that completed the event (the kernel's receive
    stamp of its data where available, workloads/kernel_stamps.py),
    the generated tokens it carried (0 for role-only, usage-only, `[DONE]` and error events)
    and the length of its generated text in characters. SSE comments (keep-alives) are not events.
    """

    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    run_id: str
    request_id: str
    backend: str
    variant: str = ""
    load_point: str = ""
    warmup: bool = False
    t0_monotonic: float
    # what we asked for: the prompt's own token count (a server adds BOS and chat templates: see usage)
    prompt_tokens: int
    wanted_output_tokens: int
    output_length_forced: bool
    # times, seconds after t0_monotonic
    scheduled_s: float
    start_s: float | None = None  # the client began the request (before taking a pooled connection)
    send_s: float | None = None  # the request bytes were handed to the socket (None: never sent)
    headers_s: float | None = None  # response status line and headers were read
    end_s: float | None = None  # the request ended (last byte, error or cancellation)
    events: list[tuple[float, int, int]] = []
    # what came back
    http_status: int | None = None
    finish_reason: str | None = None
    usage_prompt_tokens: int | None = None
    usage_completion_tokens: int | None = None
    event_tokens: int = 0
    output_tokens: int = 0
    output_tokens_source: Literal["usage", "events"] = "events"
    retokenized_tokens: int | None = None
    token_count_mismatch: bool = False
    error_kind: ErrorKind | None = None
    error_message: str | None = None
    # where it was measured, when not by the process that wrote the file (see the module docstring)
    host: str | None = None
    clock_offset_s: float | None = None
    # the conversation it belongs to (multi-turn sessions, workloads/sessions.py) and its turn, from 0
    session_id: str | None = None
    turn: int | None = None
    # the first send went out on a pooled keep-alive connection that the server had already closed and failed
    # before any response byte (the client's stale connection, not a server failure): when that try failed.
    # The request was then sent once more on a new connection; `send_s` is that send, `scheduled_s` and
    # `start_s` stay the request's own, so the lost time shows as client lag
    stale_retry_s: float | None = None
    # the server's own account of the request, where its stream carries one (llama.cpp's `timings`:
    # prompt_n, prompt_ms, predicted_n, predicted_ms, ...), as its last event gave it
    server_timings: dict[str, float] | None = None

    @property
    def ok(self) -> bool:
        return self.error_kind is None


class RunSummary(BaseModel):
    """What one `run_load` call did as a whole: offered against achieved rate, client lag, outcome counts."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    run_id: str
    backend: str
    variant: str = ""
    load_point: str = ""
    t0_monotonic: float
    schedule: dict
    measured_start_s: float
    wall_s: float
    n_warmup: int
    n_measured: int
    n_sent: int
    n_ok: int
    errors: dict[str, int]
    offered_rate: float | None  # requests/s the schedule asked for (None: closed loop)
    achieved_rate: float | None  # requests/s actually sent, from the send times
    lag_p50_s: float | None
    lag_p99_s: float | None
    lag_max_s: float | None
    interrupted: bool = False
    #: the growth of the backend's own counters over the point, warm-up included, under the common names of
    #: its adapter's `metric_names` (`preemptions_total`, ...); None where its `/metrics` was not read
    server_metrics: dict[str, float] | None = None


class RecordWriter:
    """Appends records to a JSON-lines file, one line per record, flushed at once so a crash loses nothing."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] | None = self.path.open("a", encoding="utf-8")

    def append(self, item: BaseModel) -> None:
        if self._file is None:
            raise ValueError(f"{self.path} is closed")
        self._file.write(item.model_dump_json() + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_json_lines(path: str | Path) -> Iterable[tuple[int, dict]]:
    """(line number, object) of each JSON line of a file appended to as things happen; a partial last line
    (a write cut short by a crash) is skipped with a warning, any other bad line is an error. A `.xz` file
    (a committed run directory keeps its records compressed) is read through lzma."""
    path = Path(path)
    if path.suffix == ".xz":
        with lzma.open(path, "rt", encoding="utf-8") as stream:
            text = stream.read()
    else:
        text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as exc:
            if number == len(lines):  # last line without newline: a write cut short by a crash
                log.warning("%s: ignoring a partial last line (%d characters)", path, len(line))
                return
            raise ValueError(f"{path}:{number}: not a JSON line: {exc}") from exc


def read_records(path: str | Path, include_warmup: bool = True) -> list[RequestRecord]:
    """Read every record from a requests.jsonl file (a partial last line from a crash is skipped)."""
    records = [RequestRecord.model_validate(obj) for _, obj in read_json_lines(path)]
    return records if include_warmup else [r for r in records if not r.warmup]


def read_run_summaries(path: str | Path) -> list[RunSummary]:
    return [RunSummary.model_validate(obj) for _, obj in read_json_lines(path)]
