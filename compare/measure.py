"""The measuring loop of `compare run`: every backend (launched or reached) through every workload and load
point, in alternating launch order, each point's records and summary appended to the run directory.

It prints nothing itself: messages and each point's progress go to the `Watcher` it is given, so that the
command line shows progress bars and a Ray cell, measuring on another node, stays silent.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from compare.exit_codes import EXIT_FAILED, EXIT_OK
from compare.run_options import BackendSpec, RunPlan, WorkloadSpec
from compare.text import plural
from workloads.schedule import Schedule

#: shows a point's progress: (measured requests so far, output tokens/s or nan, failed requests, phase): the
#: phase is "" while measuring, "warm-up 2/4" (warm-up requests done of those sent first) before
ShowProgress = Callable[[int, float, int, str], None]
#: updates the status line of a wait (`Watcher.wait`) with what it is at now
ShowStatus = Callable[[str], None]
#: prompts per load point when only a duration bounds it (there is no request count to size them by)
DURATION_BOUND_PROMPTS = 256
PREFIX_SEEDS = 1_000_003  # seeds of a workload's slices: seed * PREFIX_SEEDS + slice


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
    from compare.gpu_telemetry import open_telemetry
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


class _Prompts:
    """The requests of every point. Each load point gets prompts of its own (one backend's server would
    otherwise answer a later point from its prefix cache), and every backend gets the same prompts at the
    same point."""

    def __init__(self, plan: RunPlan, tokenizer: Any) -> None:
        from workloads.datasets import make_dataset

        n = plan.num_requests or DURATION_BOUND_PROMPTS
        self.points = points_per_launch(plan)
        slices = self.points * plan.repeats  # a running endpoint keeps its prefix cache between repeats
        self.workloads = [
            (w, _slices(make_dataset, w, tokenizer, n, slices, plan.seed + i))
            for i, w in enumerate(plan.workloads)
        ]
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
    from compare.capacity import MAX_BISECTIONS
    from compare.sweep import MAX_EXTRA

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
    telemetry: Any  # compare.gpu_telemetry.GpuTelemetry (off: watches nothing)

    def run(
        self, model_path: str, server_cpus: set[int] | None, prompts: _Prompts, load: Callable, tokenizer: Any
    ) -> bool:
        """False when the backend could not be started or reached (the note says why)."""
        from rich.markup import escape

        from adapters import get_adapter
        from compare.launch import LaunchError

        plan, backend, say = self.plan, self.backend, self.watcher.say
        served = plan.served_model or plan.model
        options = {} if backend.name == "trtllm-triton" and not plan.served_model else {"model": served}
        adapter = get_adapter(backend.name, **options)
        launcher = None
        try:
            if backend.launched:
                from compare.backend_launch import make_launcher

                launcher = make_launcher(
                    plan, backend, self.run_dir, self.repeat, model_path, server_cpus, say
                )
                adapter, setup = self._start(launcher, adapter, prompts.cold[self.repeat])
            else:
                from compare.launch import endpoint_report

                setup = endpoint_report(backend.name, backend.variant, backend.endpoint, adapter.health_path)
                setup.repeat = self.repeat
            from compare.declared import collect

            collect(setup, model_path if backend.launched else None)  # for the parity audit
            self.run_dir.set_setup(setup)
            gpu = self.telemetry.watch(backend.key, launcher, backend.endpoint)
            for w, per_point in prompts.workloads:
                if plan.sweep:
                    _SweepRun(self, adapter, setup.url, w, tokenizer, gpu).run(per_point, prompts.warm, load)
                    continue
                for k, schedule in enumerate(plan.load_points):
                    index = self.repeat * prompts.points + k
                    point = _Point(plan, backend, adapter, setup.url, w, schedule, self.repeat, gpu=gpu)
                    if point.run(
                        self.run_dir, per_point[index], prompts.warm[index], load, tokenizer, self.watcher
                    ):
                        raise KeyboardInterrupt
            return True
        except LaunchError as exc:
            why = escape(str(exc).removeprefix(f"{backend.key}: "))  # a log's own [brackets] are no markup
            verb = "started" if backend.launched else "reached"
            say(f"[red]{backend.key} could not be {verb}:[/red] {why}")
            self.run_dir.manifest["notes"].append(
                str(exc) if str(exc).startswith(backend.key) else f"{backend.key}: {exc}"
            )
            return False
        finally:
            if launcher is not None:
                launcher.stop()
                self.run_dir.set_setup(launcher.report)

    def _start(self, launcher: Any, adapter: Any, cold_spec: Any) -> tuple[Any, Any]:
        """Start the server, time it, measure its cold first token: (the adapter for it, its set-up
        report)."""
        from adapters import get_adapter
        from compare.backend_launch import measure_cold_first_token

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
class _SweepRun:
    """A sweep (and with --capacity, the search after it) of one launched backend in one workload: each
    point chosen from those measured before it (`compare.sweep`, `compare.capacity`)."""

    launch: _Launch
    adapter: Any
    url: str
    workload: WorkloadSpec
    tokenizer: Any
    gpu: Any = None  # compare.gpu_telemetry.GpuWatch: the backend's GPUs, sampled at each point

    def run(self, specs: list[list], warm: list[list], load: Callable) -> None:
        """Raises KeyboardInterrupt when a point was interrupted."""
        from compare import capacity
        from compare.sweep import Sweep, first_saturated, knee

        plan, launch = self.launch.plan, self.launch
        per_launch = len(specs) // plan.repeats  # the slices of this launch (a sweep has one)
        slices = iter(range(launch.repeat * per_launch, (launch.repeat + 1) * per_launch))

        def measure_one(schedule: Schedule) -> Any:
            k = next(slices)
            backend, workload = launch.backend, self.workload
            point = _Point(plan, backend, self.adapter, self.url, workload, schedule, launch.repeat,
                           gpu=self.gpu)
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
        from compare.metrics import request_table, summarize
        from compare.sweep import point_facts

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
    gpu: Any = None  # compare.gpu_telemetry.GpuWatch: sampled from before the load starts to after it ends

    def run(
        self, run_dir: Any, specs: list, warm_specs: list, load: Callable, tokenizer: Any, watcher: Watcher
    ) -> bool:
        """Run the point with its progress shown; True when it was interrupted."""
        from compare.metrics import running_output_rate
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
        title = f"{backend.key} {self.workload.label} {schedule.label}" + (
            f" (launch {self.repeat + 1})" if plan.repeats > 1 else ""
        )
        sessions = specs if self.workload.sessions else []  # multi-turn: Sessions, one request per turn
        if sessions:
            from workloads.sessions import session_requests

            sessions = sessions[: plan.num_requests] if plan.num_requests else sessions
            specs = []
        total = session_requests(sessions) if sessions and plan.num_requests else plan.num_requests
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
                max_requests=plan.num_requests,
                max_duration_s=plan.duration,
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
            )
            sampling = self.gpu.sample(run_dir, run_id) if self.gpu is not None else contextlib.nullcontext()
            with sampling:  # the GPUs are sampled from before the load starts to after it ends
                load(job)
        summaries = [s for s in read_run_summaries(run_dir.runs_path) if s.run_id == run_id]
        return bool(summaries and summaries[-1].interrupted)


def _slices(make_dataset: Any, w: WorkloadSpec, tokenizer: Any, n: int, slices: int, seed: int) -> list[list]:
    """`slices` lists of `n` requests, one per load point and launch. A shared-prefix workload gets prefixes
    of its own in each, so that no point is served from the prefix cache another point filled."""
    if w.dataset == "prefix":
        return [
            _prefix_dataset(make_dataset, w, tokenizer, n, seed * PREFIX_SEEDS + k, k) for k in range(slices)
        ]
    specs = _dataset(make_dataset, w, tokenizer, n * slices, seed)
    return [specs[k * n : (k + 1) * n] or specs for k in range(slices)]


def _prefix_dataset(make_dataset: Any, w: WorkloadSpec, tokenizer: Any, n: int, seed: int, k: int) -> list:
    """`n` requests in `w.prefix_groups` groups (the last ones cut off when the groups do not divide `n`)."""
    assert w.prefix_groups is not None
    per_group = -(-n // w.prefix_groups)
    specs = make_dataset(
        "prefix",
        tokenizer,
        w.prefix_groups,
        per_group,
        w.prefix_len,
        w.input_len,
        w.output_len,
        seed=seed,
        id_prefix=f"prefix{k}",
    )
    return specs[:n]


def _dataset(make_dataset: Any, w: WorkloadSpec, tokenizer: Any, n: int, seed: int) -> list:
    """`n` requests of the workload (multi-turn workloads: `n` sessions)."""
    if w.sessions:
        from workloads.sessions import sharegpt_sessions, synthetic_sessions

        think = w.think_time or 0.0
        if w.dataset == "multi-turn":
            assert w.turns is not None
            return synthetic_sessions(tokenizer, n, w.turns, w.input_len, w.output_len, think, seed=seed)
        return sharegpt_sessions(w.path, tokenizer, n=n, turns=w.turns, think_time=think, seed=seed)
    if w.dataset == "random":
        return make_dataset("random", tokenizer, n, input_len=w.input_len, output_len=w.output_len, seed=seed)
    if w.dataset == "fixed":
        return make_dataset("fixed", tokenizer, n, seed=seed)
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
