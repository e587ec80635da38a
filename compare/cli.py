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

import contextlib
import logging
import math
import sys
import time
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Annotated, Any

import click
import numpy as np
import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from typer.core import TyperCommand

from compare.exit_codes import EXIT_USAGE
from compare.measure import ShowProgress, Watcher
from compare.text import plural

APP_HELP = (
    "Compare LLM serving backends under one load generator: run a comparison and write its reports, "
    "rebuild the reports of a run, diff two runs, import other tools' results, or try the reference engine "
    "(demo). `compare COMMAND --help` says more; `compare run --help` lists the run's options by topic."
)
app = typer.Typer(add_completion=False, no_args_is_help=False, help=APP_HELP, rich_markup_mode="rich")
console = Console(width=None if sys.stdout.isatty() else 160)

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
    prompts = []
    for text in DEMO_PROMPTS:
        if getattr(tok, "chat_template", None):
            prompts.append(
                tok.apply_chat_template(
                    [{"role": "user", "content": text}],
                    add_generation_prompt=True,
                    tokenize=True,
                    return_dict=False,
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
            tok.decode(out.token_ids, skip_special_tokens=True),
            str(len(out.token_ids)),
            out.finish_reason or "",
        )
    console.print(table)
    n = sum(len(o.token_ids) for o in outs)
    console.print(
        f"{plural(n, 'token')} in {elapsed:.2f} s ({n / elapsed:.1f} tok/s) on {engine.device}; "
        f"set-up {engine.setup.phases['total']:.2f} s"
    )


# -- compare run --------------------------------------------------------------------------------------------


WORKLOAD, LOAD, BACKENDS = "Workload", "Load", "Backends and servers"
SLO_COST, OUTPUT, SCALE_OUT = "SLO and cost", "Output and statistics", "Scale-out (Ray)"


def _opt(*names: str, help: str, panel: str, metavar: str | None = None, **kwargs: Any) -> Any:
    """An option of `run`, in its help panel; the help is escaped, so `[default: ...]` reads as written."""
    return typer.Option(*names, help=escape(help), rich_help_panel=panel, metavar=metavar, **kwargs)


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

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, ray_value(args))


LOCAL_RAY = "local"


@app.command(cls=RunCommand)
def run(
    backends: Annotated[
        str | None,
        _opt(
            help="adapter names, each optionally :variant (vllm,tgi,reference:eager) [default: reference]",
            panel=BACKENDS,
            metavar="NAME[:VARIANT][,...]",
        ),
    ] = None,
    endpoint: Annotated[
        list[str] | None,
        _opt(
            help="a running server (repeat); backends without one are launched (--launch)",
            panel=BACKENDS,
            metavar="NAME=URL",
        ),
    ] = None,
    launch: Annotated[
        str | None,
        _opt(
            help="how backends without an endpoint are started [default: process]",
            panel=BACKENDS,
            metavar="process|docker",
        ),
    ] = None,
    vllm_bin: Annotated[
        str | None,
        _opt(
            help="the vllm executable for --launch process [default: $LLM_COMPARE_VLLM, else vllm]",
            panel=BACKENDS,
            metavar="PATH",
        ),
    ] = None,
    image: Annotated[
        list[str] | None,
        _opt(
            help="the container image of a backend or server family, for --launch docker (repeat)",
            panel=BACKENDS,
            metavar="NAME=IMAGE",
        ),
    ] = None,
    dtype: Annotated[
        str | None,
        _opt(help="weights dtype for launched servers [default: auto]", panel=BACKENDS, metavar="DTYPE"),
    ] = None,
    max_model_len: Annotated[
        int | None, _opt(help="context length for launched servers", panel=BACKENDS, metavar="N")
    ] = None,
    model: Annotated[
        str | None,
        _opt(
            help="checkpoint dir, hub id or built-in name [default: smollm2-135m]",
            panel=BACKENDS,
            metavar="MODEL",
        ),
    ] = None,
    tokenizer: Annotated[
        str | None,
        _opt(
            help="tokenizer for token-exact prompts: a directory or hub id [default: the model's]",
            panel=WORKLOAD,
            metavar="TOKENIZER",
        ),
    ] = None,
    served_model: Annotated[
        str | None,
        _opt(help="model name sent in requests [default: --model]", panel=BACKENDS, metavar="NAME"),
    ] = None,
    server_args: Annotated[
        str | None,
        _opt(help="extra arguments for launched servers, one string", panel=BACKENDS, metavar="ARGS"),
    ] = None,
    startup_timeout: Annotated[
        float | None,
        _opt(
            help="seconds a launched server may take to be ready [default: 600]", panel=BACKENDS, metavar="S"
        ),
    ] = None,
    repeats: Annotated[
        int | None,
        _opt(
            help="launch every backend this many times, in alternating order, and check that a winner wins "
            "in each [default: 1]",
            panel=BACKENDS,
            metavar="N",
        ),
    ] = None,
    dataset: Annotated[
        str | None,
        _opt(
            help="random (random token-exact prompts), fixed (a few fixed questions), sharegpt, jsonl (a file: "
            "--dataset-path) or prefix (groups of prompts sharing a prefix: --prefix-len, --prefix-groups) "
            "[default: random]",
            panel=WORKLOAD,
            metavar="NAME",
        ),
    ] = None,
    dataset_path: Annotated[
        str | None, _opt(help="the file of --dataset sharegpt or jsonl", panel=WORKLOAD, metavar="FILE")
    ] = None,
    input_len: Annotated[
        str | None,
        _opt(
            help="prompt tokens (random) or tokens after the shared prefix (prefix): N, uniform:LO:HI, "
            "normal:MEAN:STD or lognormal:MEDIAN:SIGMA [default: 128]",
            panel=WORKLOAD,
            metavar="LEN",
        ),
    ] = None,
    output_len: Annotated[
        str | None,
        _opt(
            help="output tokens (random, prefix; jsonl: N for lines without their own), same forms "
            "[default: 32]",
            panel=WORKLOAD,
            metavar="LEN",
        ),
    ] = None,
    prefix_len: Annotated[
        int | None,
        _opt(help="prefix: tokens the requests of a group share [default: 256]", panel=WORKLOAD, metavar="N"),
    ] = None,
    prefix_groups: Annotated[
        int | None,
        _opt(help="prefix: groups, each with a prefix of its own [default: 4]", panel=WORKLOAD, metavar="N"),
    ] = None,
    seed: Annotated[
        int | None, _opt(help="dataset and arrival seed [default: 0]", panel=WORKLOAD, metavar="N")
    ] = None,
    concurrency: Annotated[
        str | None,
        _opt(
            help="closed-loop load points: requests kept in flight, e.g. 1,8,32 [default: 1,4, unless --rate "
            "or --trace is given]",
            panel=LOAD,
            metavar="N[,N...]",
        ),
    ] = None,
    rate: Annotated[
        str | None,
        _opt(
            help="open-loop load points in requests/s, e.g. 2,8; inf sends every request at once (a burst, "
            "capped by --max-concurrency)",
            panel=LOAD,
            metavar="R[,R...]",
        ),
    ] = None,
    arrival: Annotated[
        str | None,
        _opt(
            help="open loop: gaps between sends [default: poisson]",
            panel=LOAD,
            metavar="poisson|gamma|constant",
        ),
    ] = None,
    burstiness: Annotated[
        float | None,
        _opt(help="gamma arrival shape, < 1 burstier [default: 1]", panel=LOAD, metavar="K"),
    ] = None,
    max_concurrency: Annotated[
        int | None, _opt(help="open loop and trace: cap on requests in flight", panel=LOAD, metavar="N")
    ] = None,
    trace: Annotated[
        str | None,
        _opt(
            help="one more load point, replaying a trace: one send time per line, in seconds (or JSON lines "
            'with a "timestamp"), made relative to the first',
            panel=LOAD,
            metavar="FILE",
        ),
    ] = None,
    trace_scale: Annotated[
        float | None,
        _opt(
            help="multiply the trace's gaps by X (0.5: twice as fast) [default: 1]", panel=LOAD, metavar="X"
        ),
    ] = None,
    num_requests: Annotated[
        int | None,
        _opt(
            help="measured requests per load point; 0: bound by --duration only [default: 16]",
            panel=LOAD,
            metavar="N",
        ),
    ] = None,
    duration: Annotated[
        str | None,
        _opt(help="bound per load point, e.g. 60s; 0: none [default: 30s]", panel=LOAD, metavar="TIME"),
    ] = None,
    warmup: Annotated[
        int | None,
        _opt(help="warm-up requests per load point [default: one per stream]", panel=LOAD, metavar="N"),
    ] = None,
    request_timeout: Annotated[
        float | None, _opt(help="seconds one request may take [default: 600]", panel=LOAD, metavar="S")
    ] = None,
    busy_poll: Annotated[
        bool | None,
        _opt(
            "--busy-poll",
            metavar="",
            help="keep the load generator's CPU polling instead of sleeping between events: no CPU wake-up can "
            "then merge two events into one read (exact at low concurrency on VMs); costs one CPU for the run",
            panel=LOAD,
        ),
    ] = None,
    pin: Annotated[
        str | None,
        _opt(
            help="auto: client and launched servers on CPUs of their own when there are >= 4 [default: auto]",
            panel=LOAD,
            metavar="auto|off",
        ),
    ] = None,
    slo: Annotated[
        str | None,
        _opt(
            help="latency objectives for goodput, e.g. ttft=200ms,tpot=50ms,e2e=2s (a bare number is ms)",
            panel=SLO_COST,
            metavar="METRIC=TIME[,...]",
        ),
    ] = None,
    gpu_price: Annotated[
        float | None,
        _opt(help="price per GPU-hour, for the cost per 1M output tokens", panel=SLO_COST, metavar="PRICE"),
    ] = None,
    mem_bandwidth: Annotated[
        float | None,
        _opt(help="memory bandwidth in GB/s, for the roofline", panel=SLO_COST, metavar="GB/S"),
    ] = None,
    model_bytes: Annotated[
        float | None,
        _opt(help="bytes of weights a decode step reads, for the roofline", panel=SLO_COST, metavar="BYTES"),
    ] = None,
    config: Annotated[
        Path | None,
        _opt(
            "--config",
            "-c",
            help="YAML run file: the same keys as the options, plus matrices of backends, variants, load "
            "points and workloads; options given here win over it",
            panel=OUTPUT,
            metavar="FILE",
        ),
    ] = None,
    out: Annotated[
        Path | None,
        _opt(help="run directory, new or empty [default: runs/<timestamp>]", panel=OUTPUT, metavar="DIR"),
    ] = None,
    n_boot: Annotated[
        int, _opt(help="bootstrap resamples for the intervals", panel=OUTPUT, metavar="N", min=1)
    ] = 1000,
    ray: Annotated[
        str | None,
        _opt(
            "--ray",
            help="run on Ray: --ray alone starts a local instance; --ray ADDRESS joins a cluster (HOST:PORT, "
            "auto, ray://HOST:PORT)",
            panel=SCALE_OUT,
            metavar="[ADDRESS]",
        ),
    ] = None,
    ray_actors: Annotated[
        int | None,
        _opt(
            help="with --ray: load generators per load point [default: one per node; local: 2]",
            panel=SCALE_OUT,
            metavar="N",
        ),
    ] = None,
    ray_actor_cpus: Annotated[
        float | None,
        _opt(
            help="with --ray: CPUs each load generator reserves [default: 1]", panel=SCALE_OUT, metavar="CPUS"
        ),
    ] = None,
    ray_cells: Annotated[
        bool | None,
        _opt(
            "--ray-cells",
            metavar="",
            help="with --ray: each backend x variant x load point is a Ray task that launches, warms up, loads "
            "and stops its server on the node it is given",
            panel=SCALE_OUT,
        ),
    ] = None,
    ray_cell_resources: Annotated[
        str | None,
        _opt(
            help="with --ray-cells: resources per cell [default: GPU=1 on a cluster with GPUs, else CPU=1]",
            panel=SCALE_OUT,
            metavar="NAME=AMOUNT[,...]",
        ),
    ] = None,
) -> None:
    """Measure backends under load and write the run directory with its reports.

    Exit codes: 0 every load point ran; 1 a backend could not be started or reached, or no request
    succeeded; 2 the options are wrong (checked before any work starts); 130 interrupted by Ctrl-C or
    SIGTERM (in-flight requests are recorded as cancelled, launched servers stopped, a partial report
    written).
    """
    from compare.plan import PlanError, build_plan

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    options = dict(
        backends=backends,
        endpoints=endpoint,
        model=model,
        tokenizer=tokenizer,
        served_model=served_model,
        dataset=dataset,
        dataset_path=dataset_path,
        input_len=input_len,
        output_len=output_len,
        prefix_len=prefix_len,
        prefix_groups=prefix_groups,
        concurrency=concurrency,
        rate=rate,
        arrival=arrival,
        burstiness=burstiness,
        max_concurrency=max_concurrency,
        trace=trace,
        trace_scale=trace_scale,
        num_requests=num_requests,
        duration=duration,
        warmup=warmup,
        slo=slo,
        seed=seed,
        gpu_price=gpu_price,
        mem_bandwidth_gbs=mem_bandwidth,
        model_bytes=model_bytes,
        server_args=server_args,
        startup_timeout=startup_timeout,
        request_timeout=request_timeout,
        busy_poll=busy_poll,
        pin=pin,
        repeats=repeats,
        launch=launch,
        vllm_bin=vllm_bin,
        images=image,
        dtype=dtype,
        max_model_len=max_model_len,
        ray=ray,
        ray_actors=ray_actors,
        ray_actor_cpus=ray_actor_cpus,
        ray_cells=ray_cells,
        ray_cell_resources=ray_cell_resources,
    )
    try:
        plan = build_plan(options, config)
    except PlanError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(EXIT_USAGE) from None
    try:
        code = execute(plan, out, n_boot)
    except FileExistsError as exc:
        console.print(f"[red]error:[/red] {exc}")
        code = EXIT_USAGE
    raise typer.Exit(code)


def execute(plan: Any, out: Path | None, n_boot: int = 1000) -> int:
    """Run `plan` with progress bars and messages on the console, then print its summary; the exit code."""
    from compare.runner import run_plan
    from compare.store import default_run_dir

    outcome = run_plan(plan, out or default_run_dir(), ["compare", *sys.argv[1:]], n_boot, _console_watcher())
    if outcome.results is not None:
        _print_report(outcome.results, outcome.run_dir.path, outcome.shown)
    return outcome.code


def _console_watcher() -> Watcher:
    """Messages printed, and each load point a progress bar: requests done, output tok/s, errors."""

    @contextlib.contextmanager
    def point(title: str, total: int | None) -> Iterator[ShowProgress]:
        columns = [
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]} tok/s  errors {task.fields[errors]}"),
            TimeElapsedColumn(),
        ]
        with Progress(*columns, console=console, transient=False) as progress:
            task = progress.add_task(title, total=total, rate="–", errors=0)

            def show(done: int, rate: float, errors: int) -> None:
                shown = f"{rate:,.1f}" if np.isfinite(rate) else "–"
                progress.update(task, completed=done, rate=shown, errors=errors)

            yield show

    return Watcher(say=lambda message: console.print(message), point=point)


def _report(run_dir: Any, n_boot: int, seed: int = 0) -> None:
    from compare.runner import write_report

    _print_report(write_report(run_dir, n_boot, seed), run_dir.path)


def _print_report(results: Any, path: Path, shown: Collection[str] = ()) -> None:
    print_summary(results, shown)
    console.print(f"reports: {path / 'report.md'}, {path / 'report.html'}, {path / 'summary.csv'}")


def _ms(value: Any) -> str:
    return "–" if value is None or not np.isfinite(value) else f"{value:,.1f}"


def print_summary(results: Any, shown: Collection[str] = ()) -> None:
    """The summary table, the picks and the warnings (but not those in `shown`, printed already)."""
    warnings = [w for w in results.warnings if w not in shown]
    s = results.summary
    if s.empty:
        console.print("no measured requests")
        for w in warnings:
            console.print(f"[yellow]warning:[/yellow] {w}", highlight=False)
        return
    table = Table(
        "backend",
        "workload",
        "load",
        "ok/fail/canc",
        "TTFT p50",
        "TTFT p99",
        "TPOT p50",
        "TPOT p99",
        "E2E p50",
        "out tok/s",
        "goodput/s",
        title="summary (ms; n = ok requests)",
    )
    for _, r in s.iterrows():
        key = f"{r['backend']}:{r['variant']}" if r["variant"] else r["backend"]
        table.add_row(
            key,
            r["workload"],
            r["load_point"],
            f"{int(r['requests_ok'])}/{int(r['requests_failed'])}/{int(r['requests_cancelled'])}",
            _ms(r["ttft_p50_ms"]),
            _ms(r["ttft_p99_ms"]),
            _ms(r["tpot_p50_ms"]),
            _ms(r["tpot_p99_ms"]),
            _ms(r["e2e_p50_ms"]),
            _ms(r["output_tok_s"]),
            _ms(r["goodput_rps"]),
        )
    console.print(table)
    for pick in results.picks:
        for sentence in pick.sentences:
            console.print(sentence.replace("**", ""), highlight=False)
    for w in warnings:
        console.print(f"[yellow]warning:[/yellow] {w}", highlight=False)


# -- compare report / diff / import ------------------------------------------------------------------------


@app.command()
def report(
    run_dir: Annotated[Path, typer.Argument(help="a run directory written by `compare run`")],
    n_boot: int = typer.Option(1000, help="bootstrap resamples"),
) -> None:
    """Rebuild summary.csv, summary.parquet, report.md and report.html from a run directory."""
    from compare.store import RunDir

    try:
        run = RunDir.open(run_dir)
    except FileNotFoundError as exc:
        console.print(f"[red]error:[/red] {exc}")
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
    from compare.diff import diff_runs, to_markdown
    from compare.store import RunDir

    try:
        a, b = RunDir.open(run_a), RunDir.open(run_b)
        table = diff_runs(a, b, alpha)
    except (FileNotFoundError, ValueError) as exc:
        console.print(f"[red]error:[/red] {exc}")
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


def _pct(value: float) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{value:+.1%}"


@app.command("import")
def import_(
    files: Annotated[
        list[Path], typer.Argument(help="vllm bench serve result JSON or AIPerf profile_export.jsonl")
    ],
    fmt: str = typer.Option("auto", "--format", help="auto | vllm-bench | aiperf"),
    into: Annotated[Path | None, typer.Option(help="an existing run directory to add the results to")] = None,
    out: Annotated[Path | None, typer.Option(help="a new run directory for the results")] = None,
    backend: str | None = typer.Option(None, help="backend label [default: vllm-bench / aiperf]"),
    variant: str | None = typer.Option(None, help="variant label"),
    workload: str = typer.Option("", help="workload label (match ours to sit in the same tables)"),
    load_point: str | None = typer.Option(None, help="load point label, e.g. c=8"),
) -> None:
    """Read other tools' per-request results into a run directory's tables, beside ours."""
    from compare.importers import ImportFormatError, import_file
    from compare.store import IMPORTED, RunDir
    from workloads.records import RecordWriter

    if (into is None) == (out is None):
        console.print("[red]error:[/red] give exactly one of --into RUN_DIR and --out NEW_DIR")
        raise typer.Exit(EXIT_USAGE)
    try:
        run = RunDir.open(into) if into is not None else RunDir.create(out, {}, ["compare", *sys.argv[1:]])
        if out is not None:
            run.manifest["status"] = "imported"
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
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(EXIT_USAGE) from None
    _report(run, 1000)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
