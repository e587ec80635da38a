"""One load point of one backend in one workload: its bounds and prompts, the load generator run with its
progress shown, the GPUs sampled and the server's own counters read around it (`server_metrics.py`), its
manifest entry, and what it measured (`MeasuredPoint`)."""

from __future__ import annotations

import contextlib
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

from adapters.base import Adapter
from compare.common.text import plural
from compare.measure.load_points import MeasuredPoint
from compare.measure.order import block_budget
from compare.measure.prompts import DURATION_BOUND_PROMPTS, expected_sends
from compare.measure.watcher import Watcher
from compare.plan.run_options import BackendSpec, RunPlan, WorkloadSpec
from workloads.schedule import Schedule

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from adapters.request_spec import RequestSpec
    from compare.measure.gpu_sampling import GpuWatch
    from compare.measure.run_dir import RunDir
    from workloads.datasets import PromptStream
    from workloads.loadgen import PointJob
    from workloads.records import RequestRecord

#: what runs a point's load: `workloads.loadgen.run_load_sync`, or Ray's load generators (`RayLoad`)
Load: TypeAlias = "Callable[[PointJob], list[RequestRecord]]"
#: a point's prompts: a file's, or a stream that makes them as they are needed; each a `RequestSpec`, or a
#: `workloads.sessions.Session` in a workload of sessions
Source: TypeAlias = "list[Any] | PromptStream[Any]"


@dataclass(frozen=True)
class Point:
    """One load point of one backend in one workload."""

    plan: RunPlan
    backend: BackendSpec
    adapter: Adapter
    url: str
    workload: WorkloadSpec
    schedule: Schedule
    repeat: int = 0
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    gpu: GpuWatch | None = None  # sampled from before the load starts to after it ends
    block: tuple[int, int] | None = None  # (block, blocks) when the point is measured in blocks (Blocks)
    # the fewest requests the point must measure (a capacity search's percentile needs them to be decided):
    # its request bound is raised to it and its duration to what its rate takes to send them
    min_requests: int | None = None

    def run(
        self,
        run_dir: RunDir,
        source: Source,
        warm_specs: list[RequestSpec],
        load: Load,
        tokenizer: PreTrainedTokenizerBase,
        watcher: Watcher,
    ) -> MeasuredPoint:
        """Run the point with its progress shown; what it measured, its records kept in memory for the
        source that proposed it. `source`: its prompts, a list or a `PromptStream` (`Prompts`)."""
        from compare.common.throughput_window import running_output_rate
        from compare.measure.server_metrics import ServerCounters
        from workloads.loadgen import PointJob, Timeouts

        plan, backend, schedule = self.plan, self.backend, self.schedule
        run_id = self.run_id
        run_dir.add_point(
            run_id,
            backend.name,
            backend.variant,
            self.workload.label,
            schedule.label,
            schedule.describe(),
            self.repeat,
        )
        entry = run_dir.manifest["points"][-1]
        requests, duration = (
            block_budget(plan, self.block[0]) if self.block else (plan.num_requests, plan.duration)
        )
        if self.block:  # and its own bounds, a share of the point's (block_budget)
            entry["block"], entry["blocks"] = self.block
            entry["num_requests"], entry["duration_s"] = requests, duration
        if self.min_requests:
            requests, duration, source = self._sized(requests, duration, source)
            entry["num_requests"], entry["duration_s"] = requests, duration
            least = plural(self.min_requests, "request")
            watcher.say(
                f"{backend.key} {schedule.label}: {least} at least, so that its "
                f"p{plan.capacity_percentile} can be decided"
                + (f" (up to {duration:.0f} s)" if duration is not None else "")
            )
        specs, stream, entry["prompts"] = self._prompts(source)
        run_dir.save()
        launch = self.repeat // self.block[1] if self.block else self.repeat
        title = (
            f"{backend.key} {self.workload.label} {schedule.label}"
            + (f" (launch {launch + 1})" if plan.repeats > 1 else "")
            + (f" block {self.block[0] + 1}/{self.block[1]}" if self.block else "")
        )
        sessions = specs if self.workload.sessions else []  # multi-turn: Sessions, one request per turn
        if sessions:
            from workloads.sessions import session_requests

            sessions = sessions[:requests] if requests else sessions
            specs = []
        total = session_requests(sessions) if sessions and requests else requests
        with watcher.point(title, total) as show:
            warm_n = len(warm_specs[: plan.warmup_count(schedule)])

            def update(records: list[RequestRecord]) -> None:
                measured = [r for r in records if not r.warmup]
                rate = running_output_rate(measured, time.perf_counter())  # the summary's output tok/s
                warm = len(records) - len(measured)
                phase = f"warm-up {warm}/{warm_n}" if warm < warm_n and not measured else ""
                show(len(measured), rate, sum(1 for r in measured if r.error_kind is not None), phase)

            # the server's own counters, read now and once the load has ended (the summary's server_metrics)
            counters = ServerCounters.read(self.url, self.adapter)
            job = PointJob(
                self.url,
                self.adapter,
                specs,
                schedule,
                output_path=run_dir.requests_path,
                summary_path=run_dir.runs_path,
                warmup_specs=warm_specs[: plan.warmup_count(schedule)],
                max_requests=requests,
                max_duration_s=duration,
                backend=backend.name,
                variant=backend.variant,
                load_point=schedule.label,
                run_id=run_id,
                timeouts=Timeouts(request_s=plan.request_timeout),
                tokenizer=tokenizer,
                busy_poll=plan.busy_poll,
                progress=update,
                progress_interval_s=0.5,
                sessions=sessions,
                spec_stream=stream,
                server_metrics=counters,
            )
            sampling = self.gpu.sample(run_dir, run_id) if self.gpu is not None else contextlib.nullcontext()
            with sampling:  # the GPUs are sampled from before the load starts to after it ends
                records = load(job)
        if stream is not None and stream.supplied:
            entry["prompts"].update(stream.supplied[-1])
            run_dir.save()
        info = run_dir.points()[run_id]  # the manifest's entry with the summary the load generator wrote
        return MeasuredPoint(run_id, info, [r for r in records if not r.warmup], info.interrupted)

    def _sized(
        self, requests: int | None, duration: float | None, source: Source
    ) -> tuple[int | None, float | None, Source]:
        """The point's bounds and prompts raised to `min_requests`: its request bound to at least that many,
        its duration to what its rate takes to send them (with a tenth more, and a second, for the
        arrivals' spread), and a prompt stream bounded by the request count to as many prompts."""
        from workloads.datasets import PromptStream

        need = int(self.min_requests or 0)
        rate = getattr(self.schedule, "rate", None)
        if requests is not None:
            requests = max(requests, need)
        if duration is not None and rate and math.isfinite(rate):
            duration = max(duration, 1.1 * need / rate + 1.0)
        if isinstance(source, PromptStream) and source.limit is not None and requests is not None:
            source = PromptStream(
                source.make_chunk, source.chunk_size, max(source.limit, requests), source.reserve
            )
        return requests, duration, source

    def _prompts(self, source: Source) -> tuple[list[Any], PromptStream[Any] | None, dict[str, Any]]:
        """(the specs or sessions to hand the load generator, the stream that continues them or None, the
        manifest's note of what the point sends). A stream bounded only by the duration goes to the load
        generator, which makes its prompts as it goes; but Ray load generators, which cannot, get
        DURATION_BOUND_PROMPTS of them, cycled."""
        from workloads.datasets import PromptStream

        plan = self.plan
        if not isinstance(source, PromptStream):  # a file's prompts, cycled if a point needs more
            kind = "pool" if plan.prompt_pool else "file"
            return source, None, {"kind": kind, "prompts": len(source)}
        if plan.prompt_pool:
            specs = source.first(plan.prompt_pool)
            return specs, None, {"kind": "pool", "prompts": len(specs)}
        if source.limit is not None:
            return source.first(source.limit), None, {"kind": "per_request", "prompts": source.limit}
        if plan.ray is not None and not plan.ray_cells:
            specs = source.first(DURATION_BOUND_PROMPTS)
            return specs, None, {"kind": "pool", "prompts": len(specs), "why": "Ray load generators"}
        duration = block_budget(plan, self.block[0])[1] if self.block else plan.duration
        stream = source.with_reserve(expected_sends(self.schedule, duration))
        return stream.chunk(0), stream, {"kind": "per_request", "prompts": None, "made": "as needed"}
