"""The measuring loop of `compare run` without servers: launch order, CPU pinning, and a point's progress."""

from __future__ import annotations

import io
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from rich.console import Console
from test_compare_report import requests_for

import compare.cli as cli
from compare.analysis.metrics import summarize
from compare.measure import loop
from compare.measure.order import launch_order
from compare.measure.point import Point
from compare.measure.run_dir import RunDir


def test_launch_order_alternates():
    assert [(r, b) for r, b in launch_order(["A", "B", "C"], 3)] == [
        (0, "A"),
        (0, "B"),
        (0, "C"),
        (1, "C"),
        (1, "B"),
        (1, "A"),
        (2, "A"),
        (2, "B"),
        (2, "C"),
    ]


def test_progress_bar_rate_is_the_summary_rate(tmp_path, monkeypatch):
    """The bar's tok/s is the summary's output tokens/s (finished requests' tokens over the measured
    window), not a count over a fixed recent window: fed the finished point, it shows the same number."""
    records = requests_for("b", "", "p", "c=4", 40, 0.05, np.random.default_rng(0), concurrency=4)
    expected = summarize(records, n_boot=0).iloc[0]["output_tok_s"]
    last_end = max(r.end_s for r in records)

    def fake_load(job):
        t0 = time.perf_counter() - last_end  # the point's last request has just finished
        done = [r.model_copy(update={"t0_monotonic": t0}) for r in records]
        job.progress(done)
        Path(job.summary_path).touch()
        return done

    out = io.StringIO()
    monkeypatch.setattr(cli, "console", Console(file=out, width=200, force_terminal=False))
    run = RunDir.create(tmp_path / "run", {"model": "m"}, ["compare", "run"])
    plan = SimpleNamespace(
        warmup_count=lambda s: 0,
        num_requests=40,
        repeats=1,
        request_timeout=10,
        duration=None,
        busy_poll=False,
        prompt_pool=None,
    )
    schedule = SimpleNamespace(label="c=4", describe=lambda: {"kind": "closed", "concurrency": 4})
    backend = SimpleNamespace(name="b", variant="", key="b")
    workload = SimpleNamespace(label="wl", sessions=False)
    point = Point(plan, backend, None, "http://x", workload, schedule)
    point.run(run, [], [], fake_load, None, cli._console_watcher())
    shown = float(out.getvalue().split(" tok/s")[0].split()[-1].replace(",", ""))
    assert shown == pytest.approx(expected, rel=0.01), out.getvalue()


def test_cli_messages_count_one_cpu_in_the_singular(monkeypatch):
    monkeypatch.setattr(loop.os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert loop.pinning(SimpleNamespace(pin="off"))[2] == "off (asked); 1 CPU shared by client and servers"
    assert loop.pinning(SimpleNamespace(pin="auto"))[2].startswith("none: only 1 CPU, too few")
