"""`compare run --ray ... --ray-cells`: every backend x variant x load point is a Ray task.

A cell asks Ray for its resources (`--ray-cell-resources`; by default one GPU where the cluster has GPUs,
else one CPU), and on the node it is given runs the ordinary measuring loop of `compare run` for its one
backend and load point: launch (Ray's CUDA_VISIBLE_DEVICES reaches the server), warm-up, load, teardown.
It streams what it measures as it measures it: the point's manifest entry, the requests it began, every
record as it ends, the point's summary, and at the end its set-up reports and server logs. The driver
writes all of it into the one run directory as it arrives, so the report covers the whole matrix.

- Cells of a backend reached at an `--endpoint` ask for one CPU and run one after another (two cells
  measuring one server at once would measure each other).
- Every cell gets prompts of its own (the dataset seed is offset by the load point), so no point is
  answered from the prefix cache of another; backends at the same point get the same prompts.
- Each cell's times are on its node's clock; every metric of a point compares times of that point only,
  which all come from one node.
- A cell whose worker or node dies loses only the requests it had in flight, written as failed
  (`client_lost`) with the reason; the other cells go on, and the note names the cell.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import queue
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray

from adapters.request_spec import spec_id_of
from compare.common.exit_codes import EXIT_FAILED, EXIT_INTERRUPTED
from compare.measure.loop import measure
from compare.measure.point import Load
from compare.plan.run_options import RunPlan
from workloads.clocks import RecordLabels, Started, lost_record
from workloads.distributed import stream_batches
from workloads.records import RecordWriter, RequestRecord

if TYPE_CHECKING:
    from compare.measure.run_dir import RunDir

SEED_STRIDE = 7919  # dataset seed offset per load point (workloads add their index, so keep it large)
FLUSH_S = 0.1


@dataclasses.dataclass(frozen=True)
class Cell:
    index: int
    plan: RunPlan  # of one backend and one load point
    point: int  # the load point's index in the whole plan
    command: list[str]

    @property
    def name(self) -> str:
        b = self.plan.backends[0]
        return f"{b.key} {self.plan.load_points[0].label}"


def cells_of(plan: RunPlan, command: list[str]) -> list[Cell]:
    out: list[Cell] = []
    for backend in plan.backends:
        for k, schedule in enumerate(plan.load_points):
            sub = dataclasses.replace(
                plan,
                backends=[backend],
                load_points=[schedule],
                seed=plan.seed + k * SEED_STRIDE,
                ray=None,
                ray_cells=False,
                gpu_telemetry="off",  # sampled on the cell's node, the samples would not come back
            )
            out.append(Cell(len(out), sub, k, command))
    return out


def default_resources(launched: bool) -> dict[str, float]:
    if launched and ray.cluster_resources().get("GPU", 0) > 0:
        return {"GPU": 1.0}
    return {"CPU": 1.0}


def task_options(resources: dict[str, float]) -> dict[str, Any]:
    custom = {k: v for k, v in resources.items() if k not in ("CPU", "GPU")}
    return {
        "num_cpus": resources.get("CPU", 0.0),
        "num_gpus": resources.get("GPU", 0.0),
        "resources": custom,
        "max_retries": 0,  # a measurement is not repeated behind the user's back
    }


# -- on the node ------------------------------------------------------------------------------------------


def run_cell(cell: Cell) -> Iterator[dict[str, Any]]:
    """The Ray task (a streaming generator): measure one cell, stream it, clean up after itself."""
    from compare.measure.run_dir import RunDir

    out: queue.SimpleQueue = queue.SimpleQueue()
    stop = threading.Event()
    controls: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="llmc-cell-") as tmp:
        run_dir = RunDir.create(Path(tmp) / "run", cell.plan.describe(), cell.command)
        result: dict[str, Any] = {}

        def measure_cell() -> None:
            try:
                # silent: progress bars belong to the driver's terminal
                result["code"] = measure(
                    cell.plan, run_dir, load=_streaming_load(run_dir, out, stop, controls)
                )
            except KeyboardInterrupt:
                result["code"] = EXIT_INTERRUPTED
            except BaseException as exc:
                run_dir.manifest["notes"].append(f"failed: {type(exc).__name__}: {exc}")
                result["code"] = EXIT_FAILED
            finally:
                out.put(("end", None))

        worker = threading.Thread(target=measure_cell, daemon=True)
        worker.start()
        try:
            yield from _stream(out)
        except KeyboardInterrupt:  # ray.cancel: stop the load, and the server with it, before leaving
            stop.set()
            _cancel(controls)
            worker.join(60)
            raise
        worker.join()
        logs = {p.name: p.read_text(errors="replace") for p in (run_dir.path / "logs").glob("*.log")}
        manifest = run_dir.manifest
        yield {
            "final": {
                "code": result.get("code", EXIT_FAILED),
                "setups": manifest.get("setups", []),
                "notes": manifest.get("notes", []),
                "pinning": manifest.get("pinning"),
                "logs": logs,
                "where": _where(),
            }
        }


def _stream(out: queue.SimpleQueue) -> Iterator[dict[str, Any]]:
    controls = {"point": lambda item: {"point": item}, "summary": lambda item: {"summary": item}}
    return stream_batches(out, controls, FLUSH_S)


def _streaming_load(
    run_dir: RunDir, out: queue.SimpleQueue, stop: threading.Event, controls: dict[str, Any]
) -> Load:
    """`run_load_sync` that streams as it goes, and can be stopped from another thread."""
    from workloads.loadgen import PointJob, new_runner, run_load

    def load(job: PointJob) -> list[RequestRecord]:
        run_id = job.run_id
        entry = next(p for p in run_dir.manifest["points"] if p["run_id"] == run_id)
        out.put(("point", entry))
        sizes = {
            s.request_id: (s.prompt_len, s.wanted_output_tokens) for s in (*job.specs, *job.warmup_specs)
        }

        def started(request_id: str, scheduled: float, start: float, warmup: bool) -> None:
            prompt, wanted = sizes.get(spec_id_of(request_id), (0, 1))
            out.put(("s", (run_id, request_id, scheduled, start, warmup, prompt, wanted)))

        async def main() -> list[RequestRecord]:
            controls["loop"], controls["task"] = asyncio.get_running_loop(), asyncio.current_task()
            if stop.is_set():
                raise asyncio.CancelledError
            streaming = dataclasses.replace(
                job, on_start=started, on_record=lambda r: out.put(("r", r.model_dump_json()))
            )
            return await run_load(streaming)

        with new_runner() as runner:
            records = runner.run(main())
        controls.clear()
        summary = job.summary_path or run_dir.runs_path  # a point's job names the run directory's
        for line in reversed(Path(summary).read_text().splitlines()):
            if f'"run_id":"{run_id}"' in line:
                out.put(("summary", line))
                break
        return records

    return load


def _cancel(controls: dict[str, Any]) -> None:
    loop, task = controls.get("loop"), controls.get("task")
    if loop is not None and task is not None:
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(task.cancel)


def _where() -> dict[str, Any]:
    import os

    ctx = ray.get_runtime_context()
    return {
        "node_id": ctx.get_node_id(),
        "node_ip": ray.util.get_node_ip_address(),
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "resources": ctx.get_assigned_resources(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


# -- on the driver ----------------------------------------------------------------------------------------


class _Gather:
    """Writes what the cells stream into the one run directory."""

    def __init__(self, run_dir: RunDir, plan: RunPlan, say: Callable[[str], None]) -> None:
        self.run_dir, self.plan, self.say = run_dir, plan, say
        self.requests = RecordWriter(run_dir.requests_path)
        self.inflight: dict[int, dict[str, tuple[str, Started]]] = {}
        self.t0: dict[str, float] = {}
        self.codes: list[int] = []

    def take(self, cell: Cell, message: dict[str, Any]) -> None:
        mine = self.inflight.setdefault(cell.index, {})
        if "point" in message:
            entry = dict(message["point"]) | {"repeat": self._repeat(cell, message["point"].get("repeat", 0))}
            self.run_dir.manifest["points"].append(entry | {"cell": cell.index})
            self.run_dir.save()
        for run_id, request_id, scheduled, start, warmup, prompt, wanted in message.get("started", ()):
            mine[request_id] = (run_id, Started(request_id, scheduled, start, warmup, prompt, wanted))
        for line in message.get("records", ()):
            record = RequestRecord.model_validate_json(line)
            mine.pop(record.request_id, None)
            self.t0.setdefault(record.run_id, record.t0_monotonic)
            self.requests.append(record)
        if "summary" in message:
            with self.run_dir.runs_path.open("a", encoding="utf-8") as f:
                f.write(message["summary"].rstrip("\n") + "\n")
        if "final" in message:
            self._final(cell, message["final"])

    def _repeat(self, cell: Cell, repeat: int) -> int:
        """Every cell launches its own server: each is a launch of its backend, numbered by point."""
        return cell.point * self.plan.repeats + int(repeat)

    def _final(self, cell: Cell, final: dict[str, Any]) -> None:
        from compare.common.datatypes import SetupReport

        suffix = cell.plan.load_points[0].label.replace("=", "")
        for name, text in final["logs"].items():
            target = self.run_dir.path / "logs" / f"{Path(name).stem}-{suffix}.log"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        for setup in final["setups"]:
            report = SetupReport.from_dict(setup)
            report.repeat = self._repeat(cell, report.repeat)
            if report.log_path:
                report.log_path = str(
                    self.run_dir.path / "logs" / f"{Path(report.log_path).stem}-{suffix}.log"
                )
            self.run_dir.set_setup(report)
        self.run_dir.manifest["notes"] += [f"cell {cell.name}: {n}" for n in final["notes"]]
        self.run_dir.manifest["ray"].setdefault("cells", []).append(
            {"cell": cell.index, "name": cell.name, "code": final["code"], "pinning": final["pinning"]}
            | {"where": final["where"]}
        )
        self.run_dir.save()
        self.codes.append(final["code"])

    def lose(self, cell: Cell, reason: str, cancelled: bool = False) -> None:
        from workloads.records import ErrorKind

        lost = self.inflight.pop(cell.index, {})
        for run_id, started in lost.values():
            t0 = self.t0.get(run_id, started.start)
            b = cell.plan.backends[0]
            labels = RecordLabels(
                run_id=run_id,
                backend=b.name,
                variant=b.variant,
                load_point=cell.plan.load_points[0].label,
                output_length_forced=False,
            )
            record = lost_record(
                started, labels, t0=t0, offset_s=0.0, host=f"cell-{cell.index}", reason=reason
            )
            if cancelled:
                record = record.model_copy(update={"error_kind": ErrorKind.CANCELLED})
            self.requests.append(record)
        note = f"cell {cell.name}: {reason}; {len(lost)} requests in flight recorded as " + (
            "cancelled" if cancelled else "failed (client_lost)"
        )
        self.run_dir.manifest["notes"].append(note)
        self.run_dir.manifest["ray"].setdefault("cells", []).append(
            {"cell": cell.index, "name": cell.name, "lost": reason}
        )
        self.run_dir.save()
        if not cancelled:
            self.say(f"[yellow]warning:[/yellow] {note}")


def run_cells(plan: RunPlan, run_dir: RunDir, say: Callable[[str], None]) -> int:
    """Run every cell as a Ray task and gather them into `run_dir`; the worst cell's exit code."""
    from compare.measure.gpu_sampling import telemetry_off

    cells = cells_of(plan, run_dir.manifest.get("command", []))
    why = "off: --ray-cells measures on the cells' nodes, whose GPU samples are not carried back"
    run_dir.manifest["gpu_telemetry"] = telemetry_off(why).entry
    gather = _Gather(run_dir, plan, say)
    remote = ray.remote(run_cell)
    info = run_dir.manifest["ray"]
    info["cell_resources"] = {}
    running: dict[int, ray.ObjectRefGenerator] = {}

    def submit(cell: Cell) -> ray.ObjectRefGenerator:
        backend = cell.plan.backends[0]
        resources = (plan.ray_cell_resources if backend.launched else {}) or default_resources(
            backend.launched
        )
        info["cell_resources"][cell.name] = resources
        gen = remote.options(**task_options(resources)).remote(cell)
        running[cell.index] = gen
        return gen

    async def consume(group: list[Cell]) -> None:
        for cell in group:  # one after another within a group
            gen = submit(cell)
            try:
                async for ref in gen:
                    gather.take(cell, await ref)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                gather.lose(cell, f"the cell's task died ({type(exc).__name__}: {text})")
                gather.codes.append(EXIT_FAILED)
            finally:
                running.pop(cell.index, None)

    groups: dict[str, list[Cell]] = {}
    for cell in cells:
        b = cell.plan.backends[0]
        groups.setdefault(b.endpoint or f"cell-{cell.index}", []).append(cell)
    say(f"ray: {len(cells)} cells as tasks")

    async def main() -> bool:
        tasks = [asyncio.create_task(consume(g)) for g in groups.values()]
        try:
            await asyncio.wait(tasks)
            return False
        except asyncio.CancelledError:
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            for gen in list(running.values()):
                with contextlib.suppress(Exception):
                    ray.cancel(gen)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            return True

    try:
        with asyncio.Runner() as runner:
            interrupted = runner.run(main())
    finally:
        gather.requests.close()
    if interrupted:
        for cell in cells:
            if gather.inflight.get(cell.index):
                gather.lose(cell, "the run was stopped", cancelled=True)
        raise KeyboardInterrupt
    return max(gather.codes, default=EXIT_FAILED)
