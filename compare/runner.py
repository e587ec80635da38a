"""A planned run, from start to report: the run directory, the measuring loop (here or on Ray), the run's
status, and its reports. Ctrl-C and SIGTERM stop the measuring and still leave a partial report.

    outcome = run_plan(plan, Path("runs/x"), ["compare", "run"], n_boot=1000, watcher=Watcher(say=print))
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from rich.markup import escape

from compare.common.exit_codes import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK
from compare.measure.loop import measure
from compare.measure.watcher import Watcher
from compare.plan.run_options import RunPlan

if TYPE_CHECKING:
    from compare.analysis.results import Results
    from compare.measure.run_dir import RunDir


@dataclass
class Outcome:
    """What a run left: its directory, exit code, analysis (None when the report could not be written) and
    the notes already said as errors (the summary's warnings need not repeat them)."""

    run_dir: RunDir
    code: int
    results: Results | None = None
    shown: set[str] = field(default_factory=set)


def run_plan(plan: RunPlan, out: Path, command: list[str], n_boot: int, watcher: Watcher) -> Outcome:
    """Measure `plan` into the new run directory `out` and write its reports. FileExistsError: `out` is
    taken."""
    from compare.measure.run_dir import RunDir

    with watcher.wait("creating the run directory (recording the machine, GPUs and library versions)"):
        run_dir = RunDir.create(out, plan.describe(), command)
    watcher.say(f"run directory: [bold]{escape(str(run_dir.path))}[/bold]")
    if plan.candidates_reason:
        watcher.say(plan.candidates_reason)
    outcome = Outcome(run_dir, EXIT_OK)
    with _interruptible():
        try:
            outcome.code = (
                _measure_on_ray(plan, run_dir, watcher) if plan.ray else _measure(plan, run_dir, watcher)
            )
        except KeyboardInterrupt:
            outcome.code = EXIT_INTERRUPTED
        except Exception as exc:  # the run failed; report what was measured and say why
            note = f"failed: {type(exc).__name__}: {exc}"
            run_dir.manifest["notes"].append(note)
            outcome.shown.add(note)
            watcher.say(f"[red]error:[/red] {escape(str(exc))}")
            outcome.code = EXIT_FAILED
    run_dir.manifest["status"] = {EXIT_OK: "complete", EXIT_INTERRUPTED: "interrupted"}.get(
        outcome.code, "failed"
    )
    run_dir.save()
    if outcome.code == EXIT_INTERRUPTED:
        watcher.say("[yellow]interrupted:[/yellow] writing a partial report of what was measured")
    try:
        with _sigint_ignored(), watcher.wait("analysing the run and writing its reports"):
            results = outcome.results = write_report(run_dir, n_boot, plan.seed)
    except Exception as exc:
        watcher.say(f"[red]could not write the report:[/red] {type(exc).__name__}: {escape(str(exc))}")
        outcome.code = EXIT_FAILED
        return outcome
    summary = results.summary
    if outcome.code == EXIT_OK and (summary.empty or summary["requests_ok"].sum() == 0):
        outcome.code = EXIT_FAILED
    return outcome


def write_report(run_dir: RunDir, n_boot: int, seed: int = 0) -> Results:
    """Analyse `run_dir` and write its reports; the analysis."""
    from compare.analysis.results import analyze
    from compare.report.write import write_reports

    results = analyze(run_dir, n_boot=n_boot, seed=seed)
    write_reports(results)
    return results


def _measure(plan: RunPlan, run_dir: RunDir, watcher: Watcher) -> int:
    """The measuring loop here, its load points proposed by the plan's source (a sweep chooses them as it
    goes, from the analysis of those measured)."""
    from compare.analysis.load_search import point_source

    return measure(plan, run_dir, watcher, points=point_source(plan))


def _measure_on_ray(plan: RunPlan, run_dir: RunDir, watcher: Watcher) -> int:
    from compare.measure.ray_run import measure_on_ray

    return measure_on_ray(plan, run_dir, watcher)


@contextlib.contextmanager
def _interruptible() -> Iterator[None]:
    """SIGINT and SIGTERM both take the Ctrl-C path (in-flight requests recorded as cancelled, servers
    stopped, partial report), whatever the parent did: a shell starts background jobs with SIGINT ignored,
    and Python then leaves it ignored, so both handlers are set here rather than inherited."""

    def on_sigterm(_signum: int, frame: FrameType | None) -> None:
        # whoever handles SIGINT now (the load generator's event loop cancels its run) handles this too
        handler = signal.getsignal(signal.SIGINT)
        if not callable(handler):
            raise KeyboardInterrupt
        handler(signal.SIGINT, frame)

    try:
        previous = signal.signal(signal.SIGINT, signal.default_int_handler), signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, on_sigterm)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous[0])
        signal.signal(signal.SIGTERM, previous[1])


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    """While the (partial) report is written, a second Ctrl-C must not leave it half-written."""
    try:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
