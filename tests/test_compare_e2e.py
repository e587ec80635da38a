"""`compare run` end to end, as users run it (a subprocess of the CLI), against real servers on loopback:
our reference server launched on the tiny checkpoint, and two scripted servers in two protocols whose
schedules are known, so the selection report's ranking can be checked against the truth."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from compare_cli import ROOT, compare_cmd, compare_env, run_compare

from instruments.scripted_server import ScriptedSchedule, scripted_server
from workloads import timing
from workloads.records import read_records

ARTIFACTS = [
    "manifest.json",
    "requests.jsonl",
    "runs.jsonl",
    "summary.csv",
    "summary.parquet",
    "report.md",
    "report.html",
]


@pytest.mark.live
@pytest.mark.slow
def test_run_reference_on_tiny_checkpoint_and_recompute(llama_dir, tmp_path):
    out = tmp_path / "run"
    run_compare(
        "run",
        "--backends",
        "reference",
        "--model",
        str(llama_dir),
        "--concurrency",
        "1,3",
        "--num-requests",
        "9",
        "--input-len",
        "uniform:16:48",
        "--output-len",
        "12",
        "--slo",
        "ttft=2s,tpot=1s",
        "--n-boot",
        "200",
        "--server-args",
        "--max-model-len 256",
        "--out",
        str(out),
    )
    for name in ARTIFACTS:
        assert (out / name).is_file(), name
    assert list((out / "logs").glob("reference-*.log"))
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["versions"]["python"]
    assert manifest["machine"]["cpus"] >= 1 and manifest["pinning"]
    setup = manifest["setups"][0]
    assert setup["ready_s"] > 0 and {p["name"] for p in setup["phases"]} >= {"weights", "kv_cache"}
    assert setup["memory"]["weights"] > 0 and setup["exit_code"] == 0
    # the server's own counters over each point (its /metrics read before and after), warm-up included
    for entry in map(json.loads, (out / "runs.jsonl").read_text().splitlines()):
        counters, sent = entry["server_metrics"], entry["n_warmup"] + entry["n_measured"]
        # counted once the stream is written, a moment after the client read it: the last few may come late
        late = sent - counters["requests_finished_total"]
        assert 0 <= late <= int(entry["load_point"].removeprefix("c=")), counters
        assert counters["e2e_seconds_count"] == counters["requests_finished_total"], counters
        assert counters["preemptions_total"] == 0 and "prefix_cache_queries_total" in counters, counters

    # summary.csv agrees with a recomputation from requests.jsonl, done here independently
    summary = pd.read_csv(out / "summary.csv")
    assert len(summary) == 2 and set(summary["load_point"]) == {"c=1", "c=3"}
    assert pd.read_parquet(out / "summary.parquet").shape[0] == 2
    for load_point, row in summary.set_index("load_point").iterrows():
        records = [r for r in read_records(out / "requests.jsonl") if r.load_point == load_point]
        measured = [r for r in records if not r.warmup]
        ok = [r for r in measured if r.ok]
        assert row["requests"] == len(measured) == 9 and row["requests_ok"] == len(ok) == 9
        assert row["requests_failed"] == 0
        for name, fn in (("ttft", timing.ttft), ("tpot", timing.tpot), ("e2e", timing.e2e)):
            values = np.array([fn(r) for r in ok]) * 1e3
            for q in (50, 90, 99):
                assert row[f"{name}_p{q}_ms"] == pytest.approx(np.percentile(values, q), rel=1e-4)
            assert row[f"{name}_mean_ms"] == pytest.approx(values.mean(), rel=1e-4)
        gaps = np.concatenate([timing.itl(r) for r in ok]) * 1e3
        assert row["itl_n"] == gaps.size and row["itl_p50_ms"] == pytest.approx(np.median(gaps), rel=1e-4)
        # the throughput window: from the c-th first token (all c workers busy with measured requests) to the
        # last, each request's tokens counted by the share of its output span (first token to end) inside it
        sends = sorted(r.send_s for r in measured)
        begins = sorted(r.send_s + timing.ttft(r) for r in measured)
        start, end = begins[int(load_point[2:]) - 1], begins[-1]
        if end > start and sum(start <= r.end_s <= end for r in measured) >= 2:
            spans = [(r.send_s + timing.ttft(r), r.end_s) for r in ok]
            shares = [max(0.0, min(e, end) - max(b, start)) / (e - b) for b, e in spans]
        else:
            start, end, shares = sends[0], max(r.end_s for r in measured), [1.0] * len(ok)
        assert row["window"] == ("steady" if shares != [1.0] * len(ok) else "full")
        tokens = sum(r.output_tokens * w for r, w in zip(ok, shares, strict=True))
        assert row["output_tok_s"] == pytest.approx(tokens / (end - start), rel=1e-4)
        assert row["output_tokens"] == 9 * 12  # the reference adapter forces the output length
        assert row["goodput_n"] == sum(timing.ttft(r) <= 2 and timing.tpot(r) <= 1 for r in ok)
    # different prompts at each load point, the same for every backend: no prefix-cache help
    prompts = {}
    for r in read_records(out / "requests.jsonl"):
        prompts.setdefault(r.load_point, set()).add(r.request_id)
    assert not prompts["c=1"] & prompts["c=3"]
    report = (out / "report.md").read_text()
    assert "## Decision" in report and "reference:" in report and "n=9" in report
    html = (out / "report.html").read_text()
    assert html.count("<svg") >= 8 and "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")

    # `compare report` rebuilds the same numbers
    first = summary.copy()
    (out / "summary.csv").unlink()
    run_compare("report", str(out), "--n-boot", "200")
    pd.testing.assert_frame_equal(pd.read_csv(out / "summary.csv"), first)


@pytest.mark.timing
@pytest.mark.live
@pytest.mark.slow
def test_selection_ranks_scripted_servers_as_their_schedules_say(llama_dir, tmp_path):
    """vLLM-shaped OpenAI completions: TTFT 20 ms, 4 ms per token; TGI's own stream: TTFT 80 ms, 12 ms per
    token. Both protocols are read for real; the fast one must win both classes, at least indicated, and
    the measured latencies must match the schedules: never below them (the server is never early), and above
    them by at most what a busy machine adds (it writes and reads late), far less than the two servers
    differ."""
    fast = ScriptedSchedule(ttft_s=0.02, itl_s=0.004)
    slow = ScriptedSchedule(ttft_s=0.08, itl_s=0.012)
    out = tmp_path / "run"
    with (
        scripted_server(flavor="vllm", default_schedule=fast) as a,
        scripted_server(flavor="tgi", default_schedule=slow) as b,
    ):
        run_compare(
            "run",
            "--backends",
            "vllm,tgi",
            "--endpoint",
            f"vllm={a.url}",
            "--endpoint",
            f"tgi={b.url}",
            "--model",
            "scripted-model",
            "--tokenizer",
            str(llama_dir),
            "--concurrency",
            "1,4",
            "--rate",
            "25",
            "--num-requests",
            "16",
            "--input-len",
            "16",
            "--output-len",
            "20",
            "--slo",
            "ttft=70ms",
            "--n-boot",
            "300",
            "--out",
            str(out),
        )
    summary = pd.read_csv(out / "summary.csv").set_index(["backend", "load_point"])
    # the most a busy machine may add to a median TTFT here (seen: 18 ms); 20 + 40 ms stays below the slow 80
    late_ms = 40
    assert 20 - 2 <= summary.loc[("vllm", "c=1"), "ttft_p50_ms"] < 20 + late_ms
    assert 80 - 2 <= summary.loc[("tgi", "c=1"), "ttft_p50_ms"] < 80 + late_ms
    # TPOT spreads the lateness of two writes over 19 gaps: it stays close to the schedule
    assert summary.loc[("vllm", "c=1"), "tpot_p50_ms"] == pytest.approx(4, abs=2)
    assert summary.loc[("tgi", "c=1"), "tpot_p50_ms"] == pytest.approx(12, abs=3)
    assert summary.loc[("tgi", "c=4"), "output_tok_s"] < summary.loc[("vllm", "c=4"), "output_tok_s"]
    # the open-loop point: offered 25 requests/s, sent on time (never early; most sends close to their time
    # even on a busy machine, where the client may wake late), lag reported with its n
    open_loop = summary.loc[("vllm", "r=25")]
    assert open_loop["mode"] == "open" and open_loop["offered_rps"] == 25 and open_loop["lag_n"] == 16
    assert 10 < open_loop["achieved_rps"] < 60 and 0 <= open_loop["lag_p50_ms"] < 100
    # the SLO (TTFT <= 70 ms) is met by every one of the fast server's requests (TTFT 20 ms: 50 ms to spare
    # for a busy machine) and missed by every one of the slow one's (80 ms: the server is never early)
    assert (
        summary.loc[("vllm", "c=1"), "goodput_frac"] == 1.0 and summary.loc[("tgi", "c=1"), "goodput_n"] == 0
    )
    report = (out / "report.md").read_text()
    decision = report.split("## Decision", 1)[1].split("## Warnings", 1)[0]
    interactive = next(p for p in decision.split("\n\n") if "**Interactive**" in p)
    throughput = next(p for p in decision.split("\n\n") if "**Throughput / batch**" in p)
    assert "**vllm** has the most requests within the SLOs" in interactive
    assert "faster than tgi" in interactive
    # running endpoints measured once each: indicated at most, unless they were measured in alternating blocks
    assert re.search(r": (indicated|established) \(", interactive), interactive
    assert "**vllm** reaches" in throughput and "within the SLOs at c=4" in throughput
    assert "tgi has no request within the SLOs" in throughput
    assert "Set-up not measured: vllm and tgi were running endpoints" in decision
    # the synthetic token texts re-tokenise to other counts: flagged (one line of counts for every point, as
    # they change no number), never silently used
    warnings = report.split("## Warnings", 1)[1]
    assert "**token counts** (3 on vllm (c=1, c=4, r=25), 3 on tgi (c=1, c=4, r=25))" in warnings
    assert "re-tokenisation" in warnings


@pytest.mark.timing
@pytest.mark.live
@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupt_mid_load_leaves_a_partial_report_and_stops_the_server(llama_dir, tmp_path, sig):
    out = tmp_path / "run"
    proc = subprocess.Popen(
        compare_cmd(
            "run",
            "--backends",
            "reference",
            "--model",
            str(llama_dir),
            "--concurrency",
            "4",
            "--num-requests",
            "200",
            "--input-len",
            "16",
            "--output-len",
            "200",
            "--warmup",
            "0",
            "--n-boot",
            "100",
            "--out",
            str(out),
        ),
        env=compare_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            path = out / "requests.jsonl"
            if path.exists() and len(path.read_text().splitlines()) >= 2:
                break
            assert proc.poll() is None, proc.stdout.read()
            time.sleep(0.1)
        else:
            pytest.fail("no request finished within 120 s")
        proc.send_signal(sig)
        output, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, output[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "interrupted"
    pid = manifest["setups"][0]["pid"]
    assert (
        not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[-1][:3]
    )
    summary = pd.read_csv(out / "summary.csv")
    row = summary.iloc[0]
    assert row["requests_cancelled"] >= 1 and row["requests_ok"] >= 2 and bool(row["interrupted"])
    report = (out / "report.md").read_text()
    assert "**interrupted**" in report and "partial" in report and "cancelled" in report
    assert (out / "report.html").stat().st_size > 1000


@pytest.mark.live
@pytest.mark.slow
def test_two_launched_variants_on_cpu_get_setup_reports_and_an_honest_note(llama_dir, tmp_path):
    """reference:graphs against reference:eager on a CPU, each launched twice in alternating order: both run
    eager, and the report says so rather than crediting graphs; every launch's set-up is measured, and the
    winner is checked launch by launch."""
    out = tmp_path / "run"
    run_compare(
        "run",
        "--backends",
        "reference:graphs,reference:eager",
        "--model",
        str(llama_dir),
        "--concurrency",
        "2",
        "--num-requests",
        "10",
        "--input-len",
        "16",
        "--output-len",
        "16",
        "--repeats",
        "2",
        "--n-boot",
        "200",
        "--out",
        str(out),
    )
    manifest = json.loads((out / "manifest.json").read_text())
    launches = [(s["variant"], s["repeat"]) for s in manifest["setups"]]
    assert sorted(launches) == [("eager", 0), ("eager", 1), ("graphs", 0), ("graphs", 1)]
    assert all(s["ready_s"] > 0 and s["exit_code"] == 0 for s in manifest["setups"])
    eager = next(s for s in manifest["setups"] if s["variant"] == "eager")
    graphs = next(s for s in manifest["setups"] if s["variant"] == "graphs")
    assert "--enforce-eager" in eager["command"] and "--enforce-eager" not in graphs["command"]
    assert len(list((out / "logs").glob("*.log"))) == 4
    # the order alternates: graphs, eager, then eager, graphs
    order = [(p["repeat"], p["variant"]) for p in manifest["points"]]
    assert order == [(0, "graphs"), (0, "eager"), (1, "eager"), (1, "graphs")]
    summary = pd.read_csv(out / "summary.csv")
    assert list(summary["runs"]) == [2, 2] and list(summary["requests_ok"]) == [20, 20]
    report = (out / "report.md").read_text()
    assert (
        "every variant runs eager (reference:graphs included), so a difference between its variants is noise"
        in (report)
    )
    assert "## Set-up cost against latency" in report and "median of 2 launches" in report
    decision = report.split("## Decision", 1)[1].split("## Warnings", 1)[0]
    assert "reference:graphs" in decision and "reference:eager" in decision and "Mann-Whitney" in decision
    assert (
        "launch" in decision.split("**Throughput / batch**")[0]
    )  # the interactive pick is checked per launch
