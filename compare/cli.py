"""The `compare` command line: run a comparison, rebuild its reports, diff two runs, import other tools'
results.

    compare run                                   # the embedded default: reference engine, built-in model
    compare run --backends vllm,tgi --endpoint vllm=http://127.0.0.1:8000 --endpoint tgi=http://127.0.0.1:8080
    compare run --launch docker --backends vllm,tgi,trtllm --model /srv/models/llama  # start, time, measure
    compare report runs/20250101-120000
    compare diff runs/A runs/B
    compare import result.json --into runs/A

Exit codes of `run`: 0 every load point ran; 1 a backend could not be started or reached, or no request
succeeded; 2 the options are wrong; 130 interrupted (Ctrl-C or SIGTERM; a partial report is written).
"""

from __future__ import annotations

import inspect
import logging
import math
import os
import sys
import time
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from typer.core import TyperCommand

from compare import terminal
from compare.common.exit_codes import EXIT_USAGE
from compare.common.text import plural
from compare.measure.watcher import Watcher
from compare.plan.run_options import LOCAL_RAY, RUN_OPTIONS, PlanError, RunOption, RunPlan
from compare.terminal import console_watcher

if TYPE_CHECKING:
    from typer._click.core import Context  # typer's own copy of click, whose commands take its Context

    from compare.analysis.results import Results
    from compare.measure.run_dir import RunDir

APP_HELP = (
    "Compare LLM serving backends under one load generator: run a comparison and write its reports, "
    "rebuild the reports of a run, diff two runs, import other tools' results, or try the reference engine "
    "(demo). `compare COMMAND --help` says more; `compare run --help` lists the run's options by topic."
)
app = typer.Typer(add_completion=False, no_args_is_help=False, help=APP_HELP, rich_markup_mode="rich")
# piped output is wide unless COLUMNS says otherwise; a terminal's own width is read from it
console = Console(width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160)

DEMO_PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about paged attention.",
    "Explain in one sentence why batching helps LLM serving.",
    "List three prime numbers.",
]


@app.command()
def demo(
    model: str = typer.Option("smollm2-135m", help="checkpoint dir, hub id, built-in name or random:<shape>"),
    max_tokens: int = typer.Option(48, min=1),
    device: str = typer.Option("auto"),
    dtype: str = typer.Option("auto"),
) -> None:
    """Generate answers to a few chat prompts with the reference engine (greedy) and report the speed."""
    from reference_engine import Engine, EngineConfig, SamplingParams

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    engine = Engine(EngineConfig(model=model, device=device, dtype=dtype))
    tok = engine.tokenizer
    prompts: list[list[int]] = []
    for text in DEMO_PROMPTS:
        if getattr(tok, "chat_template", None):
            prompts.append(
                _token_ids(
                    tok.apply_chat_template(
                        [{"role": "user", "content": text}],
                        add_generation_prompt=True,
                        tokenize=True,
                        return_dict=False,
                    )
                )
            )
        else:
            prompts.append(tok.encode(text))
    start = time.perf_counter()
    outs = engine.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0.0))
    elapsed = time.perf_counter() - start
    table = Table("prompt", "answer", "tokens", "finish")
    for text, out in zip(DEMO_PROMPTS, outs, strict=True):
        table.add_row(
            text,
            str(tok.decode(out.token_ids, skip_special_tokens=True)),  # one sequence: one string
            str(len(out.token_ids)),
            out.finish_reason or "",
        )
    console.print(table)
    n = sum(len(o.token_ids) for o in outs)
    console.print(
        f"{plural(n, 'token')} in {elapsed:.2f} s ({n / elapsed:.1f} tok/s) on {engine.device}; "
        f"set-up {engine.setup.phases['total']:.2f} s"
    )


def _token_ids(value: object) -> list[int]:
    """A tokenised chat prompt as the token ids it is (apply_chat_template with tokenize=True and
    return_dict=False); TypeError for anything else."""
    if not (isinstance(value, list) and all(isinstance(t, int) for t in value)):
        raise TypeError(f"the chat template gave {type(value).__name__}, not token ids")
    return value


# -- compare run --------------------------------------------------------------------------------------------


def ray_value(args: list[str]) -> list[str]:
    """`--ray` with no value (last, or before another option) means a local instance: a click option either
    always or never takes a value, so the value `local` is written in before parsing."""
    out: list[str] = []
    for i, arg in enumerate(args):
        out.append(arg)
        if arg == "--ray" and (i + 1 == len(args) or args[i + 1].startswith("-")):
            out.append(LOCAL_RAY)
    return out


class RunCommand(TyperCommand):
    """`compare run`, whose `--ray` takes an optional address."""

    def parse_args(self, ctx: Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, ray_value(args))


def run(**given: Any) -> None:
    """Measure backends under load and write the run directory with its reports.

    Exit codes: 0 every load point ran; 1 a backend could not be started or reached, or no request
    succeeded; 2 the options are wrong (checked before any work starts); 130 interrupted by Ctrl-C or
    SIGTERM (in-flight requests are recorded as cancelled, launched servers stopped, a partial report
    written).
    """
    from compare.plan.build import build_plan, run_file_out

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    config, out, n_boot = given.pop("config"), given.pop("out"), given.pop("n_boot")
    try:
        plan = build_plan(given, config)
        out = out or run_file_out(config)
    except PlanError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(EXIT_USAGE) from None
    try:
        code = execute(plan, out, n_boot)
    except FileExistsError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        code = EXIT_USAGE
    raise typer.Exit(code)


def _parameter(option: RunOption) -> inspect.Parameter:
    """The typer parameter of a run option: not given (None) unless the command line alone has it; the help
    escaped, so that `[default: ...]` reads as written."""
    # Names always given: typer 0.27 named an option after its metavar when none was (--MODEL, not --model).
    info = typer.Option(
        *(option.flags or (option.flag,)),
        help=escape(option.help),
        rich_help_panel=option.panel,
        metavar=option.metavar,
        min=option.minimum,
    )
    kind = option.type if not option.plan and option.default is not None else option.type | None
    default = None if option.plan else option.default
    return inspect.Parameter(
        option.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[kind, info]
    )


def reflowed(doc: str | None) -> str:
    """A docstring as help text whose paragraphs wrap at the terminal's width: typer's rich help keeps the
    line breaks of every paragraph after the first, which at 80 columns leaves lines cut in two."""
    paragraphs = inspect.cleandoc(doc or "").split("\n\n")
    return "\n\n".join(" ".join(p.split()) for p in paragraphs)


run.__signature__ = inspect.Signature([_parameter(o) for o in RUN_OPTIONS])  # type: ignore[attr-defined]
app.command(cls=RunCommand, help=reflowed(run.__doc__))(run)


def execute(plan: RunPlan, out: Path | None, n_boot: int = 1000) -> int:
    """Run `plan` with progress bars and messages on the console, then print its summary; the exit code."""
    from compare.measure.run_dir import default_run_dir
    from compare.runner import run_plan

    outcome = run_plan(plan, out or default_run_dir(), ["compare", *sys.argv[1:]], n_boot, _console_watcher())
    if outcome.results is not None:
        _print_report(outcome.results, outcome.run_dir.path, outcome.shown)
    return outcome.code


def _console_watcher() -> Watcher:
    """The run's messages, progress bars and spinners on this module's console."""
    return console_watcher(console)


def _report(run_dir: RunDir, n_boot: int, seed: int = 0) -> None:
    from compare.runner import write_report

    with _console_watcher().wait("analysing the run and writing its reports"):
        results = write_report(run_dir, n_boot, seed)
    _print_report(results, run_dir.path)


def _print_report(results: Results, path: Path, shown: Collection[str] = ()) -> None:
    print_summary(results, shown)
    console.print(f"reports: {path / 'report.md'}, {path / 'report.html'}, {path / 'summary.csv'}")


def _ms(value: float | None) -> str:
    return "–" if value is None or not np.isfinite(value) else f"{value:,.1f}"


def print_summary(results: Results, shown: Collection[str] = ()) -> None:
    """The summary tables, the picks and the warnings (but not those in `shown`, printed already)."""
    terminal.print_summary(console, results, shown)


# -- compare report / diff / import ------------------------------------------------------------------------


@app.command()
def report(
    run_dir: Annotated[Path, typer.Argument(help="a run directory written by `compare run`")],
    n_boot: int = typer.Option(1000, help="bootstrap resamples"),
) -> None:
    """Rebuild summary.csv, summary.parquet, report.md and report.html from a run directory."""
    from compare.measure.run_dir import RunDir

    try:
        run = RunDir.open(run_dir)
    except FileNotFoundError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(EXIT_USAGE) from None
    _report(run, n_boot, (run.manifest.get("config") or {}).get("seed", 0))


@app.command()
def diff(
    run_a: Annotated[Path, typer.Argument(help="baseline run directory")],
    run_b: Annotated[Path, typer.Argument(help="run directory to compare with it")],
    alpha: float = typer.Option(0.05, help="significance level (Holm-corrected over all comparisons)"),
    out: Annotated[Path | None, typer.Option(help="also write the comparison as Markdown here")] = None,
) -> None:
    """Compare two runs point by point: change in each latency median, its interval, and whether it is
    significant (Mann-Whitney U, Holm-corrected), plus the change in throughput."""
    from compare.analysis.diff import diff_runs
    from compare.measure.run_dir import RunDir
    from compare.report.diff_markdown import to_markdown

    try:
        a, b = RunDir.open(run_a), RunDir.open(run_b)
        table = diff_runs(a, b, alpha)
    except (FileNotFoundError, ValueError) as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(EXIT_USAGE) from None
    show = Table(
        "point (A -> B)",
        "metric",
        "A p50",
        "B p50",
        "change",
        "95% CI of B/A",
        "p (Holm)",
        "verdict",
        title=f"{run_a} -> {run_b}",
    )
    for _, r in table.iterrows():
        show.add_row(
            r["point"],
            r["metric"],
            _ms(r["a"]),
            _ms(r["b"]),
            _pct(r["change"]),
            f"{r['ratio_lo']:.3f}-{r['ratio_hi']:.3f}" if np.isfinite(r["ratio_lo"]) else "–",
            f"{r['p_holm']:.3g}" if np.isfinite(r["p_holm"]) else "–",
            r["verdict"],
        )
    console.print(show)
    if out is not None:
        out.write_text(to_markdown(table, str(run_a), str(run_b)), encoding="utf-8")
        console.print(f"written: {out}")


def _pct(value: float | None) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{value:+.1%}"


@app.command("import")
def import_(
    files: Annotated[
        list[Path], typer.Argument(help="vllm bench serve result JSON or AIPerf profile_export.jsonl")
    ],
    fmt: str = typer.Option("auto", "--format", help="auto | vllm-bench | aiperf"),
    into: Annotated[Path | None, typer.Option(help="an existing run directory to add the results to")] = None,
    out: Annotated[Path | None, typer.Option(help="a new run directory for the results")] = None,
    backend: str | None = typer.Option(None, help=escape("backend label [default: vllm-bench / aiperf]")),
    variant: str | None = typer.Option(None, help="variant label"),
    workload: str = typer.Option("", help="workload label (match ours to sit in the same tables)"),
    load_point: str | None = typer.Option(None, help="load point label, e.g. c=8"),
) -> None:
    """Read other tools' per-request results into a run directory's tables, beside ours."""
    from compare.measure.importers import ImportFormatError, import_file
    from compare.measure.run_dir import IMPORTED, RunDir
    from workloads.records import RecordWriter

    if (into is None) == (out is None):
        console.print("[red]error:[/red] give exactly one of --into RUN_DIR and --out NEW_DIR")
        raise typer.Exit(EXIT_USAGE)
    try:
        if out is not None:
            run = RunDir.create(out, {}, ["compare", *sys.argv[1:]])
            run.manifest["status"] = "imported"
        else:
            assert into is not None  # exactly one of them (said above)
            run = RunDir.open(into)
        for file in files:
            imported = import_file(
                file, fmt, backend=backend, variant=variant, workload=workload, load_point=load_point
            )
            target = run.path / IMPORTED / f"{file.stem}.jsonl"
            if target.exists():
                target.unlink()
            with RecordWriter(target) as writer:
                for record in imported.records:
                    writer.append(record)
            entries = [e for e in run.manifest.get("imported", []) if e["run_id"] != imported.run_id]
            run.manifest["imported"] = [*entries, imported.manifest_entry()]
            run.save()
            console.print(
                f"{file}: {plural(len(imported.records), 'request')} from {imported.source} as "
                f"{imported.backend}{':' + imported.variant if imported.variant else ''} "
                f"{imported.load_point}"
            )
    except (FileNotFoundError, FileExistsError, ImportFormatError, ValueError) as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(EXIT_USAGE) from None
    _report(run, 1000)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
