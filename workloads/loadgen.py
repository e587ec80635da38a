"""The load generator: sends token-exact requests on a schedule and records, per request, when every
byte-level fact happened.

One asyncio loop (via `run_load_sync`: asyncio's own on Linux, where socket reads carry the kernel's receive
stamps, uvloop elsewhere when installed), one shared aiohttp session with keep-alive and a connection pool
sized to the load. The hot path does as little as possible: each socket read is stamped with the kernel's
receive time of its data (`workloads.kernel_stamps`, `workloads.body_capture`), and the request's coroutine
wakes once, when the body has ended; the server-sent events are then decoded and read by the adapter, each
stamped with the time of the socket read that completed it. The client's own queueing (hundreds of streams
readable at once) thereby stays out of the timestamps.

A record is appended to `requests.jsonl` (flushed) as each request ends, failed or not (a single recorder
task reads the finished responses a slice at a time, so a record lands a few milliseconds after its request
ended, and many requests ending at once do not hold up the others' timestamps). Cancelling the run
(Ctrl-C under `run_load_sync`, or cancelling the task running `run_load`) records the requests in flight
as `cancelled` and returns normally with everything recorded so far.

    records = run_load_sync(PointJob("http://127.0.0.1:8000", get_adapter("vllm"), specs, ClosedLoop(8),
                                     output_path=Path("runs/x/requests.jsonl")))
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import gc
import itertools
import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from time import perf_counter
from typing import Any

import aiohttp
import numpy as np
from yarl import URL

from adapters.base import Adapter
from adapters.request_spec import RequestSpec, lap_id
from workloads.body_capture import StampingConnector, StampingHandler, read_stamped
from workloads.kernel_stamps import stamped_loop_factory
from workloads.records import ErrorKind, RecordWriter, RequestRecord, RunSummary
from workloads.response_parsing import SLICE_S, StreamReading, reading_steps, run_to_end
from workloads.schedule import ClosedLoop, OpenLoop, Schedule, TraceReplay
from workloads.sessions import Session, conversation_turn
from workloads.timing import client_lag

log = logging.getLogger(__name__)

ERROR_BODY_LIMIT = 4096  # bytes of a non-200 response body kept in the record
READ_BUFFER = 2**20  # aiohttp's read buffer size per connection
GC_EVERY_FAILURES = 2000  # one garbage collection per this many failed requests (see run_load)


@dataclass(frozen=True)
class Timeouts:
    """`request_s`: the whole request (-> `timeout`). `read_s`: longest silence while waiting for the
    response headers (-> `headers_timeout`) or between two reads of the body (-> `stall`); None: no limit.
    `connect_s`: opening a TCP connection (-> `connect_timeout`)."""

    request_s: float = 600.0
    read_s: float | None = 120.0
    connect_s: float = 10.0


TokenCounter = Callable[[str], int]


def token_counter(tokenizer: Any) -> TokenCounter:
    """A text -> token count function from a Hugging Face tokenizer, a `tokenizers.Tokenizer`, or a
    callable."""
    if hasattr(tokenizer, "encode"):

        def count(text: str) -> int:
            ids = tokenizer.encode(text, add_special_tokens=False)
            return len(getattr(ids, "ids", ids))

        return count
    if callable(tokenizer):
        return tokenizer
    raise TypeError(f"cannot count tokens with {type(tokenizer).__name__}: give a tokenizer or a callable")


@dataclass(frozen=True, slots=True)
class _RawResponse:
    """What the hot path collected for one request, before any decoding."""

    start: float
    send: float | None
    headers: float | None
    end: float
    status: int | None
    chunks: list[tuple[float, bytes]]
    streaming: bool
    error: tuple[ErrorKind, str] | None
    stale_retry: float | None = None  # when a first try on a stale pooled connection failed (then retried)


@dataclass(frozen=True, slots=True)
class _Prepared:
    """A request ready to send: built and encoded before the run so the hot path only sends."""

    request_id: str
    spec: RequestSpec
    url: URL
    body: bytes
    headers: dict[str, str]
    session_id: str | None = None  # multi-turn sessions: the conversation and its turn
    turn: int | None = None


#: called as each request begins: (request id, scheduled time, start time, warm-up), perf_counter seconds
StartHook = Callable[[str, float, float, bool], None]


@dataclass(frozen=True)
class PointJob:
    """One load point: where and what to send on which schedule, its bounds and labels, where its records
    go, and who hears of them. `run_load` takes one; so does the Ray load (`workloads.distributed.RayLoad`),
    which splits it over its actors.

    - warm-up: `warmup_specs` are sent first and recorded with `warmup=True` (their consumers exclude
      them from results). In a closed loop every worker takes warm-up requests until none is left, then
      measured ones, so the measured phase starts at full concurrency; before an open loop or a trace they
      run as a closed loop at `warmup_concurrency` (default min(8, count)).
    - `ramp_up_s` (closed loop): workers start this far apart in total (default 1 ms per worker, at most
      5 s), so that a thousand streams do not all send in the same instant.
    - bounds: `max_requests` (specs are cycled, ids suffixed `~k`, if it exceeds their number) and
      `max_duration_s` (no new request after it; in-flight ones finish). Without either, each spec once.
    - `output_path`: requests.jsonl to append to; the run summary goes to `summary_path` (default:
      `runs.jsonl` beside it).
    - labels: `backend` (default: the adapter's name), `variant`, `load_point` (default: the schedule's
      label) and `run_id` (default: a new one) go into every record.
    - `tokenizer`: re-tokenises each response's text as a cross-check of the token counts.
    - `start_at` (perf_counter seconds): the measured schedule starts then, after preparation and any
      open-loop warm-up (closed loop: the workers start then), so that load generators on several hosts
      can start together; a late start shows as client lag.
    - `busy_poll` (`run_load_sync` only): see `keep_awake`.
    - `progress(records)` is called every `progress_interval_s` with the records so far (do not modify).
    - `on_record(record)` is called with each record as it is stored, and `on_start(request_id, scheduled,
      start, warmup)` as each request begins (perf_counter seconds): what a caller streaming records
      elsewhere needs to know which requests are in flight.
    - `sessions` (closed loop only; `specs` may then be empty): multi-turn conversations
      (`workloads.sessions`) sent instead of `specs`. The concurrency counts sessions: each worker takes the
      next session and sends its turns in order, turn k when turn k-1's answer has ended and its think time
      passed (that time is the record's scheduled time), carrying the conversation so far (`tokenizer`
      needed). A failed turn ends its session. `max_requests` bounds the number of sessions (never
      cycled: a replayed conversation would hit the prefix cache); `max_duration_s` starts no new session
      after it, while sessions under way finish.
    - `spec_stream` (a `workloads.datasets.PromptStream`): the measured requests (with `sessions`: the
      sessions) come from it instead, each once and never cycled, made chunk by chunk ahead of need in a
      background thread (`PromptStream.supply`; its stats are appended to `spec_stream.supplied` when the
      point ends); `specs` (`sessions`) then hold its first chunk, for whoever reads the job without it.
      `max_requests` still bounds the count.
    - `server_metrics()` is called once the load has ended, just before the summary is written; what it
      returns (the backend's counters' growth over the point, or None) is the summary's `server_metrics`.
    """

    url: str
    adapter: Adapter
    specs: Sequence[RequestSpec]
    schedule: Schedule
    output_path: str | Path | None = None
    summary_path: str | Path | None = None
    warmup_specs: Sequence[RequestSpec] = ()
    warmup_concurrency: int | None = None
    ramp_up_s: float | None = None
    max_requests: int | None = None
    max_duration_s: float | None = None
    backend: str | None = None
    variant: str = ""
    load_point: str | None = None
    run_id: str | None = None
    timeouts: Timeouts = Timeouts()
    tokenizer: Any = None
    start_at: float | None = None
    busy_poll: bool = False
    progress: Callable[[list[RequestRecord]], None] | None = None
    progress_interval_s: float = 1.0
    on_record: Callable[[RequestRecord], None] | None = None
    on_start: StartHook | None = None
    sessions: Sequence[Session] = ()
    spec_stream: Any = None
    server_metrics: Callable[[], dict[str, float] | None] | None = None

    def resolved(self) -> PointJob:
        """The job with its defaults filled in: labels, run id and summary path."""
        summary = self.summary_path
        if summary is None and self.output_path is not None:
            summary = Path(self.output_path).with_name("runs.jsonl")
        return replace(
            self,
            backend=self.backend or self.adapter.name,
            load_point=self.load_point or self.schedule.label,
            run_id=self.run_id or uuid.uuid4().hex[:12],
            summary_path=summary,
        )


class _Run:
    def __init__(self, job: PointJob, writer: RecordWriter | None, count_tokens: TokenCounter | None) -> None:
        """`job` resolved (`PointJob.resolved`)."""
        self.base = URL(job.url)
        if not self.base.is_absolute():
            raise ValueError(f"endpoint URL must be absolute (http://host:port), got {job.url!r}")
        self.adapter = job.adapter
        self.timeouts = job.timeouts
        self.writer = writer
        self.count_tokens = count_tokens
        assert job.backend is not None and job.load_point is not None and job.run_id is not None
        self.backend, self.variant, self.load_point = job.backend, job.variant, job.load_point
        self.run_id = job.run_id
        self.progress = job.progress
        self.on_record, self.on_start = job.on_record, job.on_start
        self.records: list[RequestRecord] = []
        self.t0 = perf_counter()
        self.session: aiohttp.ClientSession | None = None
        self.fresh_session: aiohttp.ClientSession | None = None  # for retries after a stale connection
        self._urls: dict[str, URL] = {}
        self._failures = 0
        self.measured_start: float | None = None
        self.finished: collections.deque[tuple[_Prepared, float, bool, _RawResponse]] = collections.deque()
        self._work = asyncio.Event()
        self.tokenizer = job.tokenizer
        self._answers: dict[str, asyncio.Future[tuple[RequestRecord, str]]] = {}  # session turns awaited

    # -- preparing -----------------------------------------------------------------------------------

    def prepare(self, spec: RequestSpec, request_id: str) -> _Prepared:
        request = self.adapter.build_request(spec, stream=True)
        url = self._urls.get(request.path)
        if url is None:
            url = self._urls[request.path] = self.base.join(URL(request.path))
        headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream",
            **request.headers,
            **spec.extra_headers,
            "X-Request-Id": request_id,
        }
        body = json.dumps(request.body, separators=(",", ":"), ensure_ascii=False).encode()
        return _Prepared(request_id, spec, url, body, headers)

    # -- one request ---------------------------------------------------------------------------------

    async def execute(self, item: _Prepared, scheduled: float, warmup: bool) -> None:
        """Send one request and hand what happened to `record_finished`; never raises except
        CancelledError (after handing over). A first try that fails on a reused pooled connection before
        any response byte (`_stale_connection`) is sent once more on a new connection."""
        assert self.session is not None
        stamps: dict[str, Any] = {}
        chunks: list[tuple[float, bytes]] = []
        status: int | None = None
        headers_t: float | None = None
        streaming = True
        error: tuple[ErrorKind, str] | None = None
        cancelled = False
        stale_at: float | None = None
        start = perf_counter()
        if self.on_start is not None:
            self.on_start(item.request_id, scheduled, start, warmup)
        deadline = asyncio.timeout(self.timeouts.request_s)
        try:
            async with deadline:
                while True:
                    session = self.session if stale_at is None else self._fresh_session()
                    try:
                        async with session.post(
                            item.url, data=item.body, headers=item.headers, trace_request_ctx=stamps
                        ) as resp:
                            headers_t = perf_counter()
                            protocol = resp.connection.protocol if resp.connection is not None else None
                            if isinstance(protocol, StampingHandler) and protocol.last_rx:
                                headers_t = min(headers_t, protocol.last_rx)  # the read that brought them
                            status = resp.status
                            if status != 200:
                                body = await _read_limited(resp.content, ERROR_BODY_LIMIT)
                                error = (
                                    ErrorKind.HTTP_STATUS,
                                    f"HTTP {status} {resp.reason or ''}: "
                                    f"{body.decode('utf-8', 'replace')}".strip(),
                                )
                            else:
                                streaming = resp.content_type == "text/event-stream"
                                await read_stamped(resp, chunks)
                        break
                    except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                        if stale_at is not None or not _stale_connection(exc, stamps, headers_t, chunks):
                            raise
                        stale_at = perf_counter()
                        stamps = {}
        except asyncio.CancelledError:
            error = (ErrorKind.CANCELLED, "the run was stopped while this request was in flight")
            cancelled = True
        except Exception as exc:  # every failure becomes a record
            error = _classify(exc, deadline.expired(), headers_t is not None, self.timeouts)
            self._failures += 1
            if self._failures % GC_EVERY_FAILURES == 0:
                gc.collect()
        end = perf_counter()
        raw = _RawResponse(
            start, stamps.get("send"), headers_t, end, status, chunks, streaming, error, stale_at
        )
        self.finished.append((item, scheduled, warmup, raw))
        self._work.set()
        if cancelled:
            raise asyncio.CancelledError

    def _fresh_session(self) -> aiohttp.ClientSession:
        """A session whose every request opens a connection of its own (closed after it): where a retry of a
        request whose pooled connection had gone stale goes, so that it cannot meet another stale one."""
        if self.fresh_session is None:
            assert self.session is not None
            connector = StampingConnector(force_close=True, limit=0, ttl_dns_cache=None)
            self.fresh_session = aiohttp.ClientSession(
                connector=connector,
                timeout=self.session.timeout,
                read_bufsize=READ_BUFFER,
                trace_configs=[_trace_config()],
                raise_for_status=False,
            )
        return self.fresh_session

    # -- turning the raw facts into records ----------------------------------------------------------

    async def record_finished(self) -> None:
        """The one task that reads finished responses and writes their records, a ~0.1 ms slice of work
        at a time: when many requests end together, their reading cannot hold up the loop for long, and
        the workers move on to their next request meanwhile."""
        while True:
            while self.finished:
                item, scheduled, warmup, raw = self.finished[0]  # left in place until stored: if this task
                reading = StreamReading()  # is cancelled, record_all_now still has it
                if raw.status == 200:
                    reading = await _drive(reading_steps(self.adapter, raw.chunks, raw.streaming, SLICE_S))
                self.finished.popleft()
                self._store(self._record(item, scheduled, warmup, raw, reading), reading.text)
            self._work.clear()
            await self._work.wait()

    def record_all_now(self) -> None:
        """Record what is still waiting, without pausing (the run is over)."""
        while self.finished:
            item, scheduled, warmup, raw = self.finished.popleft()
            reading = StreamReading()
            if raw.status == 200:
                reading = run_to_end(reading_steps(self.adapter, raw.chunks, raw.streaming, None))
            self._store(self._record(item, scheduled, warmup, raw, reading), reading.text)

    def _store(self, record: RequestRecord, text: str) -> None:
        self.records.append(record)
        if self.writer is not None:
            self.writer.append(record)
        if self.on_record is not None:
            self.on_record(record)
        answer = self._answers.pop(record.request_id, None)
        if answer is not None and not answer.done():  # a session's turn: its next turn needs the text
            answer.set_result((record, text))

    def _record(
        self, item: _Prepared, scheduled: float, warmup: bool, raw: _RawResponse, reading: StreamReading
    ) -> RequestRecord:
        t0 = self.t0
        error = raw.error or reading.problem  # a transport error explains everything after it
        events = reading.events
        usage_completion = reading.usage_completion_tokens
        event_tokens = reading.event_tokens
        retokenized = self.count_tokens(reading.text) if self.count_tokens is not None and events else None
        counts = (usage_completion, event_tokens if events else None, retokenized)
        known = {n for n in counts if n is not None}
        return RequestRecord(
            run_id=self.run_id,
            request_id=item.request_id,
            backend=self.backend,
            variant=self.variant,
            load_point=self.load_point,
            warmup=warmup,
            t0_monotonic=t0,
            prompt_tokens=item.spec.prompt_len,
            wanted_output_tokens=item.spec.wanted_output_tokens,
            output_length_forced=self.adapter.forces_output_length,
            scheduled_s=scheduled - t0,
            start_s=raw.start - t0,
            send_s=None if raw.send is None else raw.send - t0,
            headers_s=None if raw.headers is None else raw.headers - t0,
            end_s=raw.end - t0,
            events=[
                (t - t0, n, len(e.text))
                for t, n, e in zip(reading.times, reading.counts, events, strict=True)
            ],
            http_status=raw.status,
            finish_reason=reading.finish_reason,
            usage_prompt_tokens=reading.usage_prompt_tokens,
            usage_completion_tokens=usage_completion,
            event_tokens=event_tokens,
            output_tokens=usage_completion if usage_completion is not None else event_tokens,
            output_tokens_source="usage" if usage_completion is not None else "events",
            retokenized_tokens=retokenized,
            token_count_mismatch=len(known) > 1,
            error_kind=None if error is None else error[0],
            error_message=None if error is None else error[1],
            session_id=item.session_id,
            turn=item.turn,
            stale_retry_s=None if raw.stale_retry is None else raw.stale_retry - t0,
            server_timings=reading.server_timings,
        )

    # -- schedules -----------------------------------------------------------------------------------

    async def closed_loop(
        self,
        warm: Iterator[_Prepared],
        units: Iterator[Any],
        concurrency: int,
        ramp_up_s: float,
        max_duration_s: float | None,
        run_unit: Callable[[Any, float], Awaitable[None]] | None = None,
    ) -> None:
        """`concurrency` workers, started `ramp_up_s / concurrency` apart, each sending its next unit of work
        when the last one ends: warm-up requests first, then the measured units, so the measured phase starts
        at full concurrency without a burst. A unit is a request, or with `run_unit` (`run_session`) a whole
        session. The duration bound counts from the first measured unit."""
        deadline: list[float] = []
        run_unit = run_unit or (lambda item, now: self.execute(item, now, False))

        async def worker(k: int) -> None:
            if ramp_up_s and k:
                await asyncio.sleep(k * ramp_up_s / concurrency)
            for item in warm:  # the iterators are shared: each worker takes the next request
                await self.execute(item, perf_counter(), True)
            for unit in units:
                now = perf_counter()
                if self.measured_start is None:
                    self.measured_start = now
                    if max_duration_s is not None:
                        deadline.append(now + max_duration_s)
                if deadline and now >= deadline[0]:
                    return
                await run_unit(unit, now)

        await _gather_all([worker(k) for k in range(concurrency)])

    async def run_session(self, session: Session, start: float) -> None:
        """The turns of one session in order, each sent its think time after the previous answer ended and
        carrying the conversation so far; the session ends at its first failed turn. The conversation is
        built here, between requests, so the sending and its timestamps stay as for any request."""
        previous: RequestSpec | None = None
        answer, when = "", start
        for k in range(len(session.turns)):
            while (delay := when - perf_counter()) > 0:
                await asyncio.sleep(delay)
            spec = conversation_turn(session, k, previous, answer, self.tokenizer)
            item = replace(self.prepare(spec, spec.request_id), session_id=session.session_id, turn=k)
            done = asyncio.get_running_loop().create_future()
            self._answers[item.request_id] = done
            await self.execute(item, when, False)
            record, answer = await done
            if not record.ok or k + 1 == len(session.turns):
                return
            previous = spec
            when = self.t0 + (record.end_s or 0.0) + session.think_s[k + 1]

    async def open_loop(
        self,
        items: Iterator[_Prepared],
        offsets: Iterator[float],
        start: float,
        deadline: float | None,
        max_concurrency: int | None,
    ) -> None:
        slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        inflight: set[asyncio.Task] = set()

        async def send(item: _Prepared, when: float) -> None:
            if slots is None:
                await self.execute(item, when, False)
                return
            async with slots:
                await self.execute(item, when, False)

        try:
            for item, offset in zip(items, offsets, strict=False):
                when = start + offset
                if deadline is not None and when >= deadline:
                    break
                # the loop's timers may fire up to a millisecond early: sleep again for what is left
                while (delay := when - perf_counter()) > 0:
                    await asyncio.sleep(delay)
                task = asyncio.create_task(send(item, when))
                inflight.add(task)
                task.add_done_callback(inflight.discard)
            await _gather_all(list(inflight))
        except asyncio.CancelledError:
            await _cancel_all(list(inflight))
            raise

    async def report_progress(self, interval: float) -> None:
        assert self.progress is not None
        while True:
            await asyncio.sleep(interval)
            try:
                self.progress(self.records)
            except Exception:
                log.exception("the progress callback failed; the run goes on")


async def _drive(steps: Generator[None, None, StreamReading]) -> StreamReading:
    """Run `reading_steps`, letting the event loop in at each pause."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value
        await asyncio.sleep(0)


async def _gather_all(coros_or_tasks: Sequence[Any]) -> None:
    """Run all to the end; on cancellation cancel all and wait until each has recorded itself."""
    tasks = [asyncio.ensure_future(c) for c in coros_or_tasks]
    try:
        await asyncio.gather(*tasks)
    except asyncio.CancelledError:
        await _cancel_all(tasks)
        raise


async def _cancel_all(tasks: Sequence[asyncio.Future]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _read_limited(content: aiohttp.StreamReader, limit: int) -> bytes:
    parts: list[bytes] = []
    size = 0
    while size < limit:
        data = await content.read(limit - size)
        if not data:
            break
        parts.append(data)
        size += len(data)
    return b"".join(parts)


def _stale_connection(
    exc: BaseException, stamps: dict[str, Any], headers_t: float | None, chunks: list[tuple[float, bytes]]
) -> bool:
    """Whether a failed try met the client's own stale keep-alive connection rather than a failing server:
    it went out on a pooled connection that had served an earlier response (`reuseconn` stamp), failed
    with a disconnect, reset or broken pipe, and no byte of a response had arrived. A server that closes a
    keep-alive connection after its last response (llama.cpp's llama-server does, after a stream) races the
    next request sent on it; HTTP clients retry such a request once (RFC 9112, 9.3.1)."""
    if not stamps.get("reused") or headers_t is not None or chunks:
        return False
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return True
    return any(
        isinstance(c, ConnectionResetError | BrokenPipeError)
        or getattr(c, "errno", None) in (errno.ECONNRESET, errno.EPIPE)
        for c in _chain(exc)
    )


def _classify(
    exc: BaseException, total_expired: bool, headers_seen: bool, timeouts: Timeouts
) -> tuple[ErrorKind, str]:
    """Map an exception from the HTTP exchange to an error kind and a message."""
    text = f"{type(exc).__name__}: {exc}".strip()
    if total_expired:
        return ErrorKind.TIMEOUT, f"the request took longer than {timeouts.request_s} s"
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return ErrorKind.CONNECT_TIMEOUT, f"no connection within {timeouts.connect_s} s ({text})"
    if isinstance(exc, TimeoutError):  # aiohttp's read timeout
        if headers_seen:
            return ErrorKind.STALL, f"no data for {timeouts.read_s} s in the body ({text})"
        return ErrorKind.HEADERS_TIMEOUT, f"no response headers within {timeouts.read_s} s ({text})"
    if isinstance(exc, aiohttp.ClientConnectorError):
        if isinstance(exc.os_error, ConnectionRefusedError) or exc.os_error.errno == errno.ECONNREFUSED:
            return ErrorKind.CONNECTION_REFUSED, text
        return ErrorKind.CONNECT_FAILED, text
    causes = list(_chain(exc))
    if any(
        isinstance(c, ConnectionResetError) or getattr(c, "errno", None) == errno.ECONNRESET for c in causes
    ):
        return ErrorKind.CONNECTION_RESET, text
    if isinstance(exc, aiohttp.ClientPayloadError) and "ConnectionResetError" in str(exc):
        # aiohttp keeps the socket error of a body cut short only in the message of ClientPayloadError
        return ErrorKind.CONNECTION_RESET, text
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        return ErrorKind.SERVER_DISCONNECTED, text
    if isinstance(exc, aiohttp.ClientOSError | aiohttp.ServerConnectionError):
        return ErrorKind.SERVER_DISCONNECTED, text
    return ErrorKind.CLIENT_ERROR, text


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _items(run: _Run, specs: Sequence[RequestSpec], count: int | None) -> Iterator[_Prepared]:
    """Prepared requests: each spec once, or cycled to `count` (None: forever) with `~k` id suffixes."""
    prepared = [run.prepare(spec, spec.request_id) for spec in specs]
    seen: set[str] = set()
    for p in prepared:
        if p.request_id in seen:
            raise ValueError(f"request id {p.request_id!r} appears twice in the specs")
        seen.add(p.request_id)
    laps = itertools.count() if count is None else range(-(-count // len(prepared)) if prepared else 0)
    produced = 0
    for lap in laps:
        for p in prepared:
            if count is not None and produced >= count:
                return
            produced += 1
            if lap == 0:
                yield p
            else:
                resent = lap_id(p.request_id, lap)
                yield _Prepared(resent, p.spec, p.url, p.body, {**p.headers, "X-Request-Id": resent})


def _trace_config() -> aiohttp.TraceConfig:
    """Stamps the moment the request bytes are handed to the socket (the body write, headers coalesced)."""
    config = aiohttp.TraceConfig()

    async def on_chunk_sent(_session: Any, ctx: Any, _params: Any) -> None:
        stamps = ctx.trace_request_ctx
        if stamps is not None and "send" not in stamps:
            stamps["send"] = perf_counter()

    async def on_reuse(_session: Any, ctx: Any, _params: Any) -> None:
        if ctx.trace_request_ctx is not None:
            ctx.trace_request_ctx["reused"] = True  # taken from the pool: it served an earlier response

    config.on_request_chunk_sent.append(on_chunk_sent)
    config.on_connection_reuseconn.append(on_reuse)
    return config


async def run_load(job: PointJob) -> list[RequestRecord]:
    """Drive `job.url` (e.g. `http://127.0.0.1:8000`) with `job.specs` on `job.schedule` and return every
    record (see `PointJob` for the rest). Cancellation records the in-flight requests as `cancelled` and
    returns normally."""
    job = job.resolved()
    _check(job)
    writer = RecordWriter(job.output_path) if job.output_path is not None else None
    run = _Run(job, writer, token_counter(job.tokenizer) if job.tokenizer is not None else None)
    count = (
        job.max_requests
        if job.max_requests is not None
        else (None if job.max_duration_s is not None else len(job.specs))
    )
    items: Iterator[_Prepared] = iter(())
    supply = units = None
    if job.spec_stream is not None:  # made as the point needs them (the first chunk now)
        supply = job.spec_stream.supply(None if job.sessions else (lambda s: run.prepare(s, s.request_id)))
        units = supply if job.max_requests is None else itertools.islice(supply, job.max_requests)
    if not job.sessions:
        # builds and checks every request before anything is sent (a stream: its first chunk)
        items = units if units is not None else _items(run, job.specs, count)
        first = next(items)
        items = itertools.chain([first], items)
    warm_items = list(_items(run, job.warmup_specs, len(job.warmup_specs))) if job.warmup_specs else []

    # the pool holds as many connections as requests can be in flight (0: no limit, for an uncapped open loop)
    schedule, timeouts = job.schedule, job.timeouts
    pool = schedule.concurrency if isinstance(schedule, ClosedLoop) else schedule.max_concurrency or 0
    connector = StampingConnector(limit=pool, limit_per_host=0, keepalive_timeout=60.0, ttl_dns_cache=None)
    client_timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=timeouts.connect_s, sock_read=timeouts.read_s
    )
    interrupted = False
    progress_task = None
    with _collection_paused():
        async with aiohttp.ClientSession(
            connector=connector,
            timeout=client_timeout,
            read_bufsize=READ_BUFFER,
            trace_configs=[_trace_config()],
            raise_for_status=False,
        ) as session:
            run.session = session
            if job.progress is not None:
                progress_task = asyncio.create_task(run.report_progress(job.progress_interval_s))
            recorder = asyncio.create_task(run.record_finished())
            try:
                await _send_all(run, job, warm_items, items, units if job.sessions else None)
            except asyncio.CancelledError:
                interrupted = True
                task = asyncio.current_task()
                if task is not None:
                    task.uncancel()
                log.warning("run %s interrupted: in-flight requests recorded as cancelled", run.run_id)
            finally:
                if run.fresh_session is not None:
                    await run.fresh_session.close()
                if supply is not None:
                    supply.close()
                recorder.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await recorder
                run.record_all_now()
                if progress_task is not None:
                    progress_task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await progress_task
                    with contextlib.suppress(Exception):
                        job.progress(run.records)  # type: ignore[misc]
    summary = with_server_metrics(_summary(run, job, interrupted), job)
    if writer is not None:
        writer.close()
    if job.summary_path is not None:
        with RecordWriter(job.summary_path) as summary_writer:
            summary_writer.append(summary)
    return run.records


def _check(job: PointJob) -> None:
    if not job.specs and not job.sessions:
        raise ValueError("no request specs to send")
    if job.sessions:
        if not isinstance(job.schedule, ClosedLoop):
            raise ValueError("sessions are sent in a closed loop (the concurrency counts sessions)")
        if job.tokenizer is None and any(len(s.turns) > 1 for s in job.sessions):
            raise ValueError("sessions of several turns need the tokenizer (to carry the answers)")
        ids = [s.session_id for s in job.sessions]
        if len(set(ids)) != len(ids):
            raise ValueError("two sessions share an id")
    if job.max_requests is not None and job.max_requests < 1:
        raise ValueError(f"max_requests must be >= 1, got {job.max_requests}")
    if job.max_duration_s is not None and not job.max_duration_s > 0:
        raise ValueError(f"max_duration_s must be > 0, got {job.max_duration_s}")


@contextlib.contextmanager
def _collection_paused() -> Iterator[None]:
    """The cyclic garbage collector pauses the loop for 1-20 ms per collection, long enough to show in the
    timestamps. Measured, a successful request leaves no cyclic garbage, so collection is paused for the
    run (after freezing what already exists); failed connections leave about 90 objects each, so every
    GC_EVERY_FAILURES of them trigger one collection (`_Run.execute`)."""
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.unfreeze()
        if gc_was_enabled:
            gc.enable()


async def _send_all(
    run: _Run,
    job: PointJob,
    warm_items: list[_Prepared],
    items: Iterator[_Prepared],
    sessions: Iterator[Session] | None = None,
) -> None:
    """The warm-up and the measured requests on the job's schedule (`sessions`: from `job.spec_stream`)."""
    schedule = job.schedule
    if isinstance(schedule, ClosedLoop):
        if job.start_at is not None and (delay := job.start_at - perf_counter()) > 0:
            await asyncio.sleep(delay)
        ramp = min(schedule.concurrency * 1e-3, 5.0) if job.ramp_up_s is None else job.ramp_up_s
        if job.sessions:
            if sessions is None:
                sessions = iter(job.sessions[: job.max_requests] if job.max_requests else job.sessions)
            await run.closed_loop(
                iter(warm_items), sessions, schedule.concurrency, ramp, job.max_duration_s, run.run_session
            )
        else:
            await run.closed_loop(iter(warm_items), items, schedule.concurrency, ramp, job.max_duration_s)
        return
    if warm_items:
        concurrency = job.warmup_concurrency or min(len(warm_items), 8)
        await run.closed_loop(iter(warm_items), iter(()), concurrency, 0.0, None)
    run.measured_start = start = perf_counter() if job.start_at is None else job.start_at
    deadline = None if job.max_duration_s is None else start + job.max_duration_s
    await run.open_loop(items, schedule.iter_offsets(), start, deadline, schedule.max_concurrency)


def _summary(run: _Run, job: PointJob, interrupted: bool) -> RunSummary:
    return build_summary(
        run.records,
        job,
        t0=run.t0,
        measured_start=run.measured_start or run.t0,
        end=perf_counter(),
        interrupted=interrupted,
        describe=job.schedule.describe() | {"adapter": run.adapter.describe()},
    )


def with_server_metrics(summary: RunSummary, job: PointJob) -> RunSummary:
    """`summary` with what the job's `server_metrics` says now; a failure there costs the point nothing."""
    if job.server_metrics is None:
        return summary
    try:
        found = job.server_metrics()
    except Exception:
        log.exception("reading the server's counters failed; the point keeps its summary without them")
        return summary
    return summary.model_copy(update={"server_metrics": found})


def build_summary(
    records: Sequence[RequestRecord],
    job: PointJob,
    *,
    t0: float,
    measured_start: float,
    end: float,
    interrupted: bool,
    describe: dict,
) -> RunSummary:
    """The run summary of `records` of the resolved `job`, whose times are all relative to `t0` (one clock:
    several load generators' records must first be put on one timeline)."""
    assert job.run_id is not None and job.backend is not None and job.load_point is not None, "not resolved"
    schedule = job.schedule
    measured = [r for r in records if not r.warmup]
    sends = sorted(r.send_s for r in measured if r.send_s is not None)
    lags = np.array([lag for r in measured if (lag := client_lag(r)) is not None])
    errors: dict[str, int] = {}
    for r in measured:
        if r.error_kind is not None:
            errors[str(r.error_kind)] = errors.get(str(r.error_kind), 0) + 1
    offered = schedule.rate if isinstance(schedule, OpenLoop | TraceReplay) else None
    achieved = (len(sends) - 1) / (sends[-1] - sends[0]) if len(sends) > 1 and sends[-1] > sends[0] else None
    return RunSummary(
        run_id=job.run_id,
        backend=job.backend,
        variant=job.variant,
        load_point=job.load_point,
        t0_monotonic=t0,
        schedule=describe,
        measured_start_s=measured_start - t0,
        wall_s=end - t0,
        n_warmup=len(records) - len(measured),
        n_measured=len(measured),
        n_sent=len(sends),
        n_ok=sum(r.ok for r in measured),
        errors=errors,
        offered_rate=offered,
        achieved_rate=achieved,
        lag_p50_s=float(np.percentile(lags, 50)) if lags.size else None,
        lag_p99_s=float(np.percentile(lags, 99)) if lags.size else None,
        lag_max_s=float(lags.max()) if lags.size else None,
        interrupted=interrupted,
    )


def run_load_sync(job: PointJob) -> list[RequestRecord]:
    """`run_load` in a fresh event loop (`new_runner`). Ctrl-C stops the run cleanly: in-flight
    requests are recorded as cancelled and the records so far are returned. `job.busy_poll`: see
    `keep_awake`."""
    with new_runner() as runner:
        return runner.run(_awake(run_load(job)) if job.busy_poll else run_load(job))


async def keep_awake() -> None:
    """Keep the event loop polling its sockets without sleeping (until cancelled): one CPU busy the whole run.

    Why: an idle CPU sleeps, and waking it for a read takes 50-200 us on a virtual machine. Kernel stamps
    make that lateness harmless, except where a second event arrives before the read: both then come in one
    read and the first gets the second's stamp (typically the last token and the usage chunk written right
    after it). With the loop polling, reads follow arrivals within microseconds. For latency measurements at
    low concurrency, with the client on a CPU of its own."""
    while True:
        await asyncio.sleep(0)


async def _awake(run: Any) -> list[RequestRecord]:
    poller = asyncio.ensure_future(keep_awake())
    try:
        return await run
    finally:
        poller.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await poller


def new_runner() -> asyncio.Runner:
    """asyncio's own loop where reads can carry the kernel's receive stamps (workloads/kernel_stamps.py): the
    stamps make the client's speed drop out of the timings, which matters more than uvloop's lower cost per
    event; uvloop where they cannot."""
    factory = stamped_loop_factory()
    if factory is not None:
        return asyncio.Runner(loop_factory=factory)
    try:
        import uvloop
    except ImportError:
        return asyncio.Runner()
    return asyncio.Runner(loop_factory=uvloop.new_event_loop)
