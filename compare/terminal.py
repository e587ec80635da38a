"""What `compare` shows on the terminal, readable at 80 columns: the progress of each load point (its warm-up
named), a spinner with the state and the time elapsed for every longer wait, and the summary tables, whose
cells are wrapped between words or split into two tables, never cut short.

    watcher = console_watcher(Console())           # for run_plan / measure
    print_summary(Console(), results)               # the end of a run
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Collection, Iterator
from typing import TYPE_CHECKING

import numpy as np
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Column, Table

from compare.measure.watcher import ShowProgress, ShowStatus, Watcher

if TYPE_CHECKING:
    import pandas as pd

    from compare.analysis.results import Results


def console_watcher(console: Console) -> Watcher:
    """Messages printed on `console`; each load point a progress bar (requests done, output tok/s, errors;
    the warm-up named while it runs); each longer wait a spinner with its state and the time elapsed."""

    @contextlib.contextmanager
    def point(title: str, total: int | None) -> Iterator[ShowProgress]:
        columns = [
            TextColumn("{task.description}", table_column=Column(overflow="fold", ratio=3)),
            BarColumn(bar_width=None, table_column=Column(ratio=1)),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]} tok/s  errors {task.fields[errors]}"),
            TimeElapsedColumn(),
        ]
        with Progress(*columns, console=console, transient=False, expand=True) as progress:
            task = progress.add_task(title, total=total, rate="–", errors=0)

            def show(done: int, rate: float, errors: int, phase: str = "") -> None:
                shown = f"{rate:,.1f}" if np.isfinite(rate) else "–"
                description = f"{title} ({phase})" if phase else title
                progress.update(task, description=description, completed=done, rate=shown, errors=errors)

            yield show

    @contextlib.contextmanager
    def wait(title: str) -> Iterator[ShowStatus]:
        """A spinner with `title`, what the wait is at now and the time elapsed, gone when the wait ends."""
        columns = [
            SpinnerColumn(),
            TextColumn("{task.description}", table_column=Column(overflow="fold")),
            TimeElapsedColumn(),
        ]
        with Progress(*columns, console=console, transient=True) as progress:
            task = progress.add_task(title, total=None)
            yield lambda state: progress.update(task, description=f"{title}: {escape(state)}")

    return Watcher(say=lambda message: console.print(message), point=point, wait=wait)


#: the summary's measured columns: (header, summary.csv column), headers in two lines to stay narrow
LATENCY_COLUMNS = [
    ("TTFT\np50", "ttft_p50_ms"),
    ("TTFT\np99", "ttft_p99_ms"),
    ("TPOT\np50", "tpot_p50_ms"),
    ("TPOT\np99", "tpot_p99_ms"),
    ("E2E\np50", "e2e_p50_ms"),
]
RATE_COLUMNS = [("out\ntok/s", "output_tok_s"), ("goodput\nreq/s", "goodput_rps")]


def _short(value: float | None) -> str:
    """A number in the fewest characters that keep three significant digits (summary.csv has them all)."""
    if value is None or not np.isfinite(value):
        return "–"
    size = abs(value)
    return f"{value:,.0f}" if size >= 100 else f"{value:.1f}" if size >= 10 else f"{value:.2f}"


def summary_tables(summary: pd.DataFrame, width: int) -> list[Table]:
    """The summary as tables that fit `width` columns without cutting a cell: one per workload (named in its
    title), a row per backend and load point, labelled `backend:variant load` (wrapped at the space when
    narrow); where latencies and rates do not fit side by side, a latency table and a rate table. Columns
    with no value in a workload (goodput without --slo) are left out."""
    tables: list[Table] = []
    for workload, rows in summary.groupby("workload", sort=False):
        name = str(workload or "summary")  # a workload's label ("" for a run without one)
        shown = [(h, c) for h, c in LATENCY_COLUMNS + RATE_COLUMNS if c in rows and rows[c].notna().any()]
        latency = [m for m in shown if m in LATENCY_COLUMNS]
        rates = [m for m in shown if m in RATE_COLUMNS]
        whole = _summary_table(f"{name} (ms; n = ok requests)", rows, shown)
        if _min_width(whole) <= width or not (latency and rates):
            tables.append(whole)
        else:
            tables.append(_summary_table(f"{name}: latency (ms; n = ok requests)", rows, latency))
            tables.append(_summary_table(f"{name}: rates", rows, rates))
    return tables


def _summary_table(title: str, rows: pd.DataFrame, measured: list[tuple[str, str]]) -> Table:
    keys = [f"{r.backend!s}:{r.variant!s}" if r.variant else str(r.backend) for r in rows.itertuples()]
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    # the label wraps at the space between backend and load point; a backend's name folds only past 24
    table.add_column("backend load", overflow="fold", min_width=min(24, max(map(len, keys))))
    table.add_column("ok/fail\n/canc", justify="right", no_wrap=True)
    for header, _ in measured:
        table.add_column(header, justify="right", no_wrap=True)
    for key, (_, r) in zip(keys, rows.iterrows(), strict=True):
        counts = f"{int(r['requests_ok'])}/{int(r['requests_failed'])}/{int(r['requests_cancelled'])}"
        table.add_row(f"{key} {r['load_point']}", counts, *(_short(r[column]) for _, column in measured))
    return table


def _min_width(table: Table) -> int:
    """The fewest columns `table` needs without cutting a cell."""
    wide = Console(width=10_000, file=io.StringIO())
    return Measurement.get(wide, wide.options, table).minimum


def _print_warnings(console: Console, warnings: list[str]) -> None:
    """Each warning after "warning:", the lines of a kind (`report.WARNING_ITEM`) indented under it."""
    from compare.analysis.warning_groups import WARNING_ITEM

    for w in warnings:
        if w.startswith(WARNING_ITEM):
            console.print(escape(w), highlight=False)
        else:
            console.print(f"[yellow]warning:[/yellow] {escape(w)}", highlight=False)


def print_summary(console: Console, results: Results, shown: Collection[str] = ()) -> None:
    """On `console`: the summary tables, the picks and the warnings (not those in `shown`, said already)."""
    warnings = [w for w in results.warnings if w not in shown]
    s = results.summary
    if s.empty:
        console.print("no measured requests")
        _print_warnings(console, warnings)
        return
    for table in summary_tables(s, console.width):
        console.print(table)
    for pick in results.picks:
        for sentence in pick.sentences:
            console.print(sentence.replace("**", ""), highlight=False)
    _print_warnings(console, warnings)
