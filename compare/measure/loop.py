"""The measuring loop of `compare run`: every backend (launched or reached) through every workload and load
point, in alternating launch order (or, for running endpoints, alternating blocks), each point's records and
summary appended to the run directory. A launch's points in a workload are those its `PointSource`
proposes (`compare/measure/load_points.py`): the plan's list, or a sweep's choice from what it measured.

It prints nothing itself: messages and each point's progress go to the `Watcher` it is given, so that the
command line shows progress bars and a Ray cell, measuring on another node, stays silent.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from adapters.base import Adapter
from compare.common.datatypes import SetupReport
from compare.common.exit_codes import EXIT_FAILED, EXIT_OK
from compare.common.text import plural
from compare.measure.load_points import FixedPoints, PointSource
from compare.measure.model import model_and_tokenizer
from compare.measure.order import block_order, launch_order
from compare.measure.point import Load, Point, Source
from compare.measure.prompts import Prompts
from compare.measure.watcher import SILENT, Watcher
from compare.plan.run_options import BackendSpec, RunPlan, WorkloadSpec

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from adapters.request_spec import RequestSpec
    from compare.launch.launcher import Launcher
    from compare.measure.gpu_sampling import GpuTelemetry, GpuWatch
    from compare.measure.run_dir import RunDir

#: a reached or started backend as its points use it: its adapter, URL and GPU watch (None: not sampled)
Served = tuple[Adapter, str, "GpuWatch | None"]


def measure(
    plan: RunPlan,
    run_dir: RunDir,
    watcher: Watcher = SILENT,
    load: Load | None = None,
    points: type[PointSource] = FixedPoints,
) -> int:
    """Measure every point of `plan` into `run_dir` with `load(PointJob)` (default `run_load_sync`), each
    launch's points in each workload proposed by a `points(plan)` (default: the plan's list); the exit code.
    Raises KeyboardInterrupt when a point was interrupted (launched servers are stopped first)."""
    from compare.measure.gpu_sampling import open_telemetry
    from workloads.loadgen import run_load_sync

    model_path, tokenizer = model_and_tokenizer(plan, watcher)
    client_cpus, server_cpus, pin_note = pinning(plan)
    run_dir.manifest["pinning"] = pin_note
    run_dir.manifest["model_path"] = model_path
    run_dir.save()
    prompts = Prompts(plan, tokenizer, points.most_points(plan))
    telemetry = open_telemetry(plan.gpu_telemetry, plan.gpu_telemetry_interval)
    run_dir.manifest["gpu_telemetry"] = telemetry.entry
    run_dir.save()
    saved_affinity = os.sched_getaffinity(0) if client_cpus else None
    if client_cpus:
        os.sched_setaffinity(0, client_cpus)
    code = EXIT_OK
    try:
        if (plan.blocks or 1) > 1:
            code = Blocks(plan, run_dir, watcher, telemetry).run(prompts, load or run_load_sync, tokenizer)
        else:
            for repeat, backend in launch_order(plan.backends, plan.repeats):
                launch = Launch(plan, run_dir, backend, repeat, watcher, telemetry, points)
                if not launch.run(model_path, server_cpus, prompts, load or run_load_sync, tokenizer):
                    code = EXIT_FAILED
    finally:
        telemetry.close()
        if saved_affinity:
            os.sched_setaffinity(0, saved_affinity)
    return code


@dataclass(frozen=True)
class Launch:
    """One backend in one repeat: started (or reached), measured at every point its `points` propose in each
    workload (its GPUs sampled where `telemetry` is on), stopped."""

    plan: RunPlan
    run_dir: RunDir
    backend: BackendSpec
    repeat: int
    watcher: Watcher
    telemetry: GpuTelemetry  # off: watches nothing
    points: type[PointSource] = FixedPoints

    def run(
        self,
        model_path: str,
        server_cpus: set[int] | None,
        prompts: Prompts,
        load: Load,
        tokenizer: PreTrainedTokenizerBase,
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
            for workload, per_point in prompts.workloads:
                served = (adapter, setup.url, gpu)
                self._measure_workload(workload, per_point, served, prompts, load, tokenizer)
            return True
        except LaunchError as exc:
            self._failed(exc)
            return False
        finally:
            if launcher is not None:
                launcher.stop()
                self.run_dir.set_setup(launcher.report)

    def _measure_workload(
        self,
        workload: WorkloadSpec,
        per_point: list[Source],
        served: Served,
        prompts: Prompts,
        load: Load,
        tokenizer: PreTrainedTokenizerBase,
    ) -> None:
        """Every point the launch's source proposes in one workload, each from the prompts of its own slice
        (`served`: the backend's adapter, URL and GPU watch). Raises KeyboardInterrupt when a point was
        interrupted."""
        adapter, url, gpu = served
        source = self.points(self.plan)
        k = 0
        while (proposed := source.next_point()) is not None:
            index = self.repeat * prompts.points + k  # the slice of launch and point
            point = Point(
                self.plan,
                self.backend,
                adapter,
                url,
                workload,
                proposed.schedule,
                self.repeat,
                gpu=gpu,
                min_requests=proposed.min_requests,
            )
            measured = point.run(
                self.run_dir, per_point[index], prompts.warm[index], load, tokenizer, self.watcher
            )
            if measured.interrupted:
                raise KeyboardInterrupt
            source.measured(measured)
            k += 1
        conclusion = source.conclusion()
        if conclusion:
            self.watcher.say(f"{self.backend.key} {workload.label}: {conclusion}")

    def adapter(self) -> Adapter:
        from adapters import ADAPTERS, get_adapter

        plan, backend = self.plan, self.backend
        served = plan.served_model or plan.model
        own = ADAPTERS[backend.name].own_model_name  # its model option is no served name (Triton's)
        options = {} if own and not plan.served_model else {"model": served}
        return get_adapter(backend.name, **options)

    def reach(self) -> Served | None:
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

    def _reach(self, adapter: Adapter) -> SetupReport:
        from compare.launch.launcher import LaunchError, endpoint_report

        backend = self.backend
        if backend.endpoint is None:
            raise LaunchError(f"{backend.key}: no endpoint to reach")
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

    def _start(
        self, launcher: Launcher, adapter: Adapter, cold_spec: RequestSpec
    ) -> tuple[Adapter, SetupReport]:
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
        first = setup.cold_first_token_s  # measured once ready (a failed first request raised LaunchError)
        later = f", first token {first * 1e3:.0f} ms later" if first is not None else ""
        say(f"{backend.key}: ready in {setup.ready_s:.1f} s{later}")
        return adapter, setup


@dataclass(frozen=True)
class Blocks:
    """Running endpoints measured point by point in alternating blocks (`block_order`: A B, B A, ...), each
    block 1/N of the point's requests or duration (`block_budget`), so that what drifts on the machine
    between one backend's turn and the next is spread over both instead of taken for a difference. Each
    block is a run of its own in the run directory, labelled like a launch of `--repeats`: `repeat` =
    repeat x blocks + block (so the verdicts check a winner block by block as they do launch by launch),
    and the manifest's point entry says `block` and `blocks`."""

    plan: RunPlan
    run_dir: RunDir
    watcher: Watcher
    telemetry: GpuTelemetry

    def run(self, prompts: Prompts, load: Load, tokenizer: PreTrainedTokenizerBase) -> int:
        """The exit code. Raises KeyboardInterrupt when a point was interrupted."""
        plan, blocks, code = self.plan, self.plan.blocks or 1, EXIT_OK
        for repeat in range(plan.repeats):
            reached = []
            for backend in plan.backends:
                launch = Launch(plan, self.run_dir, backend, repeat, self.watcher, self.telemetry)
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
                        point = Point(
                            plan, launch.backend, adapter, url, w, schedule, label, gpu=gpu, block=(b, blocks)
                        )
                        if point.run(
                            self.run_dir, per_point[index], prompts.warm[index], load, tokenizer, self.watcher
                        ).interrupted:
                            raise KeyboardInterrupt
        return code


def pinning(plan: RunPlan) -> tuple[set[int] | None, set[int] | None, str]:
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
