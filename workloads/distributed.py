"""One load point sent from several hosts: Ray actors, each a full load generator (`run_load` on its own
event loop (`new_runner`), in its own process), each with its share of the schedule (`workloads.split`).

    generators = LoadGenerators(count=3)              # after ray.init(...); spread over the nodes
    load = RayLoad(generators)                        # called like run_load_sync
    records = load(PointJob(url, adapter, specs, ClosedLoop(48), output_path=..., max_requests=2000))
    generators.shutdown()

For each point the driver measures every actor's clock offset (`workloads.clocks`), starts all actors'
warm-ups, waits until every one is warm, then names one start time on its own clock, which each actor
turns into its own. Every actor streams what happens as it happens (Ray streaming generator): the requests
it began and the records of those that ended, a batch at most every `FLUSH_S`. The driver moves each record
to its clock and appends it to requests.jsonl at once, so a crash loses nothing already measured. It knows
which requests each actor began and which came back: when an actor (or its node) dies, the requests it had
in flight are written as failed (`client_lost`) with the reason, the other actors go on, and the point
still gets its summary. Requests it was given but had not begun are not sent by anyone: the point's count
falls short by that much, and the placement in the manifest says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields, replace
from time import perf_counter
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from adapters.request_spec import RequestSpec, is_resend, spec_id_of
from workloads.clocks import (
    ClockOffset,
    ClockSample,
    RecordLabels,
    Started,
    estimate_offset,
    lost_record,
    to_driver_clock,
)
from workloads.loadgen import PointJob, build_summary, new_runner, run_load, with_server_metrics
from workloads.records import ErrorKind, RecordWriter, RequestRecord
from workloads.schedule import ClosedLoop
from workloads.split import Share, split_point

log = logging.getLogger(__name__)

FLUSH_S = 0.05  # an actor sends what it has at least this often
CLOCK_SAMPLES = 8
START_LEAD_S = 0.3  # from the driver naming the start time to the start: its message must arrive first
PREPARE_S_PER_REQUEST = 30e-6  # building and encoding one request before the start
STOP_GRACE_S = 20.0  # after a stop, how long actors may take to record their in-flight requests


@dataclass(frozen=True)
class Job:
    """What one actor needs for one load point: its share, and the point's job with what every share has
    in common (url, adapter, timeouts, labels; its tokenizer an ObjectRef or None)."""

    share: Share
    point: PointJob


def stream_batches(
    out: queue.SimpleQueue, controls: dict[str, Callable[[Any], dict[str, Any]]], flush_s: float
) -> Iterator[dict[str, Any]]:
    """Read ("s", begun request) / ("r", record) / (control, item) messages from a load thread and yield them
    in batches: at least every `flush_s`, and before every control message (so the driver sees each record
    before what follows it), which is yielded as `controls[kind](item)`. Ends at ("end", None)."""
    started: list[tuple] = []
    records: list[str] = []
    last = perf_counter()
    while True:
        try:
            kind, item = out.get(timeout=flush_s)
        except queue.Empty:
            kind, item = None, None
        if kind == "s":
            started.append(item)
        elif kind == "r":
            records.append(item)
        now = perf_counter()
        if (started or records) and (kind not in ("s", "r") or now - last >= flush_s):
            yield {"started": started, "records": records}
            started, records = [], []
            last = now
        if kind == "end":
            return
        if kind in controls:
            yield controls[kind](item)


class LoadGenerator:
    """A Ray actor (threaded: `stop`, `go` and `clock` answer while `run` streams)."""

    def __init__(self, slot: int) -> None:
        self.slot = slot
        self._stop = threading.Event()
        self._go = threading.Event()
        self._start_at: float | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None

    def where(self) -> dict[str, Any]:
        ctx = ray.get_runtime_context()
        return {
            "slot": self.slot,
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "node_id": ctx.get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),
        }

    def clock(self) -> tuple[float, int]:
        return perf_counter(), time.time_ns()

    def go(self, start_at: float) -> None:
        """Start the measured phase at `start_at` on this host's perf_counter clock."""
        self._start_at = start_at
        self._go.set()

    def stop(self) -> None:
        """Stop now: requests in flight are recorded as cancelled and streamed."""
        self._stop.set()
        self._go.set()
        loop, task = self._loop, self._task
        if loop is not None and task is not None:
            with contextlib.suppress(RuntimeError):  # the loop has just closed
                loop.call_soon_threadsafe(task.cancel)

    def run(self, job: Job) -> Iterator[dict[str, Any]]:
        """Warm up, report warm, wait for `go`, run the measured phase; stream what happens meanwhile."""
        self._stop.clear()
        self._go.clear()
        out: queue.SimpleQueue = queue.SimpleQueue()
        stats: dict[str, Any] = {}
        worker = threading.Thread(target=self._drive, args=(job, out, stats), daemon=True)
        worker.start()
        yield from stream_batches(out, {"warm": lambda _: {"warm": True}}, FLUSH_S)
        worker.join()
        yield {"done": stats}

    # -- inside the actor's load thread -------------------------------------------------------------

    def _drive(self, job: Job, out: queue.SimpleQueue, stats: dict[str, Any]) -> None:
        try:
            tokenizer = ray.get(job.point.tokenizer) if job.point.tokenizer is not None else None
            share, common = job.share, replace(job.point, tokenizer=tokenizer)

            def started(request_id: str, scheduled: float, start: float, warmup: bool) -> None:
                out.put(("s", (request_id, scheduled, start, warmup)))

            if share.warmup_specs and not self._stop.is_set():

                def warm_record(record: RequestRecord) -> None:
                    out.put(("r", record.model_copy(update={"warmup": True}).model_dump_json()))

                def warm_started(request_id: str, scheduled: float, start: float, _warmup: bool) -> None:
                    started(request_id, scheduled, start, True)

                self._phase(
                    run_load(
                        replace(
                            common,
                            specs=share.warmup_specs,
                            schedule=ClosedLoop(share.warmup_concurrency),
                            max_requests=len(share.warmup_specs),
                            on_record=warm_record,
                            on_start=warm_started,
                        )
                    )
                )
            out.put(("warm", None))
            self._go.wait()
            if not self._stop.is_set():
                stats["start_at"] = self._start_at
                self._phase(
                    run_load(
                        replace(
                            common,
                            specs=share.specs,
                            schedule=share.schedule,
                            max_requests=share.max_requests,
                            max_duration_s=share.max_duration_s,
                            start_at=self._start_at,
                            on_start=started,
                            on_record=lambda r: out.put(("r", r.model_dump_json())),
                        )
                    )
                )
            stats["interrupted"] = self._stop.is_set()
        except BaseException as exc:  # reported to the driver, which decides
            stats["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            out.put(("end", None))

    def _phase(self, coro: Any) -> None:
        async def main() -> None:
            self._loop, self._task = asyncio.get_running_loop(), asyncio.current_task()
            if self._stop.is_set():
                coro.close()
                return
            await coro

        try:
            with new_runner() as runner:
                runner.run(main())
        finally:
            self._loop = self._task = None


@dataclass
class Slot:
    """One actor of the set, and where it runs."""

    index: int
    handle: Any
    where: dict[str, Any] = field(default_factory=dict)
    replaced: int = 0

    @property
    def host(self) -> str:
        return f"actor-{self.index}@{self.where.get('node_ip', '?')}"


class LoadGenerators:
    """`count` load-generator actors placed by a SPREAD placement group (one per node while nodes last),
    each reserving `cpus` CPUs. Dead actors are replaced in their bundle before the next point."""

    def __init__(self, count: int, cpus: float = 1.0, ready_timeout_s: float = 120.0) -> None:
        if count < 1:
            raise ValueError(f"need at least one load generator, got {count}")
        self.cpus, self.ready_timeout_s = cpus, ready_timeout_s
        self.notes: list[str] = []
        self._cls = ray.remote(LoadGenerator)
        self.group = placement_group([{"CPU": cpus}] * count, strategy="SPREAD", name="llm-compare-load")
        try:
            ray.get(self.group.ready(), timeout=ready_timeout_s)
        except Exception:
            remove_placement_group(self.group)
            total = ray.cluster_resources().get("CPU", 0)
            raise RuntimeError(
                f"{count} load generators of {cpus:g} CPU each could not be placed within "
                f"{ready_timeout_s:.0f} s (the cluster has {total:g} CPUs)"
            ) from None
        self.slots = [Slot(i, self._start(i)) for i in range(count)]
        try:
            wheres = ray.get([s.handle.where.remote() for s in self.slots], timeout=ready_timeout_s)
        except Exception:
            self.shutdown()
            raise
        for slot, where in zip(self.slots, wheres, strict=True):
            slot.where = where

    def _start(self, index: int) -> Any:
        strategy = PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=index)
        return self._cls.options(
            num_cpus=self.cpus, max_concurrency=4, max_restarts=0, scheduling_strategy=strategy
        ).remote(index)

    def placement(self) -> list[dict[str, Any]]:
        return [s.where | {"replaced": s.replaced} for s in self.slots]

    def live(self, timeout_s: float = 10.0) -> list[Slot]:
        """The actors that answer, after replacing those that do not."""
        out = []
        for slot in self.slots:
            try:
                ray.get(slot.handle.clock.remote(), timeout=timeout_s)
                out.append(slot)
                continue
            except Exception as exc:
                reason = f"{type(exc).__name__}"
            with contextlib.suppress(Exception):
                ray.kill(slot.handle)
            try:
                slot.handle = self._start(slot.index)
                slot.where = ray.get(slot.handle.where.remote(), timeout=self.ready_timeout_s)
                slot.replaced += 1
                self.notes.append(
                    f"load generator {slot.index} did not answer ({reason}): replaced by a new "
                    f"actor on {slot.where.get('node_ip')}"
                )
                out.append(slot)
            except Exception as exc:
                self.notes.append(
                    f"load generator {slot.index} did not answer ({reason}) and could not be "
                    f"replaced ({type(exc).__name__}): the next points run without it"
                )
        return out

    def shutdown(self) -> None:
        for slot in getattr(self, "slots", []):
            with contextlib.suppress(Exception):
                ray.kill(slot.handle)
        with contextlib.suppress(Exception):
            remove_placement_group(self.group)


def measure_offset(handle: Any, samples: int = CLOCK_SAMPLES, timeout_s: float = 10.0) -> ClockOffset:
    """The actor's clock against ours, from `samples` round trips (the shortest one counts)."""
    out = []
    for _ in range(samples):
        sent = perf_counter()
        wall = time.time_ns()
        remote, remote_wall = ray.get(handle.clock.remote(), timeout=timeout_s)
        received = perf_counter()
        wall = (wall + time.time_ns()) // 2
        out.append(ClockSample(sent, received, remote, remote_wall, wall))
    return estimate_offset(out)


@dataclass
class _Stream:
    """The driver's view of one actor during one point."""

    slot: Slot
    share: Share
    offset: ClockOffset
    specs: dict[str, RequestSpec]
    inflight: dict[str, Started] = field(default_factory=dict)
    warm: asyncio.Event = field(default_factory=asyncio.Event)
    started: int = 0
    finished: int = 0
    lost: int = 0
    died: str | None = None
    done: dict[str, Any] = field(default_factory=dict)

    def spec_of(self, request_id: str) -> RequestSpec | None:
        spec = self.specs.get(request_id)
        if spec is None and is_resend(request_id):
            spec = self.specs.get(spec_id_of(request_id))
        return spec


#: what a job may ask of one host's load generator but not of several
UNSUPPORTED = ("ramp_up_s", "start_at", "busy_poll", "on_record", "on_start", "spec_stream")


class RayLoad:
    """Runs one load point over the actors of `generators`; called like `run_load_sync`. After each point,
    `on_point(run_id, placement)` receives where it ran: the actors, their shares, the clock offsets before
    and after, and what each began, finished and lost."""

    def __init__(
        self, generators: LoadGenerators, on_point: Callable[[str, dict[str, Any]], None] | None = None
    ) -> None:
        self.generators = generators
        self.on_point = on_point
        self._tokenizers: dict[int, Any] = {}

    def __call__(self, job: PointJob) -> list[RequestRecord]:
        plain = {f.name: f.default for f in fields(PointJob)}
        unsupported = [name for name in UNSUPPORTED if getattr(job, name) != plain[name]]
        if unsupported:
            raise TypeError(f"not supported over Ray: {', '.join(unsupported)}")
        job = job.resolved()
        slots = self.generators.live()
        if not slots:
            raise RuntimeError("no load generator is alive")
        _check_reachable(job.url, slots)
        shares = split_point(
            job.specs,
            job.warmup_specs,
            job.schedule,
            len(slots),
            max_requests=job.max_requests,
            max_duration_s=job.max_duration_s,
            warmup_concurrency=job.warmup_concurrency,
        )
        point = _Point(self, job, shares, slots[: len(shares)], self._tokenizer_ref(job.tokenizer))
        with asyncio.Runner() as runner:
            return runner.run(point.run())

    def _tokenizer_ref(self, tokenizer: Any) -> Any:
        if tokenizer is None:
            return None
        key = id(tokenizer)
        if key not in self._tokenizers:
            try:
                self._tokenizers[key] = ray.put(tokenizer)
            except Exception as exc:  # a tokenizer that cannot travel: counts are cross-checked less
                log.warning("the tokenizer cannot be sent to the actors (%s): no re-tokenisation there", exc)
                self._tokenizers[key] = None
        return self._tokenizers[key]


def _labels(job: PointJob) -> RecordLabels:
    """The labels of every record of a resolved job (`PointJob.resolved` fills them in)."""
    if job.run_id is None or job.backend is None or job.load_point is None:
        raise ValueError("the load point's job is not resolved (PointJob.resolved)")
    return RecordLabels(
        run_id=job.run_id,
        backend=job.backend,
        variant=job.variant,
        load_point=job.load_point,
        output_length_forced=job.adapter.forces_output_length,
    )


class _Point:
    def __init__(
        self, owner: RayLoad, job: PointJob, shares: list[Share], slots: list[Slot], tokenizer: Any
    ) -> None:
        """`job` resolved (`PointJob.resolved`); `tokenizer` an ObjectRef to its tokenizer, or None."""
        self.owner, self.job, self.shares, self.slots = owner, job, shares, slots
        self.labels = _labels(job)
        # what every actor's share has in common
        self.common = PointJob(
            job.url,
            job.adapter,
            (),
            job.schedule,
            backend=job.backend,
            variant=job.variant,
            load_point=job.load_point,
            run_id=job.run_id,
            timeouts=job.timeouts,
            tokenizer=tokenizer,
        )
        self.writer = RecordWriter(job.output_path) if job.output_path is not None else None
        self.records: list[RequestRecord] = []
        self.t0 = perf_counter()
        self.start_at: float | None = None
        self.streams: list[_Stream] = []

    async def run(self) -> list[RequestRecord]:
        for slot, share in zip(self.slots, self.shares, strict=True):
            offset = await asyncio.to_thread(measure_offset, slot.handle)
            specs = {s.request_id: s for s in (*share.specs, *share.warmup_specs)}
            self.streams.append(_Stream(slot, share, offset, specs))
        self.t0 = perf_counter()
        interrupted = False
        consumers = [asyncio.create_task(self._consume(s)) for s in self.streams]
        report = self.job.progress
        progress = asyncio.create_task(self._report_progress()) if report is not None else None
        try:
            await asyncio.gather(*(s.warm.wait() for s in self.streams))
            lead = START_LEAD_S + PREPARE_S_PER_REQUEST * max(len(s.share.specs) for s in self.streams)
            self.start_at = perf_counter() + lead + 2 * max(s.offset.rtt_s for s in self.streams)
            for s in self.streams:
                if s.died is None:
                    local = self.start_at + s.share.start_offset_s - s.offset.offset_s
                    s.slot.handle.go.remote(local)
            await asyncio.wait(consumers)  # not gather: a Ctrl-C must not cancel them, they still deliver
        except asyncio.CancelledError:
            interrupted = True
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            await self._stop(consumers)
        finally:
            if progress is not None and report is not None:
                progress.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await progress
                with contextlib.suppress(Exception):
                    report(self.records)
        end = perf_counter()
        interrupted = interrupted or any(s.done.get("interrupted") for s in self.streams)
        self._finish(end, interrupted)
        return self.records

    async def _consume(self, stream: _Stream) -> None:
        gen = stream.slot.handle.run.remote(Job(stream.share, self.common))
        try:
            async for ref in gen:
                message = await ref
                self._take(stream, message)
            if stream.done.get("error"):
                stream.died = f"the load generator failed: {stream.done['error']}"
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the actor or its node died
            stream.died = (
                f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
            )
        finally:
            stream.warm.set()
            if stream.died is not None:
                self._lose(
                    stream,
                    ErrorKind.CLIENT_LOST,
                    f"the load generator {stream.slot.host} died while this request was in flight "
                    f"({stream.died}); its outcome is unknown",
                )

    def _take(self, stream: _Stream, message: dict[str, Any]) -> None:
        for request_id, scheduled, start, warmup in message.get("started", ()):
            spec = stream.spec_of(request_id)
            stream.inflight[request_id] = Started(
                request_id,
                scheduled,
                start,
                warmup,
                spec.prompt_len if spec else 0,
                spec.wanted_output_tokens if spec else 1,
            )
            stream.started += 1
        for line in message.get("records", ()):
            record = RequestRecord.model_validate_json(line)
            stream.inflight.pop(record.request_id, None)
            stream.finished += 1
            self._store(to_driver_clock(record, self.t0, stream.offset.offset_s, stream.slot.host))
        if message.get("warm"):
            stream.warm.set()
        if "done" in message:
            stream.done = message["done"]

    def _store(self, record: RequestRecord) -> None:
        self.records.append(record)
        if self.writer is not None:
            self.writer.append(record)

    def _lose(self, stream: _Stream, kind: ErrorKind, reason: str) -> None:
        for started in list(stream.inflight.values()):
            record = lost_record(
                started,
                self.labels,
                t0=self.t0,
                offset_s=stream.offset.offset_s,
                host=stream.slot.host,
                reason=reason,
            )
            if kind != ErrorKind.CLIENT_LOST:
                record = record.model_copy(update={"error_kind": kind})
            self._store(record)
            stream.lost += 1
        stream.inflight.clear()

    async def _stop(self, consumers: list[asyncio.Task]) -> None:
        """Ctrl-C: every actor records its in-flight requests as cancelled and streams them; one that does
        not within STOP_GRACE_S is killed and its in-flight requests written as cancelled here."""
        for s in self.streams:
            with contextlib.suppress(Exception):
                s.slot.handle.stop.remote()
        _, pending = await asyncio.wait(consumers, timeout=STOP_GRACE_S)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for s, task in zip(self.streams, consumers, strict=True):
            if task in pending:
                with contextlib.suppress(Exception):
                    ray.kill(s.slot.handle)
                s.died = f"did not stop within {STOP_GRACE_S:.0f} s: killed"
                self._lose(s, ErrorKind.CANCELLED, f"the run was stopped; {s.slot.host} {s.died}")

    async def _report_progress(self) -> None:
        progress = self.job.progress
        assert progress is not None
        while True:
            await asyncio.sleep(self.job.progress_interval_s)
            try:
                progress(self.records)
            except Exception:
                log.exception("the progress callback failed; the run goes on")

    def _finish(self, end: float, interrupted: bool) -> None:
        if self.writer is not None:
            self.writer.close()
        describe = self.job.schedule.describe() | {
            "adapter": self.job.adapter.describe(),
            "load_generators": len(self.streams),
        }
        summary = build_summary(
            self.records,
            self.job,
            t0=self.t0,
            measured_start=self.start_at or end,
            end=end,
            interrupted=interrupted,
            describe=describe,
        )
        summary = with_server_metrics(summary, self.job)
        if self.job.summary_path is not None:
            with RecordWriter(self.job.summary_path) as writer:
                writer.append(summary)
        if self.owner.on_point is not None:
            self.owner.on_point(self.labels.run_id, self._placement())

    def _placement(self) -> dict[str, Any]:
        out = []
        for s in self.streams:
            after = None
            if s.died is None:
                with contextlib.suppress(Exception):
                    after = measure_offset(s.slot.handle)
            entry = s.slot.where | {
                "share": s.share.describe(),
                "clock_offset": s.offset.describe(),
                "clock_offset_after": after.describe() if after else None,
                "clock_drift_s": after.offset_s - s.offset.offset_s if after else None,
                "began": s.started,
                "finished": s.finished,
                "lost": s.lost,
                "never_sent": (
                    len(s.share.specs) + len(s.share.warmup_specs) - s.started
                    if s.share.max_requests is not None
                    else None
                ),
                "died": s.died,
            }
            out.append(entry)
        return {
            "t0_monotonic": self.t0,
            "start_s": None if self.start_at is None else self.start_at - self.t0,
            "clock": "driver monotonic; each record shifted by its actor's offset (clock_offset_s)",
            "generators": out,
        }


def _check_reachable(url: str, slots: Sequence[Slot]) -> None:
    """A server on this host's loopback cannot be reached from another host."""
    from urllib.parse import urlparse

    host = urlparse(url).hostname or ""
    if host not in ("localhost", "::1") and not host.startswith("127."):
        return
    here = ray.util.get_node_ip_address()
    away = [
        s
        for s in slots
        if s.where.get("node_ip") != here and not str(s.where.get("node_ip")).startswith("127.")
    ]
    if away:
        raise RuntimeError(
            f"{url} is this host's loopback, which load generators on {away[0].where.get('node_ip')} cannot "
            "reach: give the server an address the cluster can reach (--endpoint), or run the cells on the "
            "cluster (--ray-cells)"
        )


def default_generators() -> int:
    """One load generator per alive node."""
    return max(1, sum(1 for n in ray.nodes() if n.get("Alive")))
