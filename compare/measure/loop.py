"""The measuring loop of `compare run`: every backend (launched or reached) through every workload and load
point, in alternating launch order, each point's records and summary appended to the run directory.

It prints nothing itself: messages and each point's progress go to the `Watcher` it is given, so that the
command line shows progress bars and a Ray cell, measuring on another node, stays silent.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from compare.common.exit_codes import EXIT_FAILED, EXIT_OK
from compare.common.text import plural
from compare.plan.run_options import BackendSpec, RunPlan, WorkloadSpec
from workloads.schedule import Schedule

#: shows a point's progress: (measured requests so far, output tokens/s or nan, failed requests, phase): the
#: phase is "" while measuring, "warm-up 2/4" (warm-up requests done of those sent first) before
ShowProgress = Callable[[int, float, int, str], None]
#: updates the status line of a wait (`Watcher.wait`) with what it is at now
ShowStatus = Callable[[str], None]
#: prompts per load point of a file dataset (sharegpt, jsonl, sharegpt-turns) when only a duration bounds it,
#: and of any dataset measured by Ray load generators (which cannot make prompts as they go): cycled, ids `~k`
DURATION_BOUND_PROMPTS = 256
#: sessions per chunk of a duration-bound multi-turn point (a session is several requests)
SESSION_CHUNK = 64
#: the most prompts made before a duration-bound open-loop point starts (`expected_sends`)
MAX_RESERVE = 20_000


def _silent(_message: str) -> None:
    pass


@contextlib.contextmanager
def _no_progress(_title: str, _total: int | None) -> Iterator[ShowProgress]:
    yield lambda _done, _rate, _errors, _phase: None


@contextlib.contextmanager
def _no_wait(_title: str) -> Iterator[ShowStatus]:
    yield _silent


@dataclass(frozen=True)
class Watcher:
    """Who watches a run: `say(message)` (rich markup) for what happens; `point(title, total)`, a context
    manager around one load point yielding the function that shows its progress; and `wait(title)`, one
    around any wait that may pass 2 s (checkpoint preparation, server start-up) yielding the function that
    updates its status (the console shows a spinner and the time elapsed). Silent by default."""

    say: Callable[[str], None] = _silent
    point: Callable[[str, int | None], AbstractContextManager[ShowProgress]] = _no_progress
    wait: Callable[[str], AbstractContextManager[ShowStatus]] = _no_wait


def measure(
    plan: RunPlan, run_dir: Any, watcher: Watcher = Watcher(), load: Callable[[Any], Any] | None = None
) -> int:
    """Measure every point of `plan` into `run_dir` with `load(PointJob)` (default `run_load_sync`); the exit
    code. Raises KeyboardInterrupt when a point was interrupted (launched servers are stopped first)."""
    from compare.measure.gpu_sampling import open_telemetry
    from workloads.loadgen import run_load_sync

    model_path, tokenizer = _model_and_tokenizer(plan, watcher)
    client_cpus, server_cpus, pin_note = pinning(plan)
    run_dir.manifest["pinning"] = pin_note
    run_dir.manifest["model_path"] = model_path
    run_dir.save()
    prompts = _Prompts(plan, tokenizer)
    telemetry = open_telemetry(plan.gpu_telemetry, plan.gpu_telemetry_interval)
    run_dir.manifest["gpu_telemetry"] = telemetry.entry
    run_dir.save()
    saved_affinity = os.sched_getaffinity(0) if client_cpus else None
    if client_cpus:
        os.sched_setaffinity(0, client_cpus)
    code = EXIT_OK
    try:
        if (plan.blocks or 1) > 1:
            code = _Blocks(plan, run_dir, watcher, telemetry).run(prompts, load or run_load_sync, tokenizer)
        else:
            for repeat, backend in launch_order(plan.backends, plan.repeats):
                launch = _Launch(plan, run_dir, backend, repeat, watcher, telemetry)
                if not launch.run(model_path, server_cpus, prompts, load or run_load_sync, tokenizer):
                    code = EXIT_FAILED
    finally:
        telemetry.close()
        if saved_affinity:
            os.sched_setaffinity(0, saved_affinity)
    return code


def launch_order(backends: list, repeats: int) -> list[tuple[int, Any]]:
    """Each backend `repeats` times, every other round in reverse (A B, B A, A B, ...), so that what drifts
    with time on the machine (other load, caches, clocks) does not favour whoever always runs second."""
    return [(r, b) for r in range(repeats) for b in (backends if r % 2 == 0 else backends[::-1])]


def block_order(backends: list, blocks: int, repeat: int = 0) -> list[tuple[int, Any]]:
    """(block, backend) in the order one point measures them: the backends in each block, every other block
    in reverse and the alternation carried on from one repeat to the next (A B, B A, A B, ...), so that drift
    within a point's turn favours neither."""
    flip = [(repeat * blocks + b) % 2 == 1 for b in range(blocks)]
    return [(b, x) for b in range(blocks) for x in (backends[::-1] if flip[b] else backends)]


def block_budget(plan: RunPlan, block: int) -> tuple[int | None, float | None]:
    """(requests, duration) of one block: 1/`plan.blocks` of the point's, so that blocks do not lengthen the
    run (requests that do not divide go to the first blocks)."""
    blocks = plan.blocks or 1
    n = plan.num_requests
    share = None if n is None else n // blocks + (1 if block < n % blocks else 0)
    return (max(share, 1) if share is not None else None), (
        None if plan.duration is None else plan.duration / blocks
    )


class _Prompts:
    """The requests of every point. Each load point (and block) gets prompts of its own (one backend's
    server would otherwise answer a later point from its prefix cache), and every backend gets the same
    prompts at the same point, in the same order.

    Every request gets a prompt of its own by default: a generated workload (random, fixed, prefix,
    multi-turn) is a `workloads.datasets.PromptStream` per point, seeded by the run's seed, the workload,
    the point and the block, and nothing else, so that the sequence is the same for every backend however
    many requests each gets through. A point of known size (--num-requests) makes its prompts before it
    starts; a duration-bound one makes them as it goes, chunk by chunk ahead of need (`Supply`, whose
    waits the manifest's point entry records). `--prompt-pool N` sends N prompts per point (and block),
    cycled. File datasets hold what the file holds (up to --num-requests, or DURATION_BOUND_PROMPTS),
    cycled beyond that."""

    def __init__(self, plan: RunPlan, tokenizer: Any) -> None:
        from workloads.datasets import make_dataset

        self.points = points_per_launch(plan)
        self.blocks = plan.blocks or 1
        # a running endpoint keeps its prefix cache between repeats and blocks: each has its own slice
        slices = self.points * plan.repeats * self.blocks
        allowed = _Allowed(tokenizer)
        self.workloads = []
        for i, w in enumerate(plan.workloads):
            if _generated(w):
                sizes = [plan.prompt_pool or block_budget(plan, s // self.points % self.blocks)[0]
                         for s in range(slices)]
                streams = [_stream(w, tokenizer, allowed, plan.seed + i, k, sizes[k]) for k in range(slices)]
                self.workloads.append((w, streams))
            else:
                n = plan.prompt_pool or plan.num_requests or DURATION_BOUND_PROMPTS
                self.workloads.append((w, _slices(make_dataset, w, tokenizer, n, slices, plan.seed + i)))
        warm_n = max(plan.warmup_count(s) for s in plan.load_points)
        warm_all = (
            make_dataset(
                "random",
                tokenizer,
                max(warm_n, 1) * slices,
                input_len=16,
                output_len=8,
                seed=plan.seed + 999,
                id_prefix="warmup",
            )
            if warm_n
            else []
        )
        self.warm = [warm_all[k * warm_n : (k + 1) * warm_n] for k in range(slices)]
        # one short request right after each launch is ready: the cold first token (its own prompts)
        self.cold = make_dataset(
            "random",
            tokenizer,
            plan.repeats,
            input_len=16,
            output_len=4,
            seed=plan.seed + 555,
            id_prefix="cold",
        )


def points_per_launch(plan: RunPlan) -> int:
    """The most load points one launch measures in one workload: the plan's, or what a sweep may add."""
    if not plan.sweep:
        return len(plan.load_points)
    from compare.analysis.capacity import MAX_BISECTIONS
    from compare.analysis.sweep import MAX_EXTRA

    return 2 + plan.sweep_points + MAX_EXTRA + (MAX_BISECTIONS if plan.capacity else 0)


@dataclass(frozen=True)
class _Launch:
    """One backend in one repeat: started (or reached), measured at every point (its GPUs sampled where
    `telemetry` is on), stopped."""

    plan: RunPlan
    run_dir: Any
    backend: BackendSpec
    repeat: int
    watcher: Watcher
    telemetry: Any  # compare.measure.gpu_sampling.GpuTelemetry (off: watches nothing)

    def run(
        self, model_path: str, server_cpus: set[int] | None, prompts: _Prompts, load: Callable, tokenizer: Any
    ) -> bool:
        """False when the backend could not be started or reached (the note says why)."""
        from compare.launch.launcher import LaunchError

        plan, backend, say = self.plan, self.backend, self.watcher.say
        adapter = self.adapter()
        launcher = None
        try:
            if backend.launched:
                from compare.launch.backend_launch import make_launcher

                launcher = make_launcher(
                    plan, backend, self.run_dir, self.repeat, model_path, server_cpus, say
                )
                adapter, setup = self._start(launcher, adapter, prompts.cold[self.repeat])
            else:
                setup = self._reach(adapter)
            from compare.launch.declared import collect

            collect(setup, model_path if backend.launched else None)  # for the parity audit
            self.run_dir.set_setup(setup)
            gpu = self.telemetry.watch(backend.key, launcher, backend.endpoint)
            for w, per_point in prompts.workloads:
                if plan.sweep:
                    _SweepRun(self, adapter, setup.url, w, tokenizer, gpu).run(per_point, prompts.warm, load)
                    continue
                for k, schedule in enumerate(plan.load_points):
                    index = self.repeat * prompts.points + k  # the slice of launch and point
                    point = _Point(plan, backend, adapter, setup.url, w, schedule, self.repeat, gpu=gpu)
                    if point.run(
                        self.run_dir, per_point[index], prompts.warm[index], load, tokenizer, self.watcher
                    ):
                        raise KeyboardInterrupt
            return True
        except LaunchError as exc:
            self._failed(exc)
            return False
        finally:
            if launcher is not None:
                launcher.stop()
                self.run_dir.set_setup(launcher.report)

    def adapter(self) -> Any:
        from adapters import get_adapter

        plan, backend = self.plan, self.backend
        served = plan.served_model or plan.model
        options = {} if backend.name == "trtllm-triton" and not plan.served_model else {"model": served}
        return get_adapter(backend.name, **options)

    def reach(self) -> tuple[Any, str, Any] | None:
        """A running endpoint's (adapter, URL, GPU watch), its set-up recorded; None when it could not be
        reached (the note says why)."""
        from compare.launch.declared import collect
        from compare.launch.launcher import LaunchError

        adapter = self.adapter()
        try:
            setup = self._reach(adapter)
        except LaunchError as exc:
            self._failed(exc)
            return None
        collect(setup, None)  # for the parity audit
        self.run_dir.set_setup(setup)
        return adapter, setup.url, self.telemetry.watch(self.backend.key, None, self.backend.endpoint)

    def _reach(self, adapter: Any) -> Any:
        from compare.launch.launcher import endpoint_report

        backend = self.backend
        setup = endpoint_report(backend.name, backend.variant, backend.endpoint, adapter.health_path)
        setup.repeat = self.repeat
        return setup

    def _failed(self, exc: Exception) -> None:
        from rich.markup import escape

        backend = self.backend
        why = escape(str(exc).removeprefix(f"{backend.key}: "))  # a log's own [brackets] are no markup
        verb = "started" if backend.launched else "reached"
        self.watcher.say(f"[red]{backend.key} could not be {verb}:[/red] {why}")
        self.run_dir.manifest["notes"].append(
            str(exc) if str(exc).startswith(backend.key) else f"{backend.key}: {exc}"
        )

    def _start(self, launcher: Any, adapter: Any, cold_spec: Any) -> tuple[Any, Any]:
        """Start the server, time it, measure its cold first token: (the adapter for it, its set-up
        report)."""
        from adapters import get_adapter
        from compare.launch.backend_launch import measure_cold_first_token

        plan, backend, say = self.plan, self.backend, self.watcher.say
        if launcher.served_as:
            adapter = get_adapter(backend.name, model=launcher.served_as)
        say(f"[bold]{backend.key}[/bold]: starting the server ({plan.launch}; log: {launcher.log_path})")
        with self.watcher.wait(f"{backend.key}: starting the server") as status:
            setup = launcher.start(on_wait=status)
        launcher.report.repeat = self.repeat
        measure_cold_first_token(launcher, adapter, cold_spec, plan.request_timeout)
        say(
            f"{backend.key}: ready in {setup.ready_s:.1f} s, first token "
            f"{setup.cold_first_token_s * 1e3:.0f} ms later"
        )
        return adapter, setup


@dataclass(frozen=True)
class _Blocks:
    """Running endpoints measured point by point in alternating blocks (`block_order`: A B, B A, ...), each
    block 1/N of the point's requests or duration (`block_budget`), so that what drifts on the machine
    between one backend's turn and the next is spread over both instead of taken for a difference. Each
    block is a run of its own in the run directory, labelled like a launch of `--repeats`: `repeat` =
    repeat x blocks + block (so the verdicts check a winner block by block as they do launch by launch),
    and the manifest's point entry says `block` and `blocks`."""

    plan: RunPlan
    run_dir: Any
    watcher: Watcher
    telemetry: Any

    def run(self, prompts: _Prompts, load: Callable, tokenizer: Any) -> int:
        """The exit code. Raises KeyboardInterrupt when a point was interrupted."""
        plan, blocks, code = self.plan, self.plan.blocks or 1, EXIT_OK
        for repeat in range(plan.repeats):
            reached = []
            for backend in plan.backends:
                launch = _Launch(plan, self.run_dir, backend, repeat, self.watcher, self.telemetry)
                opened = launch.reach()
                if opened is None:
                    code = EXIT_FAILED
                else:
                    reached.append((launch, opened))
            for w, per_point in prompts.workloads:
                for k, schedule in enumerate(plan.load_points):
                    for b, (launch, (adapter, url, gpu)) in block_order(reached, blocks, repeat):
                        label = repeat * blocks + b
                        index = label * prompts.points + k
                        point = _Point(plan, launch.backend, adapter, url, w, schedule, label, gpu=gpu,
                                       block=(b, blocks))
                        if point.run(self.run_dir, per_point[index], prompts.warm[index], load, tokenizer,
                                     self.watcher):
                            raise KeyboardInterrupt
        return code


@dataclass(frozen=True)
class _SweepRun:
    """A sweep (and with --capacity, the search after it) of one launched backend in one workload: each
    point chosen from those measured before it (`compare.analysis.sweep`, `compare.analysis.capacity`)."""

    launch: _Launch
    adapter: Any
    url: str
    workload: WorkloadSpec
    tokenizer: Any
    gpu: Any = None  # compare.measure.gpu_sampling.GpuWatch: the backend's GPUs, sampled at each point

    def run(self, specs: list[list], warm: list[list], load: Callable) -> None:
        """Raises KeyboardInterrupt when a point was interrupted."""
        from compare.analysis import capacity
        from compare.analysis.sweep import Sweep, first_saturated, knee

        plan, launch = self.launch.plan, self.launch
        per_launch = len(specs) // plan.repeats  # the slices of this launch (a sweep has one)
        slices = iter(range(launch.repeat * per_launch, (launch.repeat + 1) * per_launch))

        from compare.analysis.statistics import min_n_for_bound
        from workloads.schedule import OpenLoop

        # a capacity search decides each rate by the percentile's one-sided bound, which needs this many
        needed = min_n_for_bound(plan.capacity_percentile / 100) if plan.capacity else None

        def measure_one(schedule: Schedule) -> Any:
            k = next(slices)
            backend, workload = launch.backend, self.workload
            sized = needed if isinstance(schedule, OpenLoop) else None
            point = _Point(plan, backend, self.adapter, self.url, workload, schedule, launch.repeat,
                           gpu=self.gpu, min_requests=sized)
            if point.run(launch.run_dir, specs[k], warm[k], load, self.tokenizer, launch.watcher):
                raise KeyboardInterrupt
            return self._facts(point.run_id)

        assert plan.sweep_open is not None
        sweep = Sweep(plan.sweep_points, plan.sweep_spacing, plan.sweep_concurrency, plan.sweep_open)
        points = sweep.run(measure_one)
        if plan.capacity:
            points = capacity.search(sweep, measure_one, plan.slo, plan.capacity_percentile,
                                     plan.capacity_precision)
        sync, where = points[0], f"{launch.backend.key} {self.workload.label}"
        bend, saturated = knee(points, sync), first_saturated(points, sync)
        launch.watcher.say(
            f"{where}: knee {'none' if bend is None else bend.label}, saturated "
            + ("not reached" if saturated is None else f"at {saturated[0].label} ({saturated[1]})")
        )

    def _facts(self, run_id: str) -> Any:
        from compare.analysis.metrics import request_table, summarize
        from compare.analysis.sweep import point_facts

        run_dir = self.launch.run_dir
        records = [r for r in run_dir.records() if r.run_id == run_id and not r.warmup]
        points = run_dir.points()
        summary = summarize(records, points, self.launch.plan.slo, n_boot=0)
        row = summary.iloc[0].to_dict() if not summary.empty else {}
        return point_facts(row, request_table(records, points))


@dataclass(frozen=True)
class _Point:
    """One load point of one backend in one workload."""

    plan: RunPlan
    backend: BackendSpec
    adapter: Any
    url: str
    workload: WorkloadSpec
    schedule: Schedule
    repeat: int = 0
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    gpu: Any = None  # gpu_sampling.GpuWatch: sampled from before the load starts to after it ends
    block: tuple[int, int] | None = None  # (block, blocks) when the point is measured in blocks (_Blocks)
    # the fewest requests the point must measure (a capacity search's percentile needs them to be decided):
    # its request bound is raised to it and its duration to what its rate takes to send them
    min_requests: int | None = None

    def run(
        self, run_dir: Any, source: Any, warm_specs: list, load: Callable, tokenizer: Any, watcher: Watcher
    ) -> bool:
        """Run the point with its progress shown; True when it was interrupted. `source`: its prompts, a list
        or a `PromptStream` (`_Prompts`)."""
        from compare.common.throughput_window import running_output_rate
        from workloads.loadgen import PointJob, Timeouts
        from workloads.records import read_run_summaries

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
        requests, duration = block_budget(plan, self.block[0]) if self.block else (plan.num_requests,
                                                                                    plan.duration)
        if self.block:  # and its own bounds, a share of the point's (block_budget)
            entry["block"], entry["blocks"] = self.block
            entry["num_requests"], entry["duration_s"] = requests, duration
        if self.min_requests:
            requests, duration, source = self._sized(requests, duration, source)
            entry["num_requests"], entry["duration_s"] = requests, duration
            least = plural(self.min_requests, "request")
            watcher.say(f"{backend.key} {schedule.label}: {least} at least, so that its "
                        f"p{plan.capacity_percentile} can be decided"
                        + (f" (up to {duration:.0f} s)" if duration is not None else ""))
        specs, stream, entry["prompts"] = self._prompts(source)
        run_dir.save()
        launch = self.repeat // self.block[1] if self.block else self.repeat
        title = f"{backend.key} {self.workload.label} {schedule.label}" + (
            f" (launch {launch + 1})" if plan.repeats > 1 else ""
        ) + (f" block {self.block[0] + 1}/{self.block[1]}" if self.block else "")
        sessions = specs if self.workload.sessions else []  # multi-turn: Sessions, one request per turn
        if sessions:
            from workloads.sessions import session_requests

            sessions = sessions[:requests] if requests else sessions
            specs = []
        total = session_requests(sessions) if sessions and requests else requests
        with watcher.point(title, total) as show:
            warm_n = len(warm_specs[: plan.warmup_count(schedule)])

            def update(records: list) -> None:
                measured = [r for r in records if not r.warmup]
                rate = running_output_rate(measured, time.perf_counter())  # the summary's output tok/s
                warm = len(records) - len(measured)
                phase = f"warm-up {warm}/{warm_n}" if warm < warm_n and not measured else ""
                show(len(measured), rate, sum(1 for r in measured if r.error_kind is not None), phase)

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
            )
            sampling = self.gpu.sample(run_dir, run_id) if self.gpu is not None else contextlib.nullcontext()
            with sampling:  # the GPUs are sampled from before the load starts to after it ends
                load(job)
        if stream is not None and stream.supplied:
            entry["prompts"].update(stream.supplied[-1])
            run_dir.save()
        summaries = [s for s in read_run_summaries(run_dir.runs_path) if s.run_id == run_id]
        return bool(summaries and summaries[-1].interrupted)

    def _sized(self, requests: int | None, duration: float | None, source: Any
               ) -> tuple[int | None, float | None, Any]:
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
            source = PromptStream(source.make_chunk, source.chunk_size, max(source.limit, requests),
                                  source.reserve)
        return requests, duration, source

    def _prompts(self, source: Any) -> tuple[list, Any, dict[str, Any]]:
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


def expected_sends(schedule: Schedule, duration: float | None) -> int:
    """How many prompts to make before a duration-bound point starts: an open loop's (or a trace's) sends
    within the duration, counted from its own seeded arrivals, with a margin of a few standard deviations
    of a Poisson count (nothing then is made while it runs); a closed loop's count depends on the server,
    and a burst (rate inf) has none, so only the first chunk (0). At most MAX_RESERVE: beyond, the rest is
    made as the point goes."""
    from workloads.schedule import OpenLoop, TraceReplay

    if duration is None or not isinstance(schedule, OpenLoop | TraceReplay):
        return 0
    if isinstance(schedule, OpenLoop) and not math.isfinite(schedule.rate):
        return 0
    count = 0
    for offset in schedule.iter_offsets():
        if offset >= duration or count >= MAX_RESERVE:
            break
        count += 1
    return min(count + 3 * math.isqrt(count) + 8, MAX_RESERVE)


class _Allowed:
    """The tokenizer's ordinary token ids (`workloads.datasets.ordinary_token_ids`, a pass over the
    vocabulary), found once for every stream of the run and only if one needs them."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer, self.ids = tokenizer, None

    def __call__(self) -> Any:
        if self.ids is None:
            from workloads.datasets import ordinary_token_ids

            self.ids = ordinary_token_ids(self.tokenizer)
        return self.ids


def _generated(w: WorkloadSpec) -> bool:
    """Whether the workload's prompts are made here (as many as a point needs), not read from a file."""
    return w.dataset in ("random", "fixed", "prefix", "multi-turn")


def _stream(w: WorkloadSpec, tokenizer: Any, allowed: _Allowed, seed: int, k: int, n: int | None) -> Any:
    """The prompts of slice `k` (a point, launch and block) of a generated workload: `n` of them, or as many
    as its duration needs (None). Chunk c is seeded by (seed, k, c) alone. A shared-prefix workload keeps its
    groups' prefixes, drawn per slice, so that no point is served from the prefix cache another filled. Ids
    carry the slice (`random3-17`, `prefix3-g0-4`, `session3-2`), so that each is unique in the run."""
    from workloads.datasets import (
        STREAM_CHUNK,
        Draw,
        PromptStream,
        group_prefixes,
        prefix_dataset,
        random_dataset,
    )

    size = STREAM_CHUNK if n is None else min(STREAM_CHUNK, n)
    make: Callable[[int], list]
    if w.dataset in ("random", "fixed"):
        ins, outs = (w.input_len, w.output_len) if w.dataset == "random" else (512, 128)

        def make(c: int) -> list:
            return random_dataset(tokenizer, size, ins, outs, seed=[seed, k, c], id_prefix=f"{w.dataset}{k}",
                                  allowed=allowed(), first_index=c * size)

    elif w.dataset == "prefix":
        assert w.prefix_groups is not None and w.prefix_len is not None
        groups = w.prefix_groups
        per = -(-size // groups)
        size = per * groups  # whole groups per chunk (`n` cuts the last)
        prefixes = group_prefixes(tokenizer, groups, w.prefix_len, [seed, k], allowed())

        def make(c: int) -> list:
            return prefix_dataset(tokenizer, groups, per, prefixes, w.input_len, w.output_len,
                                  seed=Draw([seed, k, c], allowed(), first=c * per), id_prefix=f"prefix{k}")

    else:  # multi-turn: sessions
        from workloads.sessions import synthetic_sessions

        assert w.turns is not None
        size = SESSION_CHUNK if n is None else min(SESSION_CHUNK, n)

        def make(c: int) -> list:
            return synthetic_sessions(tokenizer, size, w.turns or 1, w.input_len, w.output_len,
                                      w.think_time or 0.0, seed=Draw([seed, k, c], allowed(), first=c * size),
                                      id_prefix=f"session{k}")

    return PromptStream(make, size, limit=n)


def _slices(make_dataset: Any, w: WorkloadSpec, tokenizer: Any, n: int, slices: int, seed: int) -> list[list]:
    """`slices` lists of `n` requests of a file dataset, one per load point, launch and block (a file
    shorter than that: its requests in each)."""
    specs = _dataset(make_dataset, w, tokenizer, n * slices, seed)
    return [specs[k * n : (k + 1) * n] or specs for k in range(slices)]


def _dataset(make_dataset: Any, w: WorkloadSpec, tokenizer: Any, n: int, seed: int) -> list:
    """`n` requests of a file dataset (sharegpt-turns: `n` sessions)."""
    if w.sessions:
        from workloads.sessions import sharegpt_sessions

        think = w.think_time or 0.0
        return sharegpt_sessions(w.path, tokenizer, n=n, turns=w.turns, think_time=think, seed=seed)
    if w.dataset == "sharegpt":
        return make_dataset("sharegpt", w.path, tokenizer, n=n, seed=seed)
    return make_dataset("jsonl", w.path, tokenizer, output_tokens=int(w.output_len))


def _model_and_tokenizer(plan: RunPlan, watcher: Watcher) -> tuple[str, Any]:
    """The model as the servers read it (a built-in one converted first) and the tokenizer of the prompts."""
    launched = any(b.launched for b in plan.backends)
    model_path = _resolve_model(plan.model, watcher) if (launched or plan.tokenizer is None) else plan.model
    tok_name = plan.tokenizer or model_path
    tok_name = _resolve_model(tok_name, watcher) if tok_name == plan.model else tok_name
    with watcher.wait(f"loading the tokenizer ({tok_name})"):
        return model_path, _load_tokenizer(tok_name)


def _resolve_model(model: str, watcher: Watcher) -> str:
    from reference_engine.builtin_models import BUILTIN_MODELS, builtin_checkpoint

    if model in BUILTIN_MODELS:
        started = time.perf_counter()
        with watcher.wait(f"built-in model {model}: preparing the checkpoint (converted once, then cached)"):
            path = str(builtin_checkpoint(model))
        watcher.say(f"built-in model {model}: checkpoint ready in {time.perf_counter() - started:.1f} s")
        return path
    return model


def _load_tokenizer(name: str) -> Any:
    from transformers import AutoTokenizer

    if name.startswith("random:"):  # random weights of a named shape: the server's synthetic tokenizer
        from reference_engine.loader import resolve_model
        from reference_engine.tokenizer import synthetic_tokenizer

        return synthetic_tokenizer(resolve_model(name).spec)
    try:
        return AutoTokenizer.from_pretrained(name)
    except Exception as exc:
        raise RuntimeError(
            f"cannot load the tokenizer {name!r} (give --tokenizer a local directory): {exc}"
        ) from exc


def pinning(plan: Any) -> tuple[set[int] | None, set[int] | None, str]:
    """(client CPUs, server CPUs, the manifest's note): CPUs of their own when there are enough."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if plan.pin == "off":
        return None, None, f"off (asked); {plural(len(cpus), 'CPU')} shared by client and servers"
    if len(cpus) < 4:
        return (
            None,
            None,
            (
                f"none: only {plural(len(cpus), 'CPU')}, too few to give the client and the servers CPUs of "
                "their own; they share them"
            ),
        )
    return (
        {cpus[-1]},
        set(cpus[:-1]),
        f"client on CPU {cpus[-1]}, launched servers on CPUs {cpus[0]}-{cpus[-2]}",
    )
